"""YOLOv8 from Ultralytics' model YAML: the network as exported, its NMS post-processing, and COCO scoring."""

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from aio_examples.core.errors import UsageError
from aio_examples.datasets import open_dataset
from aio_examples.machine.threads import ThreadChoice
from aio_examples.measurement.output_check import flatten
from aio_examples.measurement.runner import RunRequest, run
from aio_examples.measurement.timing import StopRule
from aio_examples.models import get_model
from aio_examples.models.yolo import CONFIDENCE, MAX_DETECTIONS, load_ultralytics

SHAPE = {"input_size": 128}
ANCHORS = 16 * 16 + 8 * 8 + 4 * 4           # strides 8, 16 and 32 at 128 x 128


@pytest.fixture(scope="module")
def yolo():
    """yolo_v8n at 128 x 128, built once: (spec, module, example inputs, raw predictions)."""
    spec = get_model("yolo_v8n")
    module = spec.build(shape=SHAPE)
    inputs = spec.example_inputs(2, SHAPE, module)
    with torch.no_grad():
        return spec, module, inputs, module(*inputs)


def _predictions(boxes_xywh, classes, scores, anchors=ANCHORS) -> torch.Tensor:
    """Raw predictions (1, 84, anchors) holding the given boxes (centre x, y, width, height) at the given class
    scores, every other anchor scoring nothing."""
    raw = torch.zeros(1, 84, anchors)
    for i, (box, cls, score) in enumerate(zip(boxes_xywh, classes, scores, strict=True)):
        raw[0, :4, i] = torch.tensor(box, dtype=torch.float32)
        raw[0, 4 + cls, i] = score
    return raw


def test_the_network_is_built_the_same_every_time_fused_and_returns_raw_predictions(yolo):
    spec, module, inputs, raw = yolo
    again = spec.build(shape=SHAPE)
    assert all(torch.equal(a, b) for a, b in zip(module.state_dict().values(), again.state_dict().values(),
                                                  strict=True))
    with torch.no_grad():
        assert torch.equal(again(*inputs), raw)
    assert raw.shape == (2, 84, ANCHORS)
    assert not any(isinstance(m, torch.nn.BatchNorm2d) for m in module.modules())     # fused, as exported
    assert not module.training and not any(p.requires_grad for p in module.parameters())
    assert spec.random_weights == "random-unit-variance"


def test_random_weights_give_well_defined_detections_from_any_backends_form(yolo):
    spec, _, _, raw = yolo
    detected = spec.postprocess(raw)
    coco_ids = set(load_ultralytics().coco_ids.tolist())
    assert len(detected) == 2
    for image in detected:
        boxes, labels, scores = image["boxes"], image["labels"], image["scores"]
        assert 0 < len(boxes) <= MAX_DETECTIONS and boxes.shape == (len(scores), 4) == (len(labels), 4)
        assert torch.isfinite(boxes).all() and (boxes[:, 2] > boxes[:, 0]).all() and (boxes[:, 3] > boxes[:, 1]).all()
        assert (scores > CONFIDENCE).all() and (scores[:-1] >= scores[1:]).all()
        assert set(labels.tolist()) <= coco_ids and labels.dtype == torch.int64
    # ONNX Runtime and OpenVINO hand back a list holding one numpy array: the same detections
    again = spec.postprocess([raw.numpy()])
    assert all(torch.equal(a[k], b[k]) for a, b in zip(detected, again, strict=True) for k in a)


def test_nms_keeps_one_of_overlapping_boxes_per_class_and_at_most_the_maximum():
    spec = get_model("yolo_v8n")
    # two near-identical boxes of class 2 (one kept), the same box in class 5 (kept: NMS is per class), one
    # box below the confidence threshold (dropped)
    raw = _predictions([(50, 50, 40, 40), (51, 50, 40, 40), (50, 50, 40, 40), (100, 100, 10, 10)],
                       [2, 2, 5, 7], [0.9, 0.8, 0.7, CONFIDENCE / 2])
    [image] = spec.postprocess(raw)
    assert image["labels"].tolist() == [3, 6] and image["scores"].tolist() == pytest.approx([0.9, 0.7])
    assert image["boxes"][0].tolist() == pytest.approx([30, 30, 70, 70])
    # 8400 separate boxes (a grid, none overlapping), each above the threshold in every class: the maximum
    # number kept, the highest scores of all
    gen = torch.Generator().manual_seed(0)
    many = torch.zeros(1, 84, 8400)
    many[0, 0], many[0, 1] = torch.arange(8400) % 100 * 70.0, torch.arange(8400) // 100 * 70.0
    many[0, 2:4] = 5
    many[0, 4:] = torch.rand(80, 8400, generator=gen) * 0.5 + 0.01
    [image] = spec.postprocess(many)
    assert len(image["boxes"]) == MAX_DETECTIONS
    assert torch.allclose(image["scores"], torch.topk(many[0, 4:].flatten(), MAX_DETECTIONS).values)
    # nothing above the threshold: empty detections of the right shapes, which the output checks read
    [image] = spec.postprocess(torch.zeros(1, 84, 8400))
    assert image["boxes"].shape == (0, 4) and image["labels"].shape == image["scores"].shape == (0,)


def test_yolo_classes_map_to_coco_category_ids():
    spec = get_model("yolo_v8n")
    # person, car, dog, toothbrush: YOLO's classes 0, 2, 16, 79 are COCO's ids 1, 3, 18, 90
    raw = _predictions([(20, 20, 10, 10), (60, 20, 10, 10), (20, 60, 10, 10), (60, 60, 10, 10)],
                       [0, 2, 16, 79], [0.9, 0.8, 0.7, 0.6])
    [image] = spec.postprocess(raw)
    assert image["labels"].tolist() == [1, 3, 18, 90]
    # every class: Ultralytics' COCO names are torchvision's COCO category names at the mapped ids
    from ultralytics.utils import ROOT, YAML

    from aio_examples.compat.torchvision_shim import ensure_torchvision

    names = YAML.load(ROOT / "cfg" / "datasets" / "coco.yaml")["names"]
    categories = ensure_torchvision().models.detection.FasterRCNN_MobileNet_V3_Large_FPN_Weights.COCO_V1.meta[
        "categories"]
    ids = load_ultralytics().coco_ids.tolist()
    assert len(ids) == len(set(ids)) == 80 and [categories[i] for i in ids] == [names[i] for i in range(80)]


def test_input_sizes_must_be_multiples_of_the_largest_stride():
    spec = get_model("yolo_v8s")
    assert spec.shape() == {"input_size": 640} and spec.shape(input_size=96) == {"input_size": 96}
    with pytest.raises(UsageError, match="--input-size 100 .* multiple of 32") as info:
        spec.shape(input_size=100)
    assert "\n" not in str(info.value)


def _coco(folder: Path, size: tuple, boxes: list, pixels: np.ndarray | None = None) -> Path:
    """A COCO folder of one image of `size` (width, height), plain or `pixels`, with `boxes` (x, y, w, h, category
    id)."""
    (Image.fromarray(pixels) if pixels is not None else Image.new("RGB", size, (30, 90, 20))).save(folder / "1.png")
    annotations = [{"id": i, "image_id": 1, "category_id": c, "bbox": [x, y, w, h], "area": w * h, "iscrowd": 0}
                   for i, (x, y, w, h, c) in enumerate(boxes, 1)]
    anno = folder / "instances.json"
    anno.write_text(json.dumps({"images": [{"id": 1, "file_name": "1.png", "width": size[0], "height": size[1]}],
                                "annotations": annotations,
                                "categories": [{"id": c, "name": str(c)} for c in {b[4] for b in boxes}]}))
    return anno


def test_a_letterboxed_image_s_predictions_map_back_to_it_and_score_as_coco_boxes(tmp_path):
    anno = _coco(tmp_path, (200, 100), [(20, 10, 100, 50, 3)])           # a car
    ds = open_dataset("coco", str(tmp_path), str(anno))
    spec = get_model("yolo_v8n")
    [batch] = ds.batches(spec, 1, SHAPE, None)
    image = batch.inputs[0][0]
    gain = 128 / 200                 # the image fills the middle 64 rows of the 128 x 128 square, grey around
    [(image_id, placement)] = batch.targets
    assert image.shape == (3, 128, 128) and image_id == 1 and placement == (1 / gain, 1 / gain, 0, 32)
    grey = torch.tensor(114 / 255)
    assert torch.allclose(image[:, :32], grey) and torch.allclose(image[:, 96:], grey)
    assert not torch.allclose(image[:, 32:96], grey)
    # the car where the letterboxed image has it (YOLO's class 2), and a person reaching into the padding
    raw = _predictions([((20 + 50) * gain, 32 + (10 + 25) * gain, 100 * gain, 50 * gain), (30, 92, 20, 30)], [2, 0],
                       [0.9, 0.5])
    evaluation = ds.evaluation(spec, None)
    evaluation.add(batch, flatten(spec.postprocess(raw)))
    car, person = evaluation.predictions()
    assert car["category_id"] == 3 and car["bbox"] == pytest.approx([20, 10, 100, 50], abs=0.01)
    assert person["category_id"] == 1 and person["bbox"][1] + person["bbox"][3] == pytest.approx(100)  # clipped
    assert evaluation.metrics()["ap50"] == pytest.approx(1.0)


def test_yolo_on_coco_through_the_runner_writes_results_pycocotools_rescores(yolo, tmp_path):
    # an image the random network finds boxes in (most images it finds none in): its own first example input
    spec, _, inputs, _ = yolo
    pixels = (inputs[0][0].permute(1, 2, 0) * 255).round().to(torch.uint8).numpy()
    anno = _coco(tmp_path, (128, 128), [(20, 10, 60, 50, 1), (60, 40, 50, 70, 18)], pixels)
    ds = open_dataset("coco", str(tmp_path), str(anno))
    [r] = run(RunRequest(spec, ["eager"], "fp32", 1, ThreadChoice(1, "--threads"), SHAPE,
                         rule=StopRule(timeout_s=0.2), dataset=ds), tmp_path / "out")
    assert r.status == "ok" and r.accuracy["samples"] == 1 and set(r.accuracy["metrics"]) == {"map", "ap50"}
    results = json.loads(Path(r.accuracy["predictions"]).read_text())
    assert 0 < len(results) <= MAX_DETECTIONS
    assert {d["category_id"] for d in results} <= set(load_ultralytics().coco_ids.tolist())
    assert all(0 <= x and 0 <= y and x + w <= 128.01 and y + h <= 128.01 for x, y, w, h in (d["bbox"] for d in results))
    from pycocotools.coco import COCO
    from pycocotools.cocoeval import COCOeval

    gt = COCO(str(anno))
    direct = COCOeval(gt, gt.loadRes(results), "bbox")
    direct.evaluate(), direct.accumulate(), direct.summarize()
    assert r.accuracy["metrics"]["map"] == pytest.approx(max(direct.stats[0], 0.0), abs=1e-6)


@pytest.mark.slow
@pytest.mark.parametrize("backend", ["onnxruntime", "openvino", "inductor"])
def test_other_backends_run_the_network_to_the_same_detections(backend, tmp_path):
    """With random weights the output check reports box agreement without judging it: judged here at fp32."""
    [_, r] = run(RunRequest(get_model("yolo_v8n"), ["eager", backend], "fp32", 2, ThreadChoice(1, "--threads"),
                            SHAPE, rule=StopRule(timeout_s=0.2)), tmp_path)
    assert r.status == "ok", r.reason
    assert r.check["passed"] and r.check["agreement"]["boxes_matched"] >= 0.99
    assert r.check["agreement"]["reference_boxes"] >= 20          # not an empty comparison
