"""BART (bart_base) in the generation scenario, on a small config (`--config-override`): the article encoded inside
the prefill, static self- and cross-attention caches, no recompilation under inductor, a local folder with its
tokenizer and generation config, the backends that refuse it, bad input."""

import pytest
import torch

from aio_examples.backends import Prepared
from aio_examples.core.errors import UsageError
from aio_examples.machine.threads import ThreadChoice
from aio_examples.measurement.runner import RunRequest, run
from aio_examples.measurement.timing import StopRule
from aio_examples.models import get_model
from aio_examples.models.nlp import CONTEXT, load_transformers, tensor_bytes

# 2 + 2 layers of width 64, BART's vocabulary and positions
TINY = ["d_model=64", "encoder_layers=2", "decoder_layers=2", "encoder_attention_heads=4",
        "decoder_attention_heads=4", "encoder_ffn_dim=128", "decoder_ffn_dim=128"]
SEQ, NEW = 24, 4


def tiny_bart():
    return get_model("bart_base").with_config(TINY)


@pytest.mark.slow
def test_bart_summarizes_on_eager_and_inductor_with_the_generation_metrics_and_no_recompilation(tmp_path):
    spec = tiny_bart()
    shape = spec.shape(seq_len=SEQ, new_tokens=NEW)
    records = run(RunRequest(spec, ["eager", "inductor"], "fp32", 1, ThreadChoice(1, "--threads"), shape,
                             rule=StopRule(timeout_s=0.3)), tmp_path)
    assert [r.status for r in records] == ["ok", "ok"], [r.reason for r in records]
    module = spec.build(shape=shape)
    decoder_bytes = tensor_bytes(torch.nn.ModuleList([module.model.model.decoder, module.model.lm_head]))
    for r in records:
        assert r.scenario["name"] == "generation" and r.task == "summarization"
        gen = r.metrics["generation"]
        assert gen["prompt_tokens"] == 1 and gen["new_tokens"] == NEW and gen["recompilations"] == 0
        assert gen["prefill_tokens_per_s"] == pytest.approx((1 + SEQ) / (gen["ttft_ms"]["p50"] / 1e3))
        assert gen["ttft_ms"]["n"] == gen["e2e_ms"]["n"] and gen["itl_ms"]["n"] == gen["e2e_ms"]["n"] * (NEW - 1)
        # layers x (keys + values) x batch x width x fp32, over prompt + summary (self-attention) and the
        # article (cross-attention)
        assert gen["kv_cache_bytes"] == 2 * 2 * 1 * 64 * 4 * ((1 + NEW) + SEQ)
        # a decoded token reads the decoder and the output projection (the shared embeddings once), not the encoder
        assert gen["weight_bytes"] == decoder_bytes < tensor_bytes(module)
        assert r.check["passed"] and r.check["agreement"]["token_prefix"] == 1.0
    assert records[1].backend_info["dynamic"] is False


def test_the_cached_steps_give_the_logits_of_the_whole_sequence_recomputed_and_the_encoder_runs_once():
    spec = tiny_bart()
    shape = spec.shape(seq_len=SEQ, new_tokens=NEW)
    module = spec.build(shape=shape)
    source, prompt = inputs = spec.example_inputs(2, shape, module)
    assert source.shape == (2, SEQ) and int(source.min()) > 3           # no special tokens in the random article
    assert prompt.tolist() == [[2], [2]]                                 # BART's decoder start, </s>
    calls = []
    module.model.model.encoder.register_forward_hook(lambda *_: calls.append("encoder"))
    one_pass = spec.make_pass(Prepared(module, inputs, "native"), shape)
    with torch.no_grad():
        tokens, first_logits = one_pass()
        assert calls == ["encoder"] and tokens.shape == (2, NEW)       # in the prefill only
        assert torch.equal(tokens[:, 0], first_logits.argmax(-1))
        # teacher-forced with tokens other than its own: the logits of the model run over the whole sequence
        forced = torch.randint(4, 1000, (2, NEW), generator=torch.Generator().manual_seed(3))
        cached = one_pass.teacher_forced(forced, NEW - 1)
        whole = module.model(input_ids=source, decoder_input_ids=torch.cat([prompt, forced[:, :-1]], 1),
                             use_cache=False).logits
    torch.testing.assert_close(cached, whole, rtol=1e-4, atol=1e-4)
    assert one_pass.facts["prompt_tokens"] == 1 and one_pass.pass_metrics["compiles"] == 0
    assert one_pass.facts["source_tokens"] == SEQ         # the article: prefill tokens/s counts what TTFT encoded


def test_a_local_bart_folder_summarizes_its_tokenizer_text_after_the_bos_its_generation_config_forces(tmp_path):
    from transformers.convert_slow_tokenizer import bytes_to_unicode

    tf = load_transformers()
    specials = ["<s>", "<pad>", "</s>", "<unk>"]
    tokenizer = tf.BartTokenizer(vocab={t: i for i, t in enumerate(specials + list(bytes_to_unicode().values()))},
                                 merges=[])
    config = tf.BartConfig(vocab_size=len(tokenizer), d_model=32, encoder_layers=1, decoder_layers=1,
                           encoder_attention_heads=2, decoder_attention_heads=2, encoder_ffn_dim=64,
                           decoder_ffn_dim=64, max_position_embeddings=64)
    model = tf.BartForConditionalGeneration(config).eval()
    model.generation_config.forced_bos_token_id = 0             # as BART's CNN/DailyMail summarizer
    model.save_pretrained(tmp_path)
    tokenizer.save_pretrained(tmp_path)
    spec = get_model("bart_base")
    shape = spec.shape(seq_len=SEQ, new_tokens=NEW)
    module = spec.build(model_dir=str(tmp_path))
    assert module.prompt_ids == [2, 0] and module.tokenizer is not None
    source, prompt = spec.example_inputs(2, shape, module)
    assert source.shape == (2, SEQ) and source[0, 0] == 0 and source[0, -1] == 2      # <s> ... </s>
    assert tokenizer.decode(source[0, 1:-1]) == CONTEXT[:SEQ - 2]          # a byte a token: no merges here
    with torch.no_grad():
        tokens, first_logits = spec.make_pass(Prepared(module, (source, prompt), "native"), shape)()
    assert tokens.shape == (2, NEW) and first_logits.shape == (2, len(tokenizer))


def test_the_runtimes_refuse_it_with_the_reason():
    spec = get_model("bart_base")
    from aio_examples.backends import get_backend

    for name, words in (("onnxruntime", "KV cache"), ("openvino", "cache"), ("torchscript", "trace")):
        reason = get_backend(name).unsupported_reason(spec, "fp32") or spec.unsupported_backends.get(name)
        assert reason and words in reason, (name, reason)


def test_bad_bart_input_is_one_line():
    spec = get_model("bart_base")
    assert spec.shape() == {"seq_len": 512, "new_tokens": 64} and spec.family == "nlp"
    with pytest.raises(UsageError, match=r"--seq-len 1025 is too long for bart_base; accepted: 1\.\.1024"):
        spec.shape(seq_len=1025)
    with pytest.raises(UsageError, match=r"--new-tokens 1023 is invalid for bart_base; accepted: 1\.\.1022"):
        spec.shape(new_tokens=1023)
    with pytest.raises(UsageError, match="--input-size does not apply to bart_base"):
        spec.shape(input_size=64)
    with pytest.raises(UsageError, match="BartConfig has no 'num_layers'"):
        spec.with_config(["num_layers=2"])
    with pytest.raises(UsageError, match="has no config.json"):
        spec.build(model_dir="/")


def test_the_real_shapes_and_a_sensible_memory_estimate():
    spec = get_model("bart_base")
    config = spec._config()
    assert (config.d_model, config.encoder_layers, config.decoder_layers, config.encoder_attention_heads) == (
        768, 6, 6, 12)
    assert (config.encoder_ffn_dim, config.vocab_size, config.max_position_embeddings) == (3072, 50265, 1024)
    # facebook/bart-base: 139.4 M parameters (the embeddings shared by encoder, decoder and output)
    assert 139_000_000 * 4 < spec.weight_bytes() < 140_000_000 * 4
    estimate = spec.memory_estimate(1, spec.shape())
    assert spec.weight_bytes() < estimate < 2**30
    assert spec.memory_estimate(8, spec.shape()) > estimate + 7 * (estimate - spec.weight_bytes()) * 0.9
