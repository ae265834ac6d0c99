"""The metrics against hand-computed values (SQuAD's normalisation: tests/datasets/test_nlp_datasets.py)."""

import json

import numpy as np
import pytest

from aio_examples.datasets import metrics


def test_top_k_by_hand_with_ties_to_the_lower_class():
    scores = np.array([[0.1, 0.7, 0.2],       # label 1: top-1
                       [0.5, 0.5, 0.0],       # label 1 ties with 0: ranked second, as torch.topk
                       [0.6, 0.3, 0.1]])      # label 2: last
    best = metrics.ranked(scores, 2)
    assert best.tolist() == [[1, 2], [0, 1], [0, 1]]
    assert metrics.top_k(best, [1, 1, 2], ks=(1, 2, 5)) == {"top_1": 1 / 3, "top_2": 2 / 3}   # no room for 5


def test_accuracy_by_hand():
    assert metrics.accuracy([1, 0, 1, 1], [1, 1, 1, 0]) == {"accuracy": 0.5}


def test_coco_map_is_one_for_perfect_boxes_and_falls_with_a_poor_one(tmp_path):
    from pycocotools.coco import COCO

    boxes = {1: [10, 10, 50, 40], 2: [100, 60, 30, 30]}
    (tmp_path / "gt.json").write_text(json.dumps({
        "images": [{"id": i, "width": 200, "height": 200, "file_name": f"{i}.jpg"} for i in boxes],
        "annotations": [{"id": i, "image_id": i, "category_id": 7, "bbox": b, "area": b[2] * b[3], "iscrowd": 0}
                        for i, b in boxes.items()],
        "categories": [{"id": 7, "name": "thing"}]}))
    gt = COCO(str(tmp_path / "gt.json"))
    perfect = [{"image_id": i, "category_id": 7, "bbox": b, "score": 0.9} for i, b in boxes.items()]
    assert metrics.coco_detection(gt, perfect, list(boxes)) == {"map": pytest.approx(1.0), "ap50": pytest.approx(1.0)}
    wrong_class = [{**d, "category_id": 8} for d in perfect]
    gt.dataset["categories"].append({"id": 8, "name": "other"})
    gt.createIndex()
    assert metrics.coco_detection(gt, wrong_class, list(boxes)) == {"map": 0.0, "ap50": 0.0}
    # one box found exactly, the other not at all: half the boxes at every IoU threshold
    assert metrics.coco_detection(gt, perfect[:1], list(boxes))["ap50"] == pytest.approx(0.5, abs=0.01)
