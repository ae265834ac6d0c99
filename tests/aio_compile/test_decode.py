"""Backend "aio" on decode steps: single-row linears streamed as multiply-and-sum loops (on request), the
attention of one query row over the cache as stored, and a user's own transformers Llama generating through
`torch.compile(backend="aio")` with the same passes."""

import pytest
import torch
from torch import nn

from aio_examples import aio_compile


@pytest.fixture(autouse=True)
def _clean(monkeypatch):
    monkeypatch.delenv("AIO_STREAM_GEMV", raising=False)
    monkeypatch.delenv("AIO_DECODE_ATTENTION", raising=False)
    monkeypatch.delenv("AIO_MERGE_LINEAR", raising=False)
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


class Block(nn.Module):
    """q/k/v of one input (merged into one linear first), a projection with a bias, and a wide MLP."""

    def __init__(self, dim=64):
        super().__init__()
        self.q, self.k, self.v = (nn.Linear(dim, dim, bias=False) for _ in range(3))
        self.o = nn.Linear(dim, dim)
        self.up, self.down = nn.Linear(dim, 4 * dim, bias=False), nn.Linear(4 * dim, dim, bias=False)

    def forward(self, x):
        h = self.o(self.q(x) * self.k(x).sigmoid() + self.v(x))
        return self.down(torch.relu(self.up(h)))


def _compiled(model, x, name):
    """Compiled with the streaming GEMV pass, which is off by default (oneDNN's GEMV was faster here)."""
    aio_compile.register()
    compiled = torch.compile(model, backend="aio", options={"modelname": name, "stream_gemv": True}, dynamic=False)
    with torch.no_grad():
        return compiled(x), aio_compile.last_report(name)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_single_row_linears_stream_and_agree_with_the_gemm(dtype):
    torch.manual_seed(0)
    model = Block().to(dtype).eval()
    one, four = torch.randn(1, 1, 64, dtype=dtype), torch.randn(4, 64, dtype=dtype)
    with torch.no_grad():
        want_one, want_four = model(one), model(four)
    got_one, report = _compiled(model, one, "gemv-one")
    kind = str(dtype).split(".")[-1]
    # q/k/v merged into one linear, then every linear of the single row streamed: 1 + o + up + down
    assert report["merge_linear"]["linears_merged"] == 3
    assert report["stream_gemv"]["linears"] == {kind: 4}
    tol = 1e-4 if dtype == torch.float32 else 3e-2
    torch.testing.assert_close(got_one, want_one, rtol=tol, atol=tol)
    torch._dynamo.reset()
    got_four, report = _compiled(model, four, "gemv-four")
    assert report["stream_gemv"]["linears"] == {}          # four rows: the GEMMs stay
    torch.testing.assert_close(got_four, want_four, rtol=tol, atol=tol)


def _int8_block():
    """A bf16 Block with torchao's weight-only int8, one input row, and its eager output."""
    pytest.importorskip("torchao")
    from torchao.quantization import Int8WeightOnlyConfig, quantize_

    torch.manual_seed(0)
    model = Block().to(torch.bfloat16).eval()
    quantize_(model, Int8WeightOnlyConfig())
    x = torch.randn(1, 1, 64, dtype=torch.bfloat16)
    with torch.no_grad():
        return model, x, model(x)


def test_torchaos_weight_only_int8_streams_its_int8_rows():
    model, x, want = _int8_block()
    got, report = _compiled(model, x, "gemv-int8")
    assert report["merge_linear"]["linears_merged"] == 3          # q/k/v's int8 rows and scales, concatenated
    assert report["stream_gemv"]["linears"] == {"int8": 4}
    assert report["constants"] > 0
    cos = torch.nn.functional.cosine_similarity(got.float().flatten(), want.float().flatten(), dim=0)
    assert cos > 0.999, cos


def test_torchaos_int8_rows_merge_and_decode_with_int8_activations():
    """What `-p int8` gives a generation step on aio: torchao's weight-only int8 rows, merged, each single-row
    GEMV run by oneDNN with the row quantized to 8 bits per call."""
    model, x, want = _int8_block()
    with torch.no_grad():
        got = torch.compile(model, backend="aio", dynamic=False, options={
            "modelname": "w8a8", "quantize_int8_filter": "Linear", "int8_out_dtype": "BF16"})(x)
    report = aio_compile.last_report("w8a8")
    assert report["merge_linear"]["linears_merged"] == 3
    assert report["quantize_int8"]["quantized"] == {"Linear": 4} and report["quantize_int8"]["onednn_int8_linears"] == 4
    assert got.dtype == torch.bfloat16
    cos = torch.nn.functional.cosine_similarity(got.float().flatten(), want.float().flatten(), dim=0)
    assert cos > 0.99, cos
    assert not torch.equal(got, want)          # the activations were quantized too


@pytest.mark.parametrize("rows", [128, 48])
def test_torchaos_int4_rows_merge_where_their_packing_allows(rows):
    """int4 rows are packed in blocks of rows for the CPU kernel: parts whose rows fill whole blocks merge, and
    whatever merges or not, the results stay those of the parts."""
    pytest.importorskip("torchao")
    from torchao.prototype.quantization.int4 import PrototypeInt4WeightOnlyConfig
    from torchao.quantization import quantize_

    class Three(nn.Module):
        def __init__(self):
            super().__init__()
            self.q, self.k, self.v = (nn.Linear(128, rows, bias=False) for _ in range(3))

        def forward(self, x):
            return self.q(x) * self.k(x) + self.v(x)

    torch.manual_seed(0)
    model = Three().to(torch.bfloat16).eval()
    quantize_(model, PrototypeInt4WeightOnlyConfig(group_size=128))
    x = torch.randn(1, 1, 128, dtype=torch.bfloat16)
    with torch.no_grad():
        want = model(x)
        got = torch.compile(model, backend="aio", dynamic=False, options={"modelname": f"int4-{rows}"})(x)
    merged = aio_compile.last_report(f"int4-{rows}")["merge_linear"]["linears_merged"]
    if rows == 128:
        assert merged == 3
    torch.testing.assert_close(got, want, rtol=2e-2, atol=2e-2)


def _tiny_llama():
    from aio_examples.compat.torchvision_shim import ensure_torchvision

    ensure_torchvision()        # transformers imports torchvision, whose wheel here is a CUDA build
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=256, hidden_size=128, intermediate_size=256, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
                         tie_word_embeddings=True)
    model = LlamaForCausalLM(config).eval()
    # random weights give near-flat logits; larger ones make greedy tokens stable enough to compare
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() == 2:
                p.mul_(8.0)
    return model


def test_a_users_transformers_llama_generates_through_aio_with_its_passes():
    """What a user writes: their own LlamaForCausalLM in bf16, its forward through `torch.compile(backend="aio")`,
    generate() with a static cache (one graph for the prompt, one for every decode step). Checked
    teacher-forced: eager fp32 reads the tokens aio generated, and its logits at each step are compared with
    the ones aio produced."""
    aio_compile.register()
    reference = _tiny_llama()
    model = _tiny_llama().to(torch.bfloat16)
    model.forward = torch.compile(model.forward, backend="aio", dynamic=False, options={"modelname": "user-llama"})
    prompt = torch.randint(0, 256, (1, 12), generator=torch.Generator().manual_seed(1))
    new = 8
    with torch.no_grad():
        out = model.generate(prompt, max_new_tokens=new, min_new_tokens=new, do_sample=False,
                             cache_implementation="static", return_dict_in_generate=True, output_logits=True,
                             pad_token_id=0)
        tokens = out.sequences
        teacher = reference(tokens).logits[0, prompt.shape[1] - 1:-1]       # eager fp32 on aio's tokens
    got = torch.stack([step[0].float() for step in out.logits])
    cos = torch.nn.functional.cosine_similarity(got, teacher, dim=-1)
    assert cos.min() > 0.99, cos
    assert (got.argmax(-1) == teacher.argmax(-1)).float().mean() >= 0.75
    # both graphs merged q/k/v and gate/up
    report = aio_compile.last_report("user-llama")
    assert report["graphs"] == 2, report
    assert report["merge_linear"]["groups"] == 2 * 2 * 2, report
    # the decode step's attention reads the cache's 2 key/value heads as stored, 2 query heads each
    assert report["decode_attention"]["attention"] == {"grouped": 2}, report
