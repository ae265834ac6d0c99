"""int8 and fp16 on the torch backends: what runs is what the record says, and what cannot run says why."""

import copy

import pytest
import torch
from torch import nn

from aio_examples import benchmark
from aio_examples.backends import BACKENDS, PrepareContext
from aio_examples.backends import int8 as quantize


class LinearNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.body = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 8))

    def forward(self, x):
        return self.body(x)


class ConvNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.features = nn.Sequential(nn.Conv2d(3, 16, 3, padding=1), nn.BatchNorm2d(16), nn.ReLU(),
                                      nn.Conv2d(16, 32, 3, padding=1), nn.ReLU())
        self.head = nn.Sequential(nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(32, 10))

    def forward(self, x):
        return self.head(self.features(x))


def _images(i, batch=2):
    return (torch.rand(batch, 3, 32, 32, generator=torch.Generator().manual_seed(i)),)


def _prepare(backend, net, inputs):
    net = net.eval()
    ctx = PrepareContext(model_name=type(net).__name__, task="custom", family="vision", shape={},
                         batch_size=inputs[0].shape[0], weights_id="-",
                         calibration=lambda n: [_images(100 + i) for i in range(n)])
    with torch.no_grad():
        reference = net(*inputs)
        prepared = BACKENDS[backend].prepare(copy.deepcopy(net), inputs, "int8", 2, ctx)
        out = prepared.fn(*prepared.inputs)
    return prepared, reference, out


def _cosine(a, b):
    return torch.nn.functional.cosine_similarity(a.float().flatten(), b.float().flatten(), 0).item()


def test_the_scheme_follows_where_the_work_is():
    assert quantize.is_conv_net(ConvNet(), _images(0))
    assert not quantize.is_conv_net(LinearNet(), (torch.randn(4, 32),))
    # VGG-like: a big classifier holds most parameters, the convolution does most of the work
    vgg_like = nn.Sequential(nn.Conv2d(3, 8, 3), nn.AdaptiveAvgPool2d(4), nn.Flatten(), nn.Linear(128, 1000))
    assert not quantize.is_conv_net(vgg_like)
    assert quantize.is_conv_net(vgg_like, _images(0))
    assert quantize.work_split(vgg_like, _images(0)) == (2 * 8 * 30 * 30 * 27, 2 * 1000 * 128)


class BoxFilter(nn.Module):
    """Non-maximum suppression: torchvision has no fp16 CPU kernel for it."""

    def forward(self, boxes, scores):
        from aio_examples.compat.torchvision_shim import ensure_torchvision

        return ensure_torchvision().ops.nms(boxes, scores, 0.5)


@pytest.mark.parametrize("backend", ["eager", "torchscript"])
def test_a_missing_fp16_kernel_is_unsupported_and_named(backend):
    xy = torch.rand(16, 2, generator=torch.Generator().manual_seed(0)) * 10
    boxes = torch.cat([xy, xy + 5], 1)
    r = benchmark(BoxFilter(), example_inputs=(boxes, torch.rand(16)), precision="fp16", backend=backend,
                  threads=1, num_runs=2)
    assert r.status == "unsupported"
    assert "nms_kernel\" not implemented for 'Half'" in r.reason


def test_gpt2_style_conv1d_becomes_an_equivalent_linear():
    from transformers.pytorch_utils import Conv1D

    net = nn.Sequential(Conv1D(6, 4), nn.ReLU()).eval()
    x = torch.randn(3, 4)
    before = net(x)
    assert quantize.hf_conv1d_to_linear(net) == 1
    assert isinstance(net[0], nn.Linear) and net[0].weight.shape == (6, 4)
    torch.testing.assert_close(net(x), before)


@pytest.mark.parametrize("backend", ["eager", "torchscript"])
def test_dynamic_int8_runs_int8_linear_kernels(backend):
    prepared, reference, out = _prepare(backend, LinearNet(), (torch.randn(4, 32),))
    assert prepared.precision_mode == "int8-dynamic-linear"
    assert prepared.info["quantized_modules"] == 2
    assert _cosine(out, reference) > 0.99
    if backend == "eager":
        assert quantize.quantized_modules(prepared.fn) == 2
    else:
        assert prepared.info["int8_kernels"] == {"quantized::linear_dynamic": 2}
        assert "quantized::linear_dynamic" in str(prepared.fn.graph)


def test_int8_through_the_api_records_the_scheme():
    r = benchmark(LinearNet().eval(), example_inputs=(torch.randn(4, 32),), precision="int8", threads=1, num_runs=3)
    assert r.status == "ok" and r.precision == "int8"
    assert r.precision_mode == "int8-dynamic-linear" and r.backend_info["quantized_modules"] == 2


@pytest.mark.parametrize("backend", ["eager", "torchscript"])
def test_static_int8_of_a_conv_net_is_unsupported_without_inductor(backend):
    r = benchmark(ConvNet().eval(), example_inputs=_images(0), precision="int8", backend=backend,
                  threads=1, num_runs=2)
    assert r.status == "unsupported"
    assert "inductor" in r.reason and r.latency_ms is None


def test_int8_of_a_model_with_nothing_to_quantize_is_unsupported():
    r = benchmark(nn.Sequential(nn.ReLU()), example_inputs=(torch.randn(2, 4),), precision="int8", threads=1,
                  num_runs=2)
    assert r.status == "unsupported" and "no nn.Linear" in r.reason


def test_conv_net_int8_on_inductor_runs_calibrated_onednn_kernels():
    prepared, reference, out = _prepare("inductor", ConvNet(), _images(0))
    assert prepared.precision_mode == "int8-pt2e-static"
    assert prepared.info["calibration_batches"] == quantize.CALIBRATION_BATCHES
    kernels = prepared.info["int8_kernels"]
    assert kernels.get("onednn.qconv_pointwise", 0) + kernels.get("onednn.qconv2d_pointwise", 0) == 2
    assert kernels.get("onednn.qlinear_pointwise") == 1
    assert _cosine(out, reference) > 0.99


@pytest.mark.slow
def test_linear_net_int8_on_inductor_runs_dynamic_onednn_kernels():
    prepared, reference, out = _prepare("inductor", LinearNet(), (torch.randn(4, 32),))
    assert prepared.precision_mode == "int8-pt2e-dynamic"
    assert prepared.info["int8_kernels"] == {"onednn.qlinear_pointwise": 2}
    assert _cosine(out, reference) > 0.99


def test_int8_kernels_are_counted_from_generated_code():
    code = ("buf1 = torch.ops.onednn.qconv_pointwise.default(arg0, 0.1)\n"
            "buf2 = torch.ops.onednn.qconv_pointwise.default(buf1, 0.2)\n"
            "buf3 = torch.ops.aten.mm.default(buf2, w)  # onednn.qlinear_pointwise in a comment\n")
    assert quantize.count_int8_kernels(code) == {"onednn.qconv_pointwise": 2}
    assert quantize.count_int8_kernels("buf0 = torch.ops.aten.convolution.default(x, w)") == {}


@pytest.mark.parametrize("backend", ["eager", "torchscript", pytest.param("inductor", marks=pytest.mark.slow)])
def test_fp16_on_a_conv_net_runs_or_is_unsupported(backend):
    r = benchmark(ConvNet().eval(), example_inputs=_images(0), precision="fp16", backend=backend, threads=1,
                  num_runs=2)
    assert r.status in ("ok", "unsupported"), r.reason
    if r.status == "ok":
        assert r.precision_mode == "cast" and r.latency_ms["n"] == 2
    else:
        assert r.reason


def test_int8_of_a_generation_step_on_inductor_is_weight_only():
    class Step(torch.nn.Module):          # token ids in, next-token scores out, over its own cache
        def __init__(self):
            super().__init__()
            self.embed, self.head = torch.nn.Embedding(64, 32), torch.nn.Linear(32, 64)

        def forward(self, ids):
            return self.head(self.embed(ids))

        def new_cache(self, max_len):
            return None

    r = benchmark(Step().eval(), example_inputs=(torch.randint(0, 64, (2, 8)),), precision="int8",
                  backend="inductor", threads=1, num_runs=2)
    assert r.status == "ok", r.reason
    assert r.precision_mode == "w8a16" and r.backend_info["quantized_linears"] == 1


@pytest.mark.slow
def test_gpt2_int8_quantizes_its_projections_in_eager():
    r = benchmark("gpt2", precision="int8", backend="eager", seq_len=8, new_tokens=2, threads=1, num_runs=2)
    # a generator's int8 is weight-only (docs/generation.md)
    assert r.status == "ok" and r.precision_mode == "w8a16"
    # 12 blocks x 4 projections (transformers Conv1D, made Linear first) + the LM head
    assert r.backend_info["conv1d_converted_to_linear"] == 48 and r.backend_info["quantized_linears"] == 49


def test_a_generation_step_is_copied_straight_at_bf16_with_ties_kept():
    class Step(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.embed, self.head = torch.nn.Embedding(64, 32), torch.nn.Linear(32, 64, bias=False)
            self.head.weight = self.embed.weight          # tied, as Llama 3.2 1B's are
            self.register_buffer("positions", torch.arange(8))

        def forward(self, ids):
            return self.head(self.embed(ids))

        def new_cache(self, max_len):
            return None

    step = Step()
    for precision in ("bf16", "int8", "int4"):
        own = BACKENDS["eager"].working_copy(step, precision)
        assert own.embed.weight.dtype == torch.bfloat16 and own.head.weight is own.embed.weight
        assert own.positions.dtype == torch.int64 and own.embed.weight.data_ptr() != step.embed.weight.data_ptr()
        torch.testing.assert_close(own.embed.weight.float(), step.embed.weight, atol=1e-2, rtol=1e-2)
    assert step.embed.weight.dtype == torch.float32          # the shared model is left as it was
    # fp32, and anything not a generation step, is an exact copy at the precision it was built in
    assert BACKENDS["eager"].working_copy(step, "fp32").embed.weight.dtype == torch.float32
    plain = torch.nn.Linear(4, 4)
    assert BACKENDS["inductor"].working_copy(plain, "bf16").weight.dtype == torch.float32
