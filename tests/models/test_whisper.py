"""Whisper in the generation scenario, on a small config (`--config-override`): the encoder inside TTFT, the static
self- and cross-attention caches, no recompilation under inductor, the backends that refuse it, bad input."""

import time

import pytest
import torch

from aio_examples.backends import Prepared
from aio_examples.core.errors import UsageError
from aio_examples.machine.threads import ThreadChoice
from aio_examples.measurement.runner import RunRequest, run
from aio_examples.measurement.timing import StopRule
from aio_examples.models import get_model
from aio_examples.models.nlp import tensor_bytes
from aio_examples.models.speech import PROMPT_IDS

# 2 + 2 layers of width 64 over 2 s of audio (100 encoder positions, 200 log-mel frames)
TINY = ["d_model=64", "encoder_layers=2", "decoder_layers=2", "encoder_attention_heads=4",
        "decoder_attention_heads=4", "encoder_ffn_dim=128", "decoder_ffn_dim=128", "max_source_positions=100"]
NEW = 4


def tiny_whisper():
    return get_model("whisper_tiny").with_config(TINY)


# The slow tier: a second generator compiled by inductor; tests/measurement/test_generation.py keeps inductor's
# warm-up-only compile of a generation in the default tier
@pytest.mark.slow
def test_whisper_generates_on_eager_and_inductor_with_the_generation_metrics_and_no_recompilation(tmp_path):
    spec = tiny_whisper()
    records = run(RunRequest(spec, ["eager", "inductor"], "fp32", 1, ThreadChoice(1, "--threads"),
                             spec.shape(new_tokens=NEW), rule=StopRule(timeout_s=0.3)), tmp_path)
    assert [r.status for r in records] == ["ok", "ok"], [r.reason for r in records]
    module = spec.build(shape=spec.shape(new_tokens=NEW))
    decoder_bytes = tensor_bytes(torch.nn.ModuleList([module.model.model.decoder, module.model.proj_out]))
    for r in records:
        assert r.scenario["name"] == "generation" and r.task == "speech-recognition"
        gen = r.metrics["generation"]
        assert gen["prompt_tokens"] == len(PROMPT_IDS) and gen["new_tokens"] == NEW
        assert gen["recompilations"] == 0
        assert gen["ttft_ms"]["n"] == gen["e2e_ms"]["n"] and gen["itl_ms"]["n"] == gen["e2e_ms"]["n"] * (NEW - 1)
        # layers x (keys + values) x batch x width x fp32, over prompt + new tokens (self-attention) and the
        # 100 encoder positions (cross-attention)
        assert gen["kv_cache_bytes"] == 2 * 2 * 1 * 64 * 4 * ((len(PROMPT_IDS) + NEW) + 100)
        # a decoded token reads the decoder and the output projection, not the encoder
        assert gen["weight_bytes"] == decoder_bytes < tensor_bytes(module)
        assert r.check["passed"] and r.check["agreement"]["token_prefix"] == 1.0
        assert r.input_shape == {"batch_size": 1, "new_tokens": NEW, **{f"config.{k}": v
                                                                        for k, v in spec.config_overrides}}
    assert records[1].backend_info["dynamic"] is False


def test_time_to_first_token_includes_the_encoder_which_runs_once_per_pass():
    spec = tiny_whisper()
    shape = spec.shape(new_tokens=NEW)
    module = spec.build(shape=shape)
    encoder, stamps = module.model.model.encoder, []
    encoder.register_forward_pre_hook(lambda *_: stamps.append(("encoder starts", time.perf_counter_ns())))
    encoder.register_forward_hook(lambda *_: stamps.append(("encoder ends", time.perf_counter_ns())))
    one_pass = spec.make_pass(Prepared(module, spec.example_inputs(2, shape, module), "native"), shape)
    with torch.no_grad():
        tokens, first_logits = one_pass()
    assert [name for name, _ in stamps] == ["encoder starts", "encoder ends"]       # in the prefill only
    assert stamps[1][1] - stamps[0][1] < one_pass.pass_metrics["ttft"]
    assert len(one_pass.pass_metrics["itl"]) == NEW - 1 and one_pass.pass_metrics["compiles"] == 0
    assert one_pass.facts["prompt_tokens"] == 4 and tokens.shape == (2, NEW)
    assert torch.equal(tokens[:, 0], first_logits.argmax(-1))
    # the same tokens as the model recomputing the whole sequence at every step, without a cache
    features, ids = one_pass.context[0], one_pass.prompt
    with torch.no_grad():
        for _ in range(NEW):
            logits = module.model(input_features=features, decoder_input_ids=ids, use_cache=False).logits[:, -1]
            ids = torch.cat([ids, logits.argmax(-1, keepdim=True)], 1)
    assert torch.equal(ids[:, len(PROMPT_IDS):], tokens)


def test_weight_only_int8_and_int4_run_on_eager_and_the_other_engines_refuse(tmp_path):
    spec = tiny_whisper()
    records = run(RunRequest(spec, ["eager", "onnxruntime", "openvino", "torchscript"], ["bf16", "int8", "int4"], 1,
                             ThreadChoice(1, "--threads"), spec.shape(new_tokens=NEW), rule=StopRule(timeout_s=0.2)),
                  tmp_path)
    by = {(r.backend, r.precision): r for r in records}
    assert {p: by["eager", p].precision_mode for p in ("bf16", "int8", "int4")} == {
        "bf16": "cast", "int8": "w8a16", "int4": "w4a16-g128"}
    assert all(by["eager", p].status == "ok" for p in ("bf16", "int8", "int4")), [r.reason for r in records]
    assert all(r.status == "unsupported" and r.reason for r in records if r.backend != "eager")
    assert "KV cache" in by["onnxruntime", "int8"].reason and "trace" in by["torchscript", "bf16"].reason


def test_bad_whisper_input_is_one_line():
    spec = get_model("whisper_tiny")
    assert spec.shape() == {"new_tokens": 64} and spec.family == "speech"
    with pytest.raises(UsageError, match="--seq-len does not apply to whisper_tiny"):
        spec.shape(seq_len=16)
    with pytest.raises(UsageError, match=r"--new-tokens 445 is invalid for whisper_tiny; accepted: 1\.\.444"):
        spec.shape(new_tokens=445)
    with pytest.raises(UsageError, match="WhisperConfig has no 'num_layers'"):
        spec.with_config(["num_layers=2"])
    with pytest.raises(UsageError, match="has no config.json"):
        spec.build(model_dir="/")


def test_the_real_shapes_and_a_sensible_memory_estimate():
    tiny, base = (get_model(n)._config() for n in ("whisper_tiny", "whisper_base"))
    assert (tiny.d_model, tiny.encoder_layers, tiny.decoder_layers, tiny.encoder_attention_heads) == (384, 4, 4, 6)
    assert (base.d_model, base.encoder_layers, base.decoder_layers, base.encoder_attention_heads) == (512, 6, 6, 8)
    assert (tiny.num_mel_bins, tiny.max_source_positions, tiny.vocab_size) == (80, 1500, 51865)
    # the fp32 weights (tiny: 37.8 M parameters) plus activations and caches, far below a GiB at batch 1
    assert 37_000_000 * 4 < get_model("whisper_tiny").weight_bytes() < 38_000_000 * 4
    estimate = get_model("whisper_tiny").memory_estimate(1, {"new_tokens": 64})
    assert 37_000_000 * 4 < estimate < 2**30
    assert get_model("whisper_base").memory_estimate(8, {"new_tokens": 64}) > 8 * estimate / 2
