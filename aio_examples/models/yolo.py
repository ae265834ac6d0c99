"""YOLO object detection: Ultralytics' own YOLOv8 architecture, built from its model YAML with random weights.

The backend graph and the timed pass are the network alone: images (batch, 3, size, size) in [0, 1] in, its
raw predictions (batch, 4 + 80, anchors) out (box centre, width and height in input pixels, then the 80 class
scores; 8400 anchors at 640), the form Ultralytics exports by default. Ultralytics' non-maximum suppression is
post-processing (`Yolo.postprocess`): it turns any backend's predictions into one {boxes, labels, scores} per
image, the form of the torchvision detectors, for output checks and COCO scoring. Labels are COCO category ids
(Ultralytics' 80 class indices mapped to COCO's 91 ids), as the torchvision detectors give them.
"""

import functools
import math
import os
import warnings
from dataclasses import dataclass
from types import SimpleNamespace

import numpy as np
import torch
from torch import nn

from ..compat.torchvision_shim import ensure_torchvision
from ..core.errors import UsageError
from ..core.paths import cache_dir
from .base import ModelSpec, unit_variance
from .vision import Placement, _images

STRIDE = 32                 # the largest stride of YOLOv8's heads: the input side must be a multiple of it
# Ultralytics' validation settings, those of its published COCO mAP (its validator's conf when none is given, its
# default.yaml's iou and max_det; tests/datasets/test_yolo_reference.py checks them against the installed release):
# every class a box scores above CONFIDENCE for is a candidate (multi-label), class-aware NMS at IoU IOU, at most
# MAX_DETECTIONS boxes per image
CONFIDENCE, IOU, MAX_DETECTIONS = 0.001, 0.7, 300


@functools.cache
def load_ultralytics() -> SimpleNamespace:
    """The parts of Ultralytics this zoo uses, imported after torchvision (ultralytics imports it) and without its
    side effects where they can be avoided: no network check (YOLO_OFFLINE), its settings file in the harness's
    cache rather than the user's home (YOLO_CONFIG_DIR), no banner (YOLO_VERBOSE); the warning filters and print
    options it sets on import are put back. A user's own values of those variables are kept."""
    ensure_torchvision()
    os.environ.setdefault("YOLO_OFFLINE", "1")
    os.environ.setdefault("YOLO_CONFIG_DIR", str(cache_dir("ultralytics")))
    os.environ.setdefault("YOLO_VERBOSE", "False")
    numpy_print, torch_print = np.get_printoptions(), dict(vars(torch._tensor_str.PRINT_OPTS))
    with warnings.catch_warnings():
        from ultralytics import __version__
        from ultralytics.cfg import DEFAULT_CFG
        from ultralytics.data.augment import LetterBox
        from ultralytics.data.converter import coco80_to_coco91_class
        from ultralytics.nn.modules.block import C2f
        from ultralytics.nn.modules.head import Detect
        from ultralytics.nn.tasks import DetectionModel
        from ultralytics.utils.nms import non_max_suppression
    np.set_printoptions(**numpy_print)
    torch.set_printoptions(**torch_print)
    return SimpleNamespace(DetectionModel=DetectionModel, Detect=Detect, C2f=C2f, LetterBox=LetterBox,
                           non_max_suppression=non_max_suppression, defaults=DEFAULT_CFG, version=__version__,
                           coco_ids=torch.tensor(coco80_to_coco91_class(), dtype=torch.int64))


class YoloNetwork(nn.Module):
    """An Ultralytics DetectionModel in the form Ultralytics exports it: images in, raw predictions out."""

    def __init__(self, model: nn.Module):
        super().__init__()
        self.model = model

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        return self.model(images)


@dataclass(frozen=True)
class Yolo(ModelSpec):
    """An Ultralytics YOLO detector built from its model YAML (`config`, e.g. yolov8n.yaml: the scale letter picks
    the width and depth), 80 COCO classes."""

    config: str = ""

    def smoke_shape(self):
        return {"input_size": 128}

    def check_shape(self, shape):
        side = shape["input_size"]
        if side % STRIDE:
            raise UsageError(f"--input-size {side} is invalid for {self.name}; accepted: a multiple of {STRIDE} "
                             f"(YOLO's largest stride), e.g. {self.default_shape['input_size']}")

    def _build_module(self, shape):
        return YoloNetwork(load_ultralytics().DetectionModel(self.config, nc=80, verbose=False))

    random_weights = "random-unit-variance"

    def _initialise(self, module, shape):
        """Ultralytics' initialisation leaves every class score near its prior (1e-5..1e-4): no box would pass the
        0.001 threshold and every output check would compare empty detections. Every layer is rescaled to unit
        variance on an image of the input size (models/base.py; the DFL's fixed integral weights stay), then the
        head's biases are set back to Ultralytics' own (`Detect.bias_init`): scores spread around the prior, up to
        a few hundred distinct boxes per image at 640 (fewer on smaller inputs, whose anchors are fewer)."""
        unit_variance(module, (_images(1, shape["input_size"], seed=7),))
        module.model.model[-1].bias_init()

    def build(self, weights=None, model_dir=None, shape=None):
        """The network as Ultralytics exports it: batch norms fused into the convolutions, the head returning its
        predictions alone, with the anchors made for the input size."""
        ul = load_ultralytics()
        module = super().build(weights, model_dir, shape)
        module.requires_grad_(False)
        module.model.fuse(verbose=False)
        for layer in module.modules():
            if isinstance(layer, ul.Detect):
                layer.export, layer.dynamic = True, False
            elif isinstance(layer, ul.C2f):
                layer.forward = layer.forward_split     # what Ultralytics exports: split, not chunk
        side = (shape or self.default_shape)["input_size"]
        with torch.no_grad():
            module(torch.zeros(1, 3, side, side))       # a dry run, as Ultralytics' exporter makes
        return module

    def example_inputs(self, batch_size, shape, module):
        return (_images(batch_size, shape["input_size"]),)

    def calibration_inputs(self, batch_size, shape, module, n):
        return [(_images(batch_size, shape["input_size"], seed=99 + i),) for i in range(n)]

    def postprocess(self, output):
        """Raw predictions (batch, 84, anchors) from any backend (a tensor, or a list holding one array) -> one
        {boxes (x1, y1, x2, y2 in input pixels), labels (COCO ids), scores} per image, by Ultralytics' own NMS.
        No time limit (Ultralytics stops after 2 s + 50 ms per image): the result depends on the predictions
        alone."""
        ul = load_ultralytics()
        raw = torch.as_tensor(output[0] if isinstance(output, (list, tuple)) else output).float()
        kept = ul.non_max_suppression(raw, CONFIDENCE, IOU, multi_label=True, max_det=MAX_DETECTIONS,
                                      max_time_img=float("inf"))
        return [{"boxes": k[:, :4], "labels": ul.coco_ids[k[:, 5].long()], "scores": k[:, 4]} for k in kept]

    def preprocess(self, shape: dict):
        """PIL image -> (input tensor, Placement): Ultralytics' val (its dataset's `load_image`, then its `LetterBox`
        at imgsz = --input-size): the long side resized to the input size (the other side rounded up, bilinear),
        then padded with grey to the square, the image centred; RGB in [0, 1]. Boxes map back as its
        `scale_boxes` maps them: the padding taken off, then the resize undone."""
        side = shape["input_size"]
        letterbox = load_ultralytics().LetterBox(new_shape=side, scaleup=False)

        def transform(image):
            import cv2

            pixels = np.asarray(image.convert("RGB"))
            height, width = pixels.shape[:2]
            ratio = side / max(height, width)
            if ratio != 1:
                size = (min(math.ceil(width * ratio), side), min(math.ceil(height * ratio), side))
                pixels = cv2.resize(pixels, size, interpolation=cv2.INTER_LINEAR)
            params = letterbox.get_params({"img": pixels})
            boxed = letterbox.apply_image({"img": pixels}, params)["img"]
            h, w = params["new_unpad"][1], params["new_unpad"][0]
            tensor = torch.from_numpy(np.ascontiguousarray(boxed)).permute(2, 0, 1).float() / 255
            return tensor, Placement(width / w, height / h, params["left"], params["top"])
        return transform

    def reference_protocol(self, shape):
        scored = {"input_size": shape["input_size"]}
        reference = {"input_size": load_ultralytics().defaults.imgsz}
        return {"protocol": "reference",
                "follows": f"Ultralytics' val (ultralytics {load_ultralytics().version}): load_image and LetterBox "
                           f"at imgsz (square, centred, grey padding), non_max_suppression at conf {CONFIDENCE}, "
                           f"iou {IOU}, multi-label, max_det {MAX_DETECTIONS}; boxes mapped back by scale_boxes",
                "shape": scored, **({"reference_shape": reference} if scored != reference else {})}
