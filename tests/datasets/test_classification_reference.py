"""A torchvision classifier on an ImageNet folder scores what torchvision's reference evaluation gives: the harness's
inputs and predictions, through the dataset and the runner, against the weights' own `transforms()` (what
torchvision's classification reference evaluates its weights with) run in the test on the same files, images of
three aspect ratios. The zoo's random weights are rescaled to unit variance (models/base.py): logits depend on the
image.
"""

import json
from pathlib import Path

import torch
from image_folders import imagenet_folder
from PIL import Image

from aio_examples.compat.torchvision_shim import ensure_torchvision
from aio_examples.datasets import open_dataset
from aio_examples.machine.threads import ThreadChoice
from aio_examples.measurement.runner import RunRequest, run
from aio_examples.measurement.timing import StopRule
from aio_examples.models import get_model


def test_a_classifier_scores_what_torchvision_s_reference_transforms_give(tmp_path):
    labels = imagenet_folder(tmp_path)
    spec = get_model("resnet_18")
    preset = getattr(ensure_torchvision().models.get_model_weights(spec.builder), spec.weights_name).transforms()
    shape = spec.shape(input_size=preset.crop_size[0])
    dataset = open_dataset("imagenet", str(tmp_path), str(labels))
    [r] = run(RunRequest(spec, ["eager"], "fp32", 2, ThreadChoice(2, "--threads"), shape,
                         rule=StopRule(timeout_s=0.2), dataset=dataset), tmp_path / "out")
    assert r.status == "ok", r.reason
    files = [path for path, _ in dataset.samples]
    reference = torch.stack([preset(Image.open(f).convert("RGB")) for f in files])
    # the very tensors torchvision's transforms make, batch after batch
    assert torch.equal(torch.cat([b.inputs[0][:b.count] for b in dataset.batches(spec, 2, shape, None)]), reference)
    with torch.no_grad():
        logits = spec.build(shape=shape)(reference)
    assert (logits[1:] - logits[:1]).abs().amax(dim=1).min() > 0.1        # the images give different logits
    best = logits.topk(5).indices.tolist()
    assert [p["top_5"] for p in json.loads(Path(r.accuracy["predictions"]).read_text())] == best
    protocol = r.accuracy["protocol"]
    assert protocol["protocol"] == "reference" and "reference_shape" not in protocol
    assert protocol["shape"] == {"crop_size": preset.crop_size[0], "resize_size": preset.resize_size[0]}


def test_another_input_size_scales_the_reference_transforms_and_says_so():
    spec = get_model("resnet_18")
    preset = getattr(ensure_torchvision().models.get_model_weights(spec.builder), spec.weights_name).transforms()
    crop = preset.crop_size[0] // 2
    protocol = spec.reference_protocol({"input_size": crop})
    assert protocol["shape"] == {"crop_size": crop, "resize_size": round(preset.resize_size[0] / 2)}
    assert protocol["reference_shape"] == {"crop_size": preset.crop_size[0], "resize_size": preset.resize_size[0]}
