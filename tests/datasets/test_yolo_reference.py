"""YOLO on COCO scores what Ultralytics' val gives: the harness's predictions, through the dataset and the runner,
against Ultralytics' own val pipeline run in the test on the same files and the same network: its YOLODataset
(`load_image`, `LetterBox`), and its DetectionValidator's preprocessing, NMS (`postprocess`) and mapping back to the
original image (`scale_preds`, `pred_to_json`), on images of three aspect ratios.
"""

import json
from pathlib import Path

import pytest
import torch
from image_folders import coco_folder

from aio_examples.datasets import open_dataset
from aio_examples.machine.threads import ThreadChoice
from aio_examples.measurement.runner import RunRequest, run
from aio_examples.measurement.timing import StopRule
from aio_examples.models import get_model
from aio_examples.models.yolo import CONFIDENCE, IOU, MAX_DETECTIONS, load_ultralytics

SHAPE = {"input_size": 320}


def _validator(save_dir: Path, side: int):
    load_ultralytics()              # Ultralytics imported the harness's way (offline, its settings in the cache)
    from ultralytics.data.converter import coco80_to_coco91_class
    from ultralytics.models.yolo.detect import DetectionValidator

    validator = DetectionValidator(save_dir=save_dir, args={"imgsz": side, "batch": 1})
    # what its __call__ sets up before the first batch, for a model without its own NMS, on COCO
    validator.device, validator.end2end, validator.jdict = torch.device("cpu"), False, []
    validator.class_map = coco80_to_coco91_class()
    return validator


def _ultralytics_val(network, folder: Path, side: int, save_dir: Path) -> list[dict]:
    """Ultralytics' val of `network` on the images of `folder`, one image a batch: its COCO results."""
    from ultralytics.data.build import build_yolo_dataset

    validator = _validator(save_dir, side)
    data = {"names": {i: str(i) for i in range(80)}, "nc": 80, "channels": 3}
    dataset = build_yolo_dataset(validator.args, str(folder), 1, data, mode="val", stride=32)
    for i in range(len(dataset)):
        batch = validator.preprocess(dataset.collate_fn([dataset[i]]))
        with torch.no_grad():
            [prediction] = validator.postprocess(network(batch["img"]))
        image = validator._prepare_batch(0, batch)
        validator.pred_to_json(validator.scale_preds(prediction, image), image)
    return validator.jdict


def test_the_nms_settings_are_ultralytics_val_defaults(tmp_path):
    validator = _validator(tmp_path, 640)
    assert (CONFIDENCE, IOU, MAX_DETECTIONS) == (validator.args.conf, validator.args.iou, validator.args.max_det)
    assert not validator.args.rect and not validator.args.agnostic_nms     # square letterbox, per-class NMS


def test_yolo_scores_what_ultralytics_val_gives(tmp_path):
    folder = tmp_path / "coco"
    folder.mkdir()
    anno = coco_folder(folder)
    spec = get_model("yolo_v8n")
    dataset = open_dataset("coco", str(folder), str(anno))
    [r] = run(RunRequest(spec, ["eager"], "fp32", 2, ThreadChoice(2, "--threads"), SHAPE,
                         rule=StopRule(timeout_s=0.2), dataset=dataset), tmp_path / "out")
    assert r.status == "ok", r.reason
    ours = json.loads(Path(r.accuracy["predictions"]).read_text())
    reference = _ultralytics_val(spec.build(shape=SHAPE), folder, SHAPE["input_size"], tmp_path / "val")
    assert len({d["image_id"] for d in reference}) == 3 and len(reference) > 30
    # every detection: the same class and score, the box to the rounding of the two results files (and float32
    # against float64 arithmetic mapping it back). Compared in (image, class, score) order: random weights give
    # near-equal scores whose order a batch of 2 and one of 1 may swap in the last bit
    assert len(ours) == len(reference)

    def order(d):
        return d["image_id"], d["category_id"], round(d["score"], 4)

    for mine, theirs in zip(sorted(ours, key=order), sorted(reference, key=order), strict=True):
        assert (mine["image_id"], mine["category_id"]) == (theirs["image_id"], theirs["category_id"])
        assert mine["score"] == pytest.approx(theirs["score"], abs=1e-5)
        assert mine["bbox"] == pytest.approx(theirs["bbox"], abs=0.01)
    protocol = r.accuracy["protocol"]
    assert protocol["protocol"] == "reference" and "Ultralytics' val" in protocol["follows"]
    assert protocol["shape"] == SHAPE
    assert protocol["reference_shape"] == {"input_size": load_ultralytics().defaults.imgsz}
