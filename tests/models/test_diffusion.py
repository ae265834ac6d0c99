"""The Stable Diffusion 1.5 UNet (unet_sd): one denoising step, on a narrow config of the same block types
(`--config-override`) except where the full one is the point; its inputs, shape rules, config overrides, output
check and the backends that export it."""

import pytest
import torch

from aio_examples.backends import Prepared
from aio_examples.core.errors import UsageError
from aio_examples.machine.threads import ThreadChoice
from aio_examples.measurement.output_check import check_outputs
from aio_examples.measurement.runner import RunRequest, run
from aio_examples.measurement.timing import StopRule
from aio_examples.models import get_model

TINY = ["block_out_channels=[32,64]", 'down_block_types=["CrossAttnDownBlock2D","DownBlock2D"]',
        'up_block_types=["UpBlock2D","CrossAttnUpBlock2D"]', "layers_per_block=1", "cross_attention_dim=32"]


def tiny_unet():
    return get_model("unet_sd").with_config(TINY)


def test_one_step_predicts_noise_of_the_latents_shape_from_the_latents_timestep_and_text():
    spec = tiny_unet()
    shape = spec.shape(input_size=16)
    module = spec.build(shape=shape)
    latents, timestep, text = inputs = spec.example_inputs(2, shape, module)
    assert latents.shape == (2, 4, 16, 16) and text.shape == (2, 77, 32) and timestep.tolist() == [500, 500]
    with torch.no_grad():
        noise = spec.make_pass(Prepared(module, inputs, "native"), shape)()
        assert noise.shape == latents.shape and torch.isfinite(noise).all() and 0.01 < float(noise.std()) < 100
        # every input reaches the prediction
        assert not torch.allclose(module(latents, torch.full_like(timestep, 10), text), noise)
        assert not torch.allclose(module(latents, timestep, text.flip(1)), noise)
        assert torch.equal(spec.build(shape=shape)(*inputs), noise)          # the same random weights every build
    assert spec.task_size(2, shape) == 2 and spec.input_shape(2, shape)["config.block_out_channels"] == [32, 64]


def test_eager_bf16_is_checked_against_fp32_noise_by_cosine(tmp_path):
    spec = tiny_unet()
    records = run(RunRequest(spec, ["eager"], ["fp32", "bf16"], 1, ThreadChoice(1, "--threads"),
                             spec.shape(input_size=16), rule=StopRule(timeout_s=0.2)), tmp_path)
    assert [r.status for r in records] == ["ok", "ok"], [r.reason for r in records]
    assert all(r.task == "image-generation" and r.throughput["unit"] == "steps/s" for r in records)
    check = records[1].check
    assert check["passed"] and check["judged"] == ["cosine"] and 0.98 <= check["cosine"] < 1.0


def test_the_output_check_fails_a_noise_prediction_that_is_not_the_reference():
    reference = torch.randn(2, 4, 16, 16, generator=torch.Generator().manual_seed(0))
    close = reference + 0.01 * torch.randn(reference.shape, generator=torch.Generator().manual_seed(1))
    assert check_outputs("image-generation", reference, close, "bf16", judge_agreement=False).passed
    wrong = check_outputs("image-generation", reference, torch.randn_like(reference), "bf16", judge_agreement=False)
    assert not wrong.passed and "cosine similarity" in wrong.reason


@pytest.mark.slow
def test_the_runtimes_and_inductor_run_the_exported_step(tmp_path):
    spec = tiny_unet()
    records = run(RunRequest(spec, ["eager", "inductor", "onnxruntime", "openvino"], "fp32", 1,
                             ThreadChoice(1, "--threads"), spec.shape(input_size=16), rule=StopRule(timeout_s=0.2)),
                  tmp_path)
    assert {r.backend: r.status for r in records} == dict.fromkeys(["eager", "inductor", "onnxruntime", "openvino"],
                                                                   "ok"), [r.reason for r in records]
    assert all(r.check["passed"] and r.check["cosine"] > 0.9999 for r in records)


def test_the_latent_side_and_config_overrides_are_checked_in_one_line():
    spec = get_model("unet_sd")
    assert spec.shape() == {"input_size": 64} and spec.smoke_shape() == {"input_size": 8}
    with pytest.raises(UsageError, match=r"--input-size 60 is invalid for unet_sd; accepted: a multiple of 8"):
        spec.shape(input_size=60)
    with pytest.raises(UsageError, match="--seq-len does not apply to unet_sd"):
        spec.shape(seq_len=16)
    with pytest.raises(UsageError, match="UNet2DConditionModel has no 'layers'"):
        spec.with_config(["layers=2"])
    with pytest.raises(UsageError, match="layers_per_block takes a int"):
        spec.with_config(["layers_per_block=[1]"])
    with pytest.raises(UsageError, match="UNet2DConditionModel refuses it .*block_out_channels"):
        spec.with_config(["block_out_channels=[32,64]"])          # four down blocks, two widths
    assert tiny_unet().shape(input_size=6) == {"input_size": 6}   # two blocks: a multiple of 2


def test_the_real_shapes_and_a_sensible_memory_estimate():
    spec = get_model("unet_sd")
    config = spec.config_dict()
    assert config["block_out_channels"] == (320, 640, 1280, 1280) and config["cross_attention_dim"] == 768
    assert (config["layers_per_block"], config["attention_head_dim"], config["in_channels"]) == (2, 8, 4)
    # SD 1.5's UNet: 859.5 M parameters, counted on the meta device
    assert spec.weight_bytes() == 859_520_964 * 4
    estimate = spec.memory_estimate(1, spec.shape())
    assert spec.weight_bytes() < estimate < spec.weight_bytes() + 2**30
    assert spec.memory_estimate(4, spec.shape()) - spec.weight_bytes() == 4 * (estimate - spec.weight_bytes())


@pytest.mark.slow
def test_the_full_sd15_unet_builds_and_runs_one_step_at_its_smallest_latent():
    spec = get_model("unet_sd")
    shape = spec.smoke_shape()
    module = spec.build(shape=shape)
    assert sum(p.numel() for p in module.parameters()) == 859_520_964
    with torch.no_grad():
        noise = module(*spec.example_inputs(1, shape, module))
    assert noise.shape == (1, 4, 8, 8) and torch.isfinite(noise).all() and 0.01 < float(noise.std()) < 100
