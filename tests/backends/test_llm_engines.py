"""The LLM engines (llama.cpp, ONNX Runtime GenAI, OpenVINO GenAI) end to end on a tiny Llama: conversion from the built weights,
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


def engine_run(tmp_path, backend, precisions, batch=1, with_eager=True):
    spec = tiny_llama()
    return run(RunRequest(spec, ["eager", backend] if with_eager else [backend], precisions, batch, ThreadChoice(1, "--threads"),
                          spec.shape(**SHAPE), rule=StopRule(timeout_s=0.5)), tmp_path)


def needs(backend):
    reason = BACKENDS[backend].unavailable_reason()
    return pytest.mark.skipif(reason is not None, reason=reason or "")


def _check_engine_records(results, backend, modes, logits=True):
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
        assert r.check["passed"] and r.check["agreement"]["token_prefix"] is not None
        if not logits:           # tokens alone: nothing numeric to judge
            assert r.check["cosine"] is None and "cosine" not in r.check["judged"]
            continue
        # logits of the prefill and the teacher-forced decode steps, compared with eager fp32's
        assert r.check["agreement"]["teacher_forced_top1"] is not None
        if r.precision == "fp32":
            assert r.check["cosine"] > 0.9999
        else:
            assert r.check["cosine"] < 0.9999          # int4's own error shows: not a copy of the reference


@pytest.mark.slow       # a long end-to-end run: the second tier keeps the default one under 15 minutes
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


@needs("openvino_genai")
def test_openvino_genai_runs_the_same_gguf_with_pinned_precisions(tmp_path):
    results = engine_run(tmp_path, "openvino_genai", ["int8", "int4"])
    ov = [r for r in results if r.backend == "openvino_genai"]
    modes = {r.precision: r.precision_mode for r in ov}
    # int8 activations where OpenVINO's dynamic quantization is on, else 16/32-bit: read back, never assumed
    assert modes["int8"][:3] == "w8a" and modes["int4"][:3] == "w4a" and modes["int4"].endswith("-b32")
    _check_engine_records(results, "openvino_genai", modes, logits=False)
    for r in ov:
        info = r.backend_info
        asked, read = info["properties_asked"], info["read_back"]
        assert read["INFERENCE_PRECISION_HINT"] == asked["INFERENCE_PRECISION_HINT"]
        assert read["KV_CACHE_PRECISION"] == asked["KV_CACHE_PRECISION"] and read["INFERENCE_NUM_THREADS"] == "1"
        assert info["prefix_caching"] is False and info["tensor_type"] == {"int8": "Q8_0", "int4": "Q4_0"}[r.precision]
        assert "rope_freqs" in info["rope_scaling"]        # Llama 3.2's scaling, which its reader does not apply
    assert BACKENDS["openvino_genai"].unsupported_reason(tiny_llama(), "fp32").startswith("its GGUF reader takes")


def test_gguf_bf16_as_f16_holds_the_bf16_weights(tmp_path, monkeypatch):
    import gguf
    import torch

    monkeypatch.setenv("AIO_CACHE_DIR", str(tmp_path))
    spec = tiny_llama()
    step = spec.build(None, None, spec.shape(**SHAPE)).eval()
    path, info = gguf_export.gguf_file(step, "bf16", "tiny", "digest", kind="F16")
    assert info["tensor_type"] == "F16" and 0 <= info["f16_inexact_share"] < 0.01
    reader = gguf.GGUFReader(path)
    tensors = {t.name: t for t in reader.tensors}
    v = np.asarray(tensors["blk.0.attn_v.weight"].data).reshape(64, 128).astype(np.float32)
    expected = step.model.model.layers[0].self_attn.v_proj.weight.detach().to(torch.bfloat16).float().numpy()
    exact = np.abs(expected) >= 2.0 ** -14          # F16's normal range: there bf16 values are kept exactly
    np.testing.assert_array_equal(v[exact], expected[exact])
    # the vocabulary shrank to 512: bos and eos must be ids inside it for the engines' tokenizers
    vocab = 512
    assert int(reader.fields["tokenizer.ggml.bos_token_id"].parts[-1][0]) < vocab
    assert int(reader.fields["tokenizer.ggml.eos_token_id"].parts[-1][0]) < vocab


@pytest.mark.parametrize("backend", ["llama_cpp", "onnxruntime_genai", "openvino_genai"])
def test_engines_refuse_what_they_cannot_run(tmp_path, backend):
    if BACKENDS[backend].unavailable_reason():
        pytest.skip(BACKENDS[backend].unavailable_reason())
    assert "text generation only" in BACKENDS[backend].unsupported_reason(get_model("resnet_50_v1"), "fp32")
    if backend == "onnxruntime_genai":
        assert "fp32 and int4" in BACKENDS[backend].unsupported_reason(tiny_llama(), "int8")
    precision = "int8" if backend == "openvino_genai" else "fp32"
    [_, r] = engine_run(tmp_path, backend, [precision], batch=2)
    assert r.status == "unsupported" and "batch 1" in r.reason
    whisper = get_model("whisper_tiny").with_config(["encoder_layers=1", "decoder_layers=1"])
    [_, w] = run(RunRequest(whisper, ["eager", backend], precision, 1, ThreadChoice(1, "--threads"),
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


@pytest.mark.slow       # Llama 3.2 1B's full width and vocabulary, two of its layers: minutes of conversion
def test_engines_run_llama_3_2_1b_width_and_vocabulary(tmp_path):
    engines = [b for b in ("llama_cpp", "onnxruntime_genai", "openvino_genai") if BACKENDS[b].unavailable_reason() is None]
    if not engines:
        pytest.skip("no LLM engine installed")
    spec = get_model("llama_3_2_1b").with_config(["num_hidden_layers=2"])
    results = run(RunRequest(spec, ["eager", *engines], ["int4"], 1, ThreadChoice(2, "--threads"),
                             spec.shape(seq_len=64, new_tokens=8), rule=StopRule(timeout_s=2)), tmp_path)
    for r in results:
        if r.backend in engines:
            assert r.status == "ok", (r.backend, r.reason)
            assert r.precision_mode.startswith("w4a") and r.metrics["generation"]["decode_tokens_per_s"] > 0
            # a 128256-token vocabulary and 64-wide heads: the shapes the engines' readers must take
            assert r.check["agreement"]["token_prefix"] is not None
