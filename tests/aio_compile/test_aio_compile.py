"""Backend "aio": torch.compile with the AIO_* graph passes, on tiny modules compiled for real."""

import json

import pytest
import torch
import torch.nn.functional as F
from conftest import run_cli
from torch import nn

from aio_examples import aio_compile
from aio_examples.core.errors import UsageError

_ENV = ("AIO_MERGE_LINEAR", "AIO_IMPLICIT_FP16_TRANSFORM_FILTER", "AIO_QUANTIZE_INT8_FILTER",
        "AIO_QUANTIZE_INT8_CONVERT_OUT_DTYPE")


@pytest.fixture(autouse=True)
def _clean(monkeypatch):
    for var in _ENV:
        monkeypatch.delenv(var, raising=False)
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


class Attention(nn.Module):
    """q/k/v projections of one input (v without bias), attention, output projection, MLP."""

    def __init__(self, dim=64, heads=4):
        super().__init__()
        self.heads = heads
        self.q, self.k, self.v = nn.Linear(dim, dim), nn.Linear(dim, dim), nn.Linear(dim, dim, bias=False)
        self.o = nn.Linear(dim, dim)
        self.up, self.down = nn.Linear(dim, 2 * dim), nn.Linear(2 * dim, dim)

    def forward(self, x):
        b, s, d = x.shape

        def heads(t):
            return t.view(b, s, self.heads, d // self.heads).transpose(1, 2)

        a = F.scaled_dot_product_attention(heads(self.q(x)), heads(self.k(x)), heads(self.v(x)))
        x = x + self.o(a.transpose(1, 2).reshape(b, s, d))
        return x + self.down(F.gelu(self.up(x)))


def _compile_and_run(module, *inputs, **options):
    """Outputs of the aio-compiled module, and the linear/matmul count of the graph inductor received."""
    counts = []

    def count(graph):       # inductor's hook for passes on the graph it is given
        counts.append(sum(1 for n in graph.nodes if n.op == "call_function"
                          and n.target in (F.linear, torch.matmul, torch.mm, torch.bmm)))

    with torch.no_grad(), torch._inductor.config.patch(pre_grad_custom_pass=count):
        out = torch.compile(module, backend="aio", options={"modelname": "t", **options})(*inputs)
    return out, sum(counts)


def _cosine(a, b):
    return F.cosine_similarity(a.flatten().double(), b.flatten().double(), dim=0).item()


@pytest.fixture(scope="module")
def layer():
    torch.manual_seed(0)
    return Attention().eval(), torch.randn(2, 16, 64)


def test_merge_linear_reduces_linears_and_keeps_outputs(layer, monkeypatch):
    module, x = layer
    with torch.no_grad():
        expected = module(x)
    monkeypatch.setenv("AIO_MERGE_LINEAR", "1")
    merged, n_merged = _compile_and_run(module, x)
    assert aio_compile.last_report("t")["merge_linear"] == {"groups": 1, "linears_merged": 3}
    torch._dynamo.reset()
    monkeypatch.setenv("AIO_MERGE_LINEAR", "0")
    separate, n_separate = _compile_and_run(module, x)
    assert "merge_linear" not in aio_compile.last_report("t")
    assert (n_merged, n_separate) == (4, 6)
    torch.testing.assert_close(merged, expected, rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(separate, expected, rtol=1e-4, atol=1e-5)


def test_implicit_fp16_converts_linears_only(layer, monkeypatch):
    module, x = layer
    monkeypatch.setenv("AIO_IMPLICIT_FP16_TRANSFORM_FILTER", "Linear")
    out, _ = _compile_and_run(module, x, merge_linear=False)
    report = aio_compile.last_report("t")["implicit_fp16"]
    assert report["converted"] == {"Linear": 6}
    assert report["dtype"] in ("float16", "bfloat16")
    with torch.no_grad():
        expected = module(x)
    assert out.dtype == torch.float32
    torch.testing.assert_close(out, expected, rtol=0.05, atol=0.05)
    assert not torch.equal(out, expected)       # it did run in reduced precision
    # Pinned by name, whatever this CPU prefers (what `-p fp16` asks for).
    for pinned, dtype in (("FP16", "float16"), ("bf16", "bfloat16")):
        torch._dynamo.reset()
        _compile_and_run(module, x, merge_linear=False, implicit_fp16_dtype=pinned)
        assert aio_compile.last_report("t")["implicit_fp16"]["dtype"] == dtype
    with pytest.raises(UsageError, match="implicit_fp16_dtype.*'fp8'.*accepted: AUTO, FP16, BF16"):
        aio_compile.resolve_options({"implicit_fp16_dtype": "fp8"})


def test_int8_quantizes_linears_and_embedding_bags(monkeypatch):
    torch.manual_seed(0)

    class Tagger(nn.Module):
        def __init__(self):
            super().__init__()
            self.bag = nn.EmbeddingBag(100, 64, mode="mean")
            self.layer = Attention()

        def forward(self, ids, offsets):
            return self.layer(self.bag(ids, offsets).view(2, 4, 64))

    module = Tagger().eval()
    ids, offsets = torch.randint(0, 100, (40,)), torch.arange(0, 40, 5)
    monkeypatch.setenv("AIO_QUANTIZE_INT8_FILTER", ".*")
    out, _ = _compile_and_run(module, ids, offsets)
    report = aio_compile.last_report("t")["quantize_int8"]
    # q/k/v merged into one, then 4 linears and the bag in int8; all linears reached oneDNN's int8 GEMM
    assert report["quantized"] == {"EmbeddingBag": 1, "Linear": 4}
    assert report["onednn_int8_linears"] == 4
    with torch.no_grad():
        expected = module(ids, offsets)
    assert _cosine(out, expected) > 0.99
    assert not torch.allclose(out, expected, atol=1e-5)


def test_int8_leaves_the_callers_input_as_it_was():
    """Inductor fuses `x + linear(x)` into the int8 GEMM as an in-place sum; x is the caller's tensor."""
    torch.manual_seed(0)
    linear = nn.Linear(64, 64).eval()
    x = torch.randn(1, 3, 64)
    before = x.clone()
    with torch.no_grad():
        want = x + linear(x)
        got = torch.compile(lambda t: t + linear(t), backend="aio", options={"quantize_int8_filter": "Linear"})(x)
    torch.testing.assert_close(x, before, rtol=0, atol=0)
    assert _cosine(got, want) > 0.999


def test_invalid_settings_name_the_variable(monkeypatch):
    for var, bad in [("AIO_MERGE_LINEAR", "yes"), ("AIO_IMPLICIT_FP16_TRANSFORM_FILTER", "Lin(ear"),
                     ("AIO_QUANTIZE_INT8_FILTER", "Conv2d"), ("AIO_QUANTIZE_INT8_CONVERT_OUT_DTYPE", "int4")]:
        monkeypatch.setenv(var, bad)
        with pytest.raises(UsageError) as err:
            aio_compile.resolve_options({"modelname": "t"})
        assert var in str(err.value) and repr(bad) in str(err.value) and "accepted" in str(err.value)
        monkeypatch.delenv(var)
    with pytest.raises(UsageError, match="merge_linear"):
        aio_compile.resolve_options({"merge_linear": "2"})
    with pytest.raises(UsageError, match="unknown"):
        aio_compile.resolve_options({"modelnmae": "t"})
    # options win over the environment
    monkeypatch.setenv("AIO_MERGE_LINEAR", "0")
    assert aio_compile.resolve_options({"merge_linear": 1}).merge_linear is True
    # at compile time dynamo wraps the error; the UsageError is its cause
    monkeypatch.setenv("AIO_QUANTIZE_INT8_FILTER", "Conv2d")
    with pytest.raises(Exception) as err:
        _compile_and_run(nn.Linear(4, 4).eval(), torch.randn(2, 4))
    assert isinstance(getattr(err.value, "inner_exception", None), UsageError)


def test_prepare_module_uses_channels_last_for_conv_nets():
    conv = nn.Sequential(nn.Conv2d(3, 4, 3), nn.ReLU())
    model, (x, ids) = aio_compile.prepare_module(conv, (torch.rand(1, 3, 8, 8), torch.ones(1, 3, 8, 8, dtype=torch.long)))
    assert x.is_contiguous(memory_format=torch.channels_last)
    assert model[0].weight.is_contiguous(memory_format=torch.channels_last)
    assert ids.is_contiguous()        # integer inputs stay as they are
    _, (y,) = aio_compile.prepare_module(nn.Linear(4, 4), (torch.rand(1, 3, 8, 4),))
    assert y.is_contiguous()


def test_an_aio_backend_already_there_is_kept():
    from torch._dynamo.backends import registry

    aio_compile.register()
    saved = registry._BACKENDS.pop("aio"), registry._COMPILER_FNS.pop("aio", None)

    def theirs(gm, example_inputs, **kwargs):
        return gm.forward

    try:
        registry.register_backend(theirs, name="aio")
        assert aio_compile.register() == "torch-builtin"
        assert registry.lookup_backend("aio") is theirs
    finally:
        registry._BACKENDS.pop("aio")
        registry._COMPILER_FNS.pop("aio")
        registry._BACKENDS["aio"] = saved[0]
        if saved[1] is not None:
            registry._COMPILER_FNS["aio"] = saved[1]
    assert aio_compile.provider() == "aio_examples"


def test_import_is_torch_free_and_registers_the_backend():
    code = """
import json, sys
import aio_examples
torch_imported_by_package = "torch" in sys.modules
import torch
from aio_examples import aio_compile
m = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.ReLU()).eval()
x = torch.randn(3, 8)
with torch.no_grad():
    y = torch.compile(m, backend="aio", options={"modelname": "m"})(x)
    ok = torch.allclose(y, m(x), atol=1e-5)
print(json.dumps({"torch_on_import": torch_imported_by_package, "ok": ok, "provider": aio_compile.provider(),
                  "report": aio_compile.last_report("m")}))
"""
    proc = run_cli(["-c", code], timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert result["torch_on_import"] is False
    assert result["ok"] is True
    assert result["provider"] == "aio_examples"
    assert result["report"]["constants"] == 2 and result["report"]["inductor"]["freezing"] is True


def test_another_instance_of_the_same_module_class_gets_its_own_weights(monkeypatch):
    """Dynamo reuses a graph for another instance of the same class; the folded weights must not be the first's
    (past FOLDED_GRAPHS_MAX instances, a graph taking the weights as inputs answers for the others)."""
    from aio_examples.aio_compile import backend

    monkeypatch.setattr(backend, "FOLDED_GRAPHS_MAX", 1)
    torch.manual_seed(0)
    modules = [torch.nn.Linear(16, 4).eval() for _ in range(4)]
    x = torch.randn(2, 16)
    with torch.no_grad():
        for m in [*modules, modules[0], modules[2]]:
            torch.testing.assert_close(torch.compile(m, backend="aio")(x), m(x))
