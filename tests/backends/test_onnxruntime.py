"""ONNX Runtime backend and the ONNX export cache, on real exports of tiny models."""

import json
import tempfile
from pathlib import Path

import numpy as np
import pytest
import torch
from torch import nn

from aio_examples import benchmark
from aio_examples.backends import PrepareContext, get_backend
from aio_examples.backends.artifacts import digests, weights_digest
from aio_examples.backends.exports import MODEL_FILE, atomic_files, export_onnx
from aio_examples.backends.onnxruntime import make_session, session_info
from aio_examples.core.errors import UnsupportedError
from aio_examples.models import get_model

pytest.importorskip("onnxruntime")


class TinyConv(nn.Module):
    def __init__(self):
        super().__init__()
        self.body = nn.Sequential(nn.Conv2d(3, 16, 3, padding=1), nn.BatchNorm2d(16), nn.ReLU(),
                                  nn.Conv2d(16, 16, 3), nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten(),
                                  nn.Linear(16, 4))

    def forward(self, x):
        return self.body(x)


class TinyMLP(nn.Module):
    """Two outputs, 2-D input: exporters write each Linear as Gemm."""

    def __init__(self):
        super().__init__()
        self.a, self.b = nn.Linear(32, 64), nn.Linear(64, 8)

    def forward(self, x):
        hidden = torch.relu(self.a(x))
        return self.b(hidden), hidden.sum(-1)


class TinyBags(nn.Module):
    """A summing EmbeddingBag, which the exporter writes as a Loop over bags whose body reads top-level
    initializers, and a Linear for dynamic int8 to quantize."""

    def __init__(self):
        super().__init__()
        self.bag, self.linear = nn.EmbeddingBag(50, 16, mode="sum"), nn.Linear(16, 4)

    def forward(self, indices, offsets):
        return self.linear(self.bag(indices, offsets))


class DataDependent(nn.Module):
    """A branch on a tensor's value: torch.export refuses it, tracing takes the branch the example takes."""

    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(8, 8)

    def forward(self, x):
        y = self.lin(x)
        return y * 2 if y.sum() > 0 else y - 1


def _model(cls, seed=0):
    torch.manual_seed(seed)
    return cls().eval()


def _ctx(model, name, calibration=None):
    return PrepareContext(model_name=name, task="custom", family="vision", shape={}, batch_size=1,
                          weights_id=weights_digest(model), calibration=calibration)


def _prepare(model, inputs, precision, name, threads=1, calibration=None):
    return get_backend("onnxruntime").prepare(model, inputs, precision, threads, _ctx(model, name, calibration))


def _images(seed, n=1, size=16):
    return (torch.rand(n, 3, size, size, generator=torch.Generator().manual_seed(seed)),)


def test_fp32_outputs_match_torch_and_the_session_settings_are_read_back():
    model, inputs = _model(TinyMLP), (torch.randn(4, 32),)
    prepared = _prepare(model, inputs, "fp32", "mlp", threads=2)
    out = prepared.fn(*prepared.inputs)
    with torch.no_grad():
        ref = model(*inputs)
    assert len(out) == 2 and isinstance(prepared.inputs[0], np.ndarray)
    for got, want in zip(out, ref):
        np.testing.assert_allclose(got, want.numpy(), rtol=1e-4, atol=1e-5)
    assert prepared.precision_mode == "native"
    assert prepared.info["exporter"] == "dynamo" and prepared.info["opset"] >= 17
    session = prepared.info["session"]
    assert session["intra_op_num_threads"] == 2 and session["inter_op_num_threads"] == 1
    assert session["execution_mode"] == "ORT_SEQUENTIAL" and session["graph_optimization_level"] == "ORT_ENABLE_ALL"
    assert session["providers"] == ["CPUExecutionProvider"]


def test_a_session_made_with_one_thread_has_one_intra_op_thread():
    model, inputs = _model(TinyMLP), (torch.randn(4, 32),)
    path, _ = export_onnx(model, inputs, _ctx(model, "mlp"))
    assert session_info(make_session(path, 1))["intra_op_num_threads"] == 1


def test_preparing_leaves_no_profile_file_behind_whether_the_session_loads_or_not(tmp_path, monkeypatch):
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))     # where ORT's profile would land
    model, inputs = _model(TinyMLP, seed=3), (torch.randn(4, 32),)
    prepared = _prepare(model, inputs, "fp32", "mlp-profile")
    assert prepared.info["kernels_by_input_type"]               # the profiled pass was read
    # A graph ORT cannot load (written here with its digest, as an exporter that made such a graph would).
    onnx_path = Path(prepared.info["onnx_path"])
    onnx_path.write_bytes(b"not an onnx graph")
    meta_path = onnx_path.parent / "export.json"
    meta = json.loads(meta_path.read_text())
    meta_path.write_text(json.dumps({**meta, "sha256": digests(onnx_path.parent, meta["sha256"])}))
    with pytest.raises(UnsupportedError, match="cannot load the graph"):
        _prepare(model, inputs, "fp32", "mlp-profile")
    assert list(tmp_path.glob("aio-ort-profile*")) == []


@pytest.mark.parametrize("precision", ["fp32", "int8"])
def test_a_damaged_cached_export_is_made_again_once_not_refused_for_ever(precision):
    model, inputs = _model(TinyMLP, seed=5), (torch.randn(4, 32),)
    first = _prepare(model, inputs, precision, "mlp-damaged")
    damaged = Path(first.info["onnx_path"]) if precision == "fp32" else \
        next(Path(first.info["onnx_path"]).parent.glob("int8-*.onnx"))
    damaged.write_bytes(damaged.read_bytes()[:200])               # torn: a full disk, a killed copy
    again = _prepare(model, inputs, precision, "mlp-damaged")
    if precision == "fp32":
        assert not again.info["cached"] and "did not match its digest" in again.info["rebuilt"]
    else:
        assert not again.info["quantization"]["cached"]
    np.testing.assert_allclose(again.fn(*again.inputs)[0], first.fn(*first.inputs)[0], rtol=1e-5, atol=1e-6)
    assert _prepare(model, inputs, precision, "mlp-damaged").info.get("cached", True)    # and cached again


def test_export_is_cached_and_keyed_by_weights_and_input_shape():
    model, inputs = _model(TinyMLP), (torch.randn(4, 32),)
    path, info = export_onnx(model, inputs, _ctx(model, "mlp-cache"))
    assert not info["cached"] and info["export_s"] > 0
    stamp = path.stat().st_mtime_ns
    again, info2 = export_onnx(model, inputs, _ctx(model, "mlp-cache"))
    assert again == path and info2["cached"] and path.stat().st_mtime_ns == stamp
    assert info2["exporter"] == info["exporter"]        # what made the file is kept with it
    other_weights = _model(TinyMLP, seed=1)
    new_weights, info3 = export_onnx(other_weights, inputs, _ctx(other_weights, "mlp-cache"))
    new_shape, info4 = export_onnx(model, (torch.randn(2, 32),), _ctx(model, "mlp-cache"))
    assert len({path, new_weights, new_shape}) == 3 and not info3["cached"] and not info4["cached"]
    assert not list(path.parent.glob(".tmp-*"))         # no scratch left behind


def test_an_interrupted_write_leaves_no_file_that_looks_finished(tmp_path):
    with pytest.raises(KeyboardInterrupt), atomic_files(tmp_path, MODEL_FILE) as scratch:
        (scratch / MODEL_FILE).write_bytes(b"half a model")
        raise KeyboardInterrupt
    assert list(tmp_path.iterdir()) == []


def test_the_torchscript_exporter_takes_over_when_torch_export_refuses_and_says_why():
    model, inputs = _model(DataDependent), (torch.randn(2, 8),)
    path, info = export_onnx(model, inputs, _ctx(model, "data-dependent"))
    assert info["exporter"] == "torchscript" and info["opset"] == 17
    assert info["exporter_fallback_reason"].startswith("dynamo: ") and "\n" not in info["exporter_fallback_reason"]
    assert path.is_file()


def test_a_model_no_exporter_takes_is_unsupported_with_both_errors():
    class Opaque(nn.Module):
        def forward(self, x):
            return {"a": [x, object()]}

    with pytest.raises(UnsupportedError, match=r"dynamo: .*; torchscript: "):
        export_onnx(Opaque(), (torch.ones(2, 2),), _ctx(nn.Linear(1, 1), "opaque"))


def test_int8_dynamic_for_a_linear_model_quantizes_every_linear():
    model, inputs = _model(TinyMLP), (torch.randn(4, 32),)
    prepared = _prepare(model, inputs, "int8", "mlp")
    quant = prepared.info["quantization"]
    assert prepared.precision_mode == quant["scheme"] == "int8-dynamic"
    kernels = prepared.info["heavy_kernels"]
    assert kernels["total"] == kernels["in_int8"] == 2       # both Gemms became int8 MatMuls
    with torch.no_grad():
        ref = model(*inputs)[0].numpy()
    out = prepared.fn(*prepared.inputs)[0]
    assert np.abs(out - ref).max() < 0.1 * np.abs(ref).max()
    again = _prepare(model, inputs, "int8", "mlp")
    assert again.info["quantization"]["cached"] and again.info["cached"]


def test_int8_dynamic_keeps_the_initializers_only_a_loop_body_reads():
    model, inputs = _model(TinyBags), (torch.randint(50, (12,)), torch.tensor([0, 3, 6, 9]))
    prepared = _prepare(model, inputs, "int8", "bags")
    assert prepared.precision_mode == "int8-dynamic" and prepared.info["heavy_kernels"]["in_int8"] == 1
    with torch.no_grad():
        ref = model(*inputs).numpy()
    assert np.abs(prepared.fn(*prepared.inputs)[0] - ref).max() < 0.1 * np.abs(ref).max()


def test_int8_static_qdq_for_a_conv_net_is_calibrated_and_cached_by_its_calibration_data():
    model, inputs = _model(TinyConv), _images(0)
    calibration = [_images(10 + i) for i in range(3)]
    prepared = _prepare(model, inputs, "int8", "conv", calibration=lambda n: calibration)
    quant = prepared.info["quantization"]
    assert prepared.precision_mode == quant["scheme"] == "int8-static-qdq"
    assert quant["format"] == "QDQ" and quant["per_channel"] and quant["calibration_samples"] == 3
    assert prepared.info["heavy_kernels"]["in_int8"] >= 2      # both convolutions
    with torch.no_grad():
        ref = model(*inputs).numpy()
    out = prepared.fn(*prepared.inputs)[0]
    assert np.abs(out - ref).max() < 0.1 * np.abs(ref).max() + 1e-3
    other = _prepare(model, inputs, "int8", "conv", calibration=lambda n: calibration[:2])
    assert not other.info["quantization"]["cached"] and other.info["cached"]


@pytest.mark.parametrize("precision", ["fp16", "bf16"])
def test_fp16_and_bf16_run_at_that_type_or_are_unsupported_with_ort_s_reason(precision):
    model, inputs = _model(TinyConv), _images(0)
    try:
        prepared = _prepare(model, inputs, precision, "conv")
    except UnsupportedError as exc:
        reason = str(exc)
        assert "\n" not in reason and ("float16" in reason or "bfloat16" in reason), reason
        return
    low = {"fp16": "float16", "bf16": "bfloat16"}[precision]
    assert prepared.precision_mode in ("cast", "mixed") and prepared.info["heavy_kernels"][f"in_{low}"] > 0
    assert str(prepared.inputs[0].dtype) == low


def test_zoo_conv_net_through_the_runner_fp32_and_int8():
    fp32 = benchmark("resnet_18", backend="onnxruntime", input_size=64, threads=1, num_runs=3)
    assert fp32.status == "ok" and fp32.precision_mode == "native" and fp32.latency_ms["n"] == 3
    assert fp32.backend_info["session"]["intra_op_num_threads"] == 1
    int8 = benchmark("resnet_18", backend="onnxruntime", precision="int8", input_size=64, threads=1, num_runs=3)
    assert int8.status == "ok" and int8.precision == "int8" and int8.precision_mode == "int8-static-qdq"
    assert int8.backend_info["quantization"]["scheme"] == "int8-static-qdq"
    assert int8.backend_info["cached"]          # the fp32 export was reused for quantization


@pytest.mark.slow
def test_zoo_encoder_through_the_runner_int8():
    r = benchmark("distilbert_base", backend="onnxruntime", precision="int8", seq_len=16, threads=1, num_runs=3)
    assert r.status == "ok" and r.precision_mode == "int8-dynamic", r.reason
    assert r.backend_info["heavy_kernels"]["in_int8"] >= 36      # 6 layers x 6 weight MatMuls


def test_generation_is_unsupported_with_the_reason():
    backend = get_backend("onnxruntime")
    assert "KV cache" in backend.unsupported_reason(get_model("gpt2"), "fp32")
    assert backend.unsupported_reason(get_model("distilbert_base"), "fp32") is None
    step = PrepareContext(model_name="gpt2", task="text-generation", family="nlp", shape={}, batch_size=1,
                          weights_id="-")
    with pytest.raises(UnsupportedError, match="KV cache"):
        backend.prepare(nn.Linear(2, 2), (torch.ones(1, 2),), "fp32", 1, step)


def test_static_int8_leaves_the_post_processing_after_the_last_conv_in_fp32(tmp_path):
    """A YOLO-like tail (boxes in pixels concatenated with scores in [0, 1]) would share one uint8 scale and
    round every score to zero: the nodes no Conv/MatMul/Gemm follows are left out of quantization."""
    from aio_examples.backends.onnxruntime import _tail_nodes

    class Head(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.a, self.b = torch.nn.Conv2d(3, 8, 3), torch.nn.Conv2d(8, 8, 1)

        def forward(self, x):
            y = self.b(torch.relu(self.a(x)))
            return torch.cat([y * 640.0, torch.sigmoid(y)], 1)

    torch.onnx.export(Head().eval(), (torch.randn(1, 3, 16, 16),), tmp_path / "head.onnx", dynamo=False,
                      opset_version=17)
    import onnx

    nodes = {n.name: n.op_type for n in onnx.load(str(tmp_path / "head.onnx")).graph.node}
    tail = {nodes[name] for name in _tail_nodes(tmp_path / "head.onnx")}
    assert tail - {"Constant"} == {"Mul", "Sigmoid", "Concat"}     # not the convolutions, nor the Relu between them
