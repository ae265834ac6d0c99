"""The OpenVINO backend with real OpenVINO and NNCF on tiny models: outputs, read-back settings, IR cache, int8."""

from pathlib import Path

import numpy as np
import pytest
import torch
from torch import nn

from aio_examples import benchmark
from aio_examples.backends import PrepareContext
from aio_examples.backends.artifacts import weights_digest
from aio_examples.backends.openvino import OpenVinoBackend
from aio_examples.core.errors import UnsupportedError
from aio_examples.models import get_model

BACKEND = OpenVinoBackend()
pytestmark = pytest.mark.skipif(BACKEND.unavailable_reason() is not None, reason=str(BACKEND.unavailable_reason()))


class SmallConvNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.body = nn.Sequential(nn.Conv2d(3, 16, 3, padding=1), nn.ReLU(), nn.Conv2d(16, 16, 3, padding=1), nn.ReLU(),
                                  nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(16, 10))

    def forward(self, x):
        return self.body(x)


class TwoInputMLP(nn.Module):
    """Two inputs and two outputs, Linear-heavy: the transformer path of int8 and a dict reshape."""

    def __init__(self):
        super().__init__()
        self.a, self.b, self.head = nn.Linear(32, 64), nn.Linear(32, 64), nn.Linear(64, 8)

    def forward(self, x, y):
        hidden = torch.relu(self.a(x) + self.b(y))
        return self.head(hidden), hidden.sum(-1)


@pytest.fixture
def own_cache(tmp_path, monkeypatch):
    """A cache of this test's own, so an IR another test made cannot turn a miss into a hit."""
    monkeypatch.setenv("AIO_CACHE_DIR", str(tmp_path))


def _case(module_class):
    torch.manual_seed(0)
    module = module_class().eval()
    gen = torch.Generator().manual_seed(1)
    if module_class is SmallConvNet:
        return module, (torch.rand(2, 3, 16, 16, generator=gen),)
    return module, (torch.randn(4, 32, generator=gen), torch.randn(4, 32, generator=gen))


def _prepare(module, inputs, precision="fp32", threads=1):
    ctx = PrepareContext(model_name=type(module).__name__, task="custom", family="custom", shape={},
                         batch_size=int(inputs[0].shape[0]), weights_id=weights_digest(module))
    return BACKEND.prepare(module, inputs, precision, threads, ctx)


def _expected(module, inputs) -> list[np.ndarray]:
    with torch.no_grad():
        out = module(*inputs)
    return [t.numpy() for t in (out if isinstance(out, tuple) else (out,))]


@pytest.mark.parametrize("module_class", [SmallConvNet, TwoInputMLP])
def test_fp32_matches_torch_with_settings_read_back(module_class):
    module, inputs = _case(module_class)
    prepared = _prepare(module, inputs)
    outputs = prepared.fn(*prepared.inputs)
    expected = _expected(module, inputs)
    assert len(outputs) == len(expected)
    for got, want in zip(outputs, expected):
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)
    assert prepared.precision_mode == "inference-precision-f32"
    info = prepared.info
    assert (info["precision_hint_asked"], info["precision_hint_read_back"]) == ("f32", "f32")
    assert info["threads_read_back"] == 1 and info["performance_hint"] == "LATENCY" and info["num_streams"] == 1
    assert all(isinstance(a, np.ndarray) for a in prepared.inputs)


def test_outputs_are_not_overwritten_by_the_next_pass():
    module, inputs = _case(TwoInputMLP)
    prepared = _prepare(module, inputs)
    first = prepared.fn(*prepared.inputs)
    kept = [a.copy() for a in first]
    prepared.fn(*(a * 3 for a in prepared.inputs))
    for a, b in zip(first, kept):
        np.testing.assert_array_equal(a, b)


def test_a_damaged_cached_ir_is_converted_again(own_cache):
    module, inputs = _case(SmallConvNet)
    first = _prepare(module, inputs)
    weights = Path(first.info["ir"]).with_suffix(".bin")
    weights.write_bytes(weights.read_bytes()[:100])             # torn weights: OpenVINO would misread or refuse
    again = _prepare(module, inputs)
    assert again.info["ir_cache"] == "miss"
    np.testing.assert_allclose(again.fn(*again.inputs)[0], _expected(module, inputs)[0], rtol=1e-4, atol=1e-5)
    assert _prepare(module, inputs).info["ir_cache"] == "hit"


def test_ir_cache_reused_then_invalidated_by_a_weight_change(own_cache):
    module, inputs = _case(SmallConvNet)
    first = _prepare(module, inputs)
    second = _prepare(module, inputs)
    assert (first.info["ir_cache"], second.info["ir_cache"]) == ("miss", "hit")
    assert "convert_s" in first.info and "ir_load_s" in second.info
    assert first.info["ir"] == second.info["ir"]
    with torch.no_grad():
        module.body[0].bias.add_(1.0)
    changed = _prepare(module, inputs)
    assert changed.info["ir_cache"] == "miss" and changed.info["ir"] != first.info["ir"]
    # the new weights are what runs, not the cached IR of the old ones
    np.testing.assert_allclose(changed.fn(*changed.inputs)[0], _expected(module, inputs)[0], rtol=1e-4, atol=1e-5)


def test_int8_quantizes_a_linear_model_as_a_transformer_and_caches_it(own_cache):
    module, inputs = _case(TwoInputMLP)
    prepared = _prepare(module, inputs, "int8")
    assert prepared.precision_mode == "int8-nncf-ptq"
    assert "model type transformer" in prepared.info["int8_scheme"]
    assert prepared.info["precision_hint_read_back"] == "f32" and prepared.info["int8_cache"] == "miss"
    assert int(prepared.info["int8_layers"].split()[0]) > 0
    got, want = prepared.fn(*prepared.inputs)[0].ravel(), _expected(module, inputs)[0].ravel()
    assert np.dot(got, want) / (np.linalg.norm(got) * np.linalg.norm(want)) > 0.98
    assert _prepare(module, inputs, "int8").info["int8_cache"] == "hit"


def _capabilities():
    import openvino as ov

    return ov.Core().get_property("CPU", "OPTIMIZATION_CAPABILITIES")


@pytest.mark.parametrize(("precision", "capability", "hint"), [("bf16", "BF16", "bf16"), ("fp16", "FP16", "f16")])
def test_half_precisions_run_only_where_the_cpu_has_them(precision, capability, hint):
    r = benchmark("resnet_18", backend="openvino", precision=precision, threads=1, num_runs=3, input_size=64)
    if capability in _capabilities():
        assert r.status == "ok", r.reason
        assert r.backend_info["precision_hint_read_back"] == hint
    else:
        assert r.status == "unsupported"
        assert capability in r.reason and "OPTIMIZATION_CAPABILITIES" in r.reason


def test_half_precision_is_refused_before_conversion_without_the_capability():
    if "BF16" in _capabilities():
        pytest.skip("this CPU runs bf16")
    module, inputs = _case(SmallConvNet)
    with pytest.raises(UnsupportedError, match="BF16"):
        _prepare(module, inputs, "bf16")


@pytest.mark.parametrize(("name", "shape"), [
    ("resnet_18", {"input_size": 64}),
    pytest.param("distilbert_base", {"seq_len": 16}, marks=pytest.mark.slow),   # two int64 inputs; ~40 s
])
def test_zoo_fp32_runs_on_one_thread_and_matches_eager(name, shape):
    r = benchmark(name, backend="openvino", precision="fp32", threads=1, num_runs=3, **shape)
    assert r.status == "ok", r.reason
    assert r.latency_ms["n"] == 3
    assert r.backend_info["threads_read_back"] == 1 and r.backend_info["precision_hint_read_back"] == "f32"
    if r.check is not None:     # outputs checked against eager fp32 by the runner
        assert r.check["passed"], r.check


def test_zoo_int8_is_recorded_as_int8():
    r = benchmark("resnet_18", backend="openvino", precision="int8", threads=1, num_runs=3, input_size=64)
    assert r.status == "ok", r.reason
    assert r.precision_mode == "int8-nncf-ptq"
    assert "model type default" in r.backend_info["int8_scheme"]   # a conv net: the default (CNN) scheme
    assert int(r.backend_info["int8_layers"].split()[0]) > 0


@pytest.mark.slow
def test_detection_outputs_are_flattened_and_agree_with_eager():
    """Converted through a flat-output wrapper (a trace cannot return torchvision's list of dicts).

    Random weights give every candidate the same score, so conv biases get noise first: ties would
    make which boxes survive arbitrary and the comparison meaningless.
    """
    from aio_examples.measurement.output_check import check_outputs

    spec = get_model("ssdlite320_mobilenet_v3")
    shape = spec.shape(input_size=128)
    module = spec.build(shape=shape)
    torch.manual_seed(3)
    with torch.no_grad():
        for conv in module.modules():
            if isinstance(conv, nn.Conv2d) and conv.bias is not None:
                conv.bias.normal_(0, 1.0)
    inputs = spec.example_inputs(1, shape, module)
    prepared = _prepare(module, inputs)
    with torch.no_grad():
        reference = module(*inputs)
    outputs = prepared.fn(*prepared.inputs)
    assert [o.shape[1:] for o in outputs] == [(4,), (), ()]     # boxes, scores, labels of the one image
    check = check_outputs(spec.task, reference, outputs, "fp32", True)
    assert check.passed and check.to_dict()["agreement"]["reference_boxes"] > 0, check.to_dict()


def test_generation_is_unsupported_with_its_reason():
    assert "KV cache" in BACKEND.unsupported_reason(get_model("gpt2"), "fp32")
    assert BACKEND.unsupported_reason(get_model("bert_base"), "fp32") is None


@pytest.mark.parametrize("preload, name", [("/usr/lib/x86_64-linux-gnu/libtcmalloc.so.4", "tcmalloc"),
                                           ("/opt/lib/libjemalloc.so.2", "jemalloc")])
def test_preloaded_allocator_makes_it_unavailable(monkeypatch, preload, name):
    monkeypatch.setenv("LD_PRELOAD", preload)
    assert f"LD_PRELOADed {name}" in BACKEND.unavailable_reason()
    monkeypatch.setenv("LD_PRELOAD", "")
    assert BACKEND.unavailable_reason() is None
