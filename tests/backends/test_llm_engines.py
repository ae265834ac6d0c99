"""The LLM engines (llama.cpp, ONNX Runtime GenAI) end to end on a tiny Llama: conversion from the built weights,
generation timed by the engine's own loop, the record, the cached conversion, and the refusals."""

import math

import numpy as np
import pytest

from aio_examples.backends import BACKENDS
from aio_examples.backends import gguf as gguf_export
from aio_examples.machine.threads import ThreadChoice
from aio_examples.measurement.runner import RunRequest, run
from aio_examples.measurement.timing import StopRule
from aio_examples.models import get_model

TINY = ["num_hidden_layers=2", "hidden_size=128", "intermediate_size=256", "num_attention_heads=4",
        "num_key_value_heads=2", "head_dim=32", "vocab_size=512"]
SHAPE = {"seq_len": 16, "new_tokens": 6}


def tiny_llama():
    return get_model("llama_3_2_1b").with_config(TINY)


def engine_run(tmp_path, backend, precisions, batch=1):
    spec = tiny_llama()
    return run(RunRequest(spec, ["eager", backend], precisions, batch, ThreadChoice(1, "--threads"),
                          spec.shape(**SHAPE), rule=StopRule(timeout_s=0.5)), tmp_path)


def needs(backend):
    reason = BACKENDS[backend].unavailable_reason()
    return pytest.mark.skipif(reason is not None, reason=reason or "")


def _check_engine_records(results, backend, modes):
    for r in results:
        if r.backend != backend:
            continue
        assert r.status == "ok", r.reason
        assert r.precision_mode == modes[r.precision]
        gen = r.metrics["generation"]
        n = gen["e2e_ms"]["n"]
        # one stamp per token from the engine's own loop: 1 TTFT and new_tokens - 1 gaps per pass
        assert gen["ttft_ms"]["n"] == n and gen["itl_ms"]["n"] == n * (SHAPE["new_tokens"] - 1)
        assert gen["recompilations"] == 0 and gen["weight_bytes"] > 0
        assert gen["prompt_tokens"] == SHAPE["seq_len"]
        # logits of the prefill and the teacher-forced decode steps, compared with eager fp32's
        assert r.check["passed"] and r.check["agreement"]["teacher_forced_top1"] is not None
        if r.precision == "fp32":
            assert r.check["cosine"] > 0.9999
        else:
            assert r.check["cosine"] < 0.9999          # int4's own error shows: not a copy of the reference


@needs("onnxruntime_genai")
def test_onnxruntime_genai_runs_the_built_weights_and_caches_its_model(tmp_path):
    results = engine_run(tmp_path, "onnxruntime_genai", ["fp32", "int4"])
    _check_engine_records(results, "onnxruntime_genai", {"fp32": "native", "int4": "w4a8-b32"})
    info = next(r for r in results if r.backend == "onnxruntime_genai" and r.precision == "int4").backend_info
    assert info["weights"] == "MatMulNBits: int4 blocks of 32, accuracy level 4 (int8 activations)"
    assert info["kv_cache"] == "fp32" and info["intra_op_num_threads"] == 1
    again = engine_run(tmp_path, "onnxruntime_genai", ["int4"])
    assert next(r for r in again if r.backend == "onnxruntime_genai").backend_info["cached"] is True


@needs("llama_cpp")
def test_llama_cpp_runs_gguf_written_from_the_built_weights(tmp_path):
    results = engine_run(tmp_path, "llama_cpp", ["fp32", "int4"])
    _check_engine_records(results, "llama_cpp", {"fp32": "native", "int4": "w4a8-b32"})
    info = next(r for r in results if r.backend == "llama_cpp" and r.precision == "int4").backend_info
    assert info["tensor_type"] == "Q4_0" and info["n_threads"] == 1 and info["kv_cache"] == "f16"
    again = engine_run(tmp_path, "llama_cpp", ["int4"])
    assert next(r for r in again if r.backend == "llama_cpp").backend_info["cached"] is True


@pytest.mark.parametrize("backend", ["llama_cpp", "onnxruntime_genai"])
def test_engines_refuse_what_they_cannot_run(tmp_path, backend):
    if BACKENDS[backend].unavailable_reason():
        pytest.skip(BACKENDS[backend].unavailable_reason())
    assert "text generation only" in BACKENDS[backend].unsupported_reason(get_model("resnet_50_v1"), "fp32")
    if backend == "onnxruntime_genai":
        assert "fp32 and int4" in BACKENDS[backend].unsupported_reason(tiny_llama(), "int8")
    [_, r] = engine_run(tmp_path, backend, ["fp32"], batch=2)
    assert r.status == "unsupported" and "batch 1" in r.reason
    whisper = get_model("whisper_tiny").with_config(["encoder_layers=1", "decoder_layers=1"])
    [_, w] = run(RunRequest(whisper, ["eager", backend], "fp32", 1, ThreadChoice(1, "--threads"),
                            whisper.shape(new_tokens=3), rule=StopRule(timeout_s=0.3)), tmp_path)
    assert w.status == "unsupported" and "Llama-architecture" in w.reason


def test_gguf_holds_the_weights_in_llamas_layout(tmp_path, monkeypatch):
    import gguf

    monkeypatch.setenv("AIO_CACHE_DIR", str(tmp_path))
    spec = tiny_llama()
    step = spec.build(None, None, spec.shape(**SHAPE)).eval()
    path, info = gguf_export.gguf_file(step, "int8", "tiny", "digest")
    assert info["tensor_type"] == "Q8_0" and "blocks of 32" in info["format"]
    path32, _ = gguf_export.gguf_file(step, "fp32", "tiny", "digest")
    reader = gguf.GGUFReader(path32)
    tensors = {t.name: t for t in reader.tensors}
    assert {t.tensor_type.name for t in gguf.GGUFReader(path).tensors if t.name.endswith("attn_q.weight")} == {"Q8_0"}
    assert "output.weight" not in tensors            # tied: llama.cpp reads the token embeddings
    layer = step.model.model.layers[1].self_attn
    q = np.asarray(tensors["blk.1.attn_q.weight"].data).reshape(128, 128)
    # rows regrouped per head from halves to adjacent pairs: undoing it gives transformers' weight back
    heads = 4
    undone = q.reshape(heads, q.shape[0] // heads // 2, 2, -1).swapaxes(1, 2).reshape(q.shape)
    np.testing.assert_array_equal(undone, layer.q_proj.weight.detach().numpy())
    v = np.asarray(tensors["blk.1.attn_v.weight"].data).reshape(64, 128)
    np.testing.assert_array_equal(v, layer.v_proj.weight.detach().numpy())
    # Llama 3's RoPE scaling: high frequencies kept, low ones divided by the factor (32), a smooth band between
    factors = np.asarray(tensors["rope_freqs.weight"].data)
    assert factors.shape == (16,) and factors[0] == 1.0 and factors[-1] == 32.0
    wavelen = [2 * math.pi * 500000.0 ** (2 * i / 32) for i in range(16)]
    for f, w in zip(factors, wavelen, strict=True):
        if 8192 / 4 <= w <= 8192:
            smooth = (8192 / w - 1) / 3
            assert f == pytest.approx(1 / ((1 - smooth) / 32 + smooth))
    assert int(reader.fields["llama.block_count"].parts[-1][0]) == 2
