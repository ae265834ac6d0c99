"""torchvision's detectors on COCO score what torchvision's reference evaluation gives: the harness's predictions,
through the dataset and the runner, against the builder's own model called as `model(images)` in the test on the
same files (the weights' preset, nothing else), images of three aspect ratios, batched as torchvision batches them.

The zoo's random weights give every image the same uniform scores; here every layer is rescaled to unit variance on
the dataset's images first (models/base.py), so boxes, labels and scores depend on the image.
"""

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from image_folders import coco_folder
from PIL import Image

from aio_examples.compat.torchvision_shim import ensure_torchvision
from aio_examples.datasets import open_dataset
from aio_examples.machine.threads import ThreadChoice
from aio_examples.measurement.runner import RunRequest, run
from aio_examples.measurement.timing import StopRule
from aio_examples.models import get_model, vision
from aio_examples.models.base import unit_variance

BATCH = 2           # the first batch holds a landscape and a portrait image, padded to one size together


@pytest.fixture(scope="module")
def coco(tmp_path_factory):
    folder = tmp_path_factory.mktemp("coco")
    return folder, coco_folder(folder)


def _input_dependent_weights(spec, shape, dataset, path: Path) -> Path:
    """A state dict of `spec`'s model whose detections depend on the image (module docstring)."""
    module = spec.build(shape=shape)
    unit_variance(module, next(dataset.batches(spec, len(dataset.samples), shape, module)).inputs)
    head = getattr(module.model, "head", None)
    if head is not None and hasattr(head.classification_head, "cls_logits"):
        # RetinaNet's class bias, its prior of 1% foreground rescaled, keeps every score under its threshold:
        # sigmoid(-3) is about that threshold, so the image's strongest logits pass, unsaturated; and box deltas of
        # unit variance would throw most boxes out of the image, clipped to nothing
        with torch.no_grad():
            head.classification_head.cls_logits.bias.fill_(-3.0)
            head.regression_head.bbox_reg.weight.mul_(0.1)
            head.regression_head.bbox_reg.bias.mul_(0.1)
    torch.save(module.model.state_dict(), path)
    return path


def _torchvision(spec, weights: Path, files: list, **builder_kwargs) -> list[dict]:
    """The reference: the builder's model with `weights`, called on the weights' preset of each file, BATCH at a
    time, as torchvision's reference evaluation calls it. The last batch is filled up with its last image, as the
    harness fills it (the same padded size: only float rounding would differ with a batch of one)."""
    tv = ensure_torchvision()
    model = getattr(tv.models.detection, spec.builder)(weights=None, weights_backbone=None, **builder_kwargs).eval()
    model.load_state_dict(torch.load(weights, weights_only=True))
    preset = tv.models.get_model_weights(spec.builder).DEFAULT.transforms()
    images = [preset(Image.open(f).convert("RGB")) for f in files]
    found = []
    with torch.no_grad():
        for start in range(0, len(images), BATCH):
            chunk = images[start:start + BATCH]
            found += model(chunk + chunk[-1:] * (BATCH - len(chunk)))[:len(chunk)]
    return found


def _as_coco(detections: dict, image_id: int) -> list[dict]:
    x1, y1, x2, y2 = detections["boxes"].double().unbind(1)
    return [{"image_id": image_id, "category_id": int(c), "score": float(s), "bbox": [a, b, w, h]}
            for c, s, a, b, w, h in zip(detections["labels"], detections["scores"], x1.tolist(), y1.tolist(),
                                        (x2 - x1).tolist(), (y2 - y1).tolist(), strict=True)]


def _assert_same(predictions: list[dict], reference: list[dict], score_tol: float, box_tol: float, share: float):
    """At least `share` of the reference's detections, in its order, found among `predictions` (the same image and
    label, the score and box within the tolerances); and as many detections on each side."""
    assert len(predictions) == len(reference) > 0
    unused = list(predictions)
    for ref in reference:
        match = next((p for p in unused if p["image_id"] == ref["image_id"] and p["category_id"] == ref["category_id"]
                      and abs(p["score"] - ref["score"]) <= score_tol
                      and np.abs(np.subtract(p["bbox"], ref["bbox"])).max() <= box_tol), None)
        if match is not None:
            unused.remove(match)
    assert len(predictions) - len(unused) >= share * len(reference), (len(unused), len(reference))


def _score(spec, shape, dataset, weights, backends, out) -> list:
    records = run(RunRequest(spec, backends, "fp32", BATCH, ThreadChoice(2, "--threads"), shape, weights=str(weights),
                             rule=StopRule(timeout_s=0.2), dataset=dataset), out)
    for r in records:
        assert r.status == "ok", (r.backend, r.reason)
    return records


def _predictions(record) -> list[dict]:
    return json.loads(Path(record.accuracy["predictions"]).read_text())


def _reference_detections(spec, weights, dataset, **builder_kwargs) -> list[dict]:
    found = _torchvision(spec, weights, [path for path, _ in dataset.samples], **builder_kwargs)
    return [d for (_, image_id), dets in zip(dataset.samples, found, strict=True) for d in _as_coco(dets, image_id)]


def _eager_matches_torchvision(name: str, shape: dict, coco, tmp_path, **builder_kwargs):
    """The eager record of `name` scored on the fixture, having given every detection torchvision's model gives
    (built with `builder_kwargs`), in order, to the rounding of the results file."""
    folder, anno = coco
    spec = get_model(name)
    dataset = open_dataset("coco", str(folder), str(anno))
    weights = _input_dependent_weights(spec, shape, dataset, tmp_path / "w.pt")
    reference = _reference_detections(spec, weights, dataset, **builder_kwargs)
    [eager] = _score(spec, shape, dataset, weights, ["eager"], tmp_path / "out")
    _assert_same(_predictions(eager), reference, score_tol=1e-5, box_tol=0.011, share=1.0)
    return eager


# The slow tier: a second detector on every backend shape; RetinaNet keeps the reference protocol in the default
# tier
@pytest.mark.slow
def test_fasterrcnn_scores_what_torchvision_gives_on_every_backend_shape(coco, tmp_path):
    """Eager cuts each image out of the padded batch; ONNX Runtime's graph, exported for one input shape, does the
    same inside the graph: both give torchvision's detections of the original images."""
    folder, anno = coco
    spec, shape = get_model("fasterrcnn_mobilenet_v3_fpn"), {"input_size": 320}
    dataset = open_dataset("coco", str(folder), str(anno))
    weights = _input_dependent_weights(spec, shape, dataset, tmp_path / "w.pt")
    reference = _reference_detections(spec, weights, dataset)
    assert len({d["image_id"] for d in reference}) == 3 and len({d["category_id"] for d in reference}) > 3
    eager, onnxruntime = _score(spec, shape, dataset, weights, ["eager", "onnxruntime"], tmp_path / "out")
    # the same computation as torchvision's: every detection, in order, to the rounding of the results file
    ours = _predictions(eager)
    assert [(p["image_id"], p["category_id"]) for p in ours] == [(d["image_id"], d["category_id"]) for d in reference]
    assert {key for p in ours for key in p} == {"image_id", "category_id", "score", "bbox"}     # COCO results
    # (the padded canvas may take other oneDNN kernels than torchvision's own batch: float sums in another order
    # move a few near-tied boxes of random weights past these tolerances, as seen in full-tier runs)
    _assert_same(ours, reference, score_tol=1e-5, box_tol=0.011, share=0.9)
    _assert_same(_predictions(onnxruntime), reference, score_tol=1e-3, box_tol=0.1, share=0.9)
    # the record says which protocol scored and at which shape, beside the timed square
    transform, protocol = vision.reference_transform(spec.builder), eager.accuracy["protocol"]
    assert protocol["protocol"] == "reference" and "GeneralizedRCNNTransform" in protocol["follows"]
    assert protocol["shape"] == {"min_size": transform.min_size[-1], "max_size": transform.max_size}
    assert protocol["timed_shape"] == {"input_size": 320} and onnxruntime.accuracy["protocol"] == protocol
    assert eager.input_shape == {"batch_size": BATCH, "input_size": 320}


def test_ssdlite_scores_what_torchvision_gives(coco, tmp_path):
    """SSDlite's reference resizes every image to its fixed square, whatever its aspect ratio."""
    eager = _eager_matches_torchvision("ssdlite320_mobilenet_v3", {"input_size": 320}, coco, tmp_path)
    assert "timed_shape" not in eager.accuracy["protocol"]      # its timed square is its reference's


def _small_retinanet(monkeypatch, min_size: int, max_size: int):
    """RetinaNet's reference transform at a smaller min_size and max_size: the same code path, a quicker test."""
    real = vision.reference_transform("retinanet_resnet50_fpn")
    small = type(real)(min_size, max_size, real.image_mean, real.image_std, real.size_divisible, real.fixed_size).eval()
    monkeypatch.setattr(vision, "reference_transform", lambda builder: small)


def test_retinanet_scores_what_torchvision_gives_at_a_smaller_size(coco, tmp_path, monkeypatch):
    _small_retinanet(monkeypatch, 224, 320)
    _eager_matches_torchvision("retinanet_resnet50_fpn", {"input_size": 128}, coco, tmp_path, min_size=224, max_size=320)


@pytest.mark.slow       # RetinaNet at its reference 800 x 1333 on two cores: about a minute
def test_retinanet_scores_what_torchvision_gives_at_its_reference_size(coco, tmp_path):
    _eager_matches_torchvision("retinanet_resnet50_fpn", {"input_size": 128}, coco, tmp_path)


def test_the_timed_passes_run_the_first_images_at_the_square_in_the_scoring_canvas(coco):
    """One input shape for every batch, timed or scored: the timed square and the reference's largest image fit."""
    folder, anno = coco
    spec = get_model("fasterrcnn_mobilenet_v3_fpn")
    dataset = open_dataset("coco", str(folder), str(anno))
    timed = dataset.example_inputs(spec, BATCH, {"input_size": 256}, None)
    [first, last] = dataset.batches(spec, BATCH, {"input_size": 256}, None)
    transform = vision.reference_transform(spec.builder)
    side = -(-transform.max_size // 32) * 32
    assert timed[0].shape == first.inputs[0].shape == last.inputs[0].shape == (BATCH, 3, side, side)
    assert timed[1].tolist() == [[256, 256]] * BATCH
    # 640 x 480 and 480 x 640, their short side at min_size, their aspect ratio kept (to a pixel)
    (h1, w1), (h2, w2) = first.inputs[1].tolist()
    assert h1 == w2 == transform.min_size[-1] and w1 == h2 == int(640 * h1 / 480)
    assert not timed[0][:, :, 256:].any() and not timed[0][:, :, :, 256:].any()
    # a timed square larger than any reference image is the canvas
    assert dataset.example_inputs(spec, 1, {"input_size": 704}, None)[0].shape == (1, 3, 704, 704)


@pytest.mark.slow       # every backend prepares the model (inductor compiles again for each new image size)
def test_every_backend_scores_torchvision_s_detections(coco, tmp_path):
    folder, anno = coco
    spec, shape = get_model("fasterrcnn_mobilenet_v3_fpn"), {"input_size": 320}
    dataset = open_dataset("coco", str(folder), str(anno))
    weights = _input_dependent_weights(spec, shape, dataset, tmp_path / "w.pt")
    reference = _reference_detections(spec, weights, dataset)
    records = _score(spec, shape, dataset, weights, ["eager", "torchscript", "inductor", "onnxruntime", "openvino",
                                                     "aio"], tmp_path / "out")
    assert len(records) == 6
    for r in records:
        _assert_same(_predictions(r), reference, score_tol=1e-3, box_tol=0.1, share=0.9)
