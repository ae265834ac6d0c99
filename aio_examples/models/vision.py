"""Image classification and object detection models from torchvision's architecture code."""

from dataclasses import dataclass, field

import numpy as np
import torch
from torch import nn

from ..compat.torchvision_shim import ensure_torchvision
from ..core.errors import UsageError
from .base import ModelSpec, unit_variance


def _images(batch_size: int, size: int, seed: int = 1234) -> torch.Tensor:
    """Fixed pseudo-random images in [0, 1): the same in every process."""
    gen = torch.Generator().manual_seed(seed)
    return torch.rand(batch_size, 3, size, size, generator=gen)


@dataclass(frozen=True)
class Classifier(ModelSpec):
    """A torchvision classification model, built by `builder` name with random weights."""

    builder: str = ""
    builder_kwargs: dict = field(default_factory=dict)
    min_size: int = 32
    weights_name: str = "DEFAULT"     # the torchvision weights whose evaluation transforms real images get

    def smoke_shape(self):
        return {"input_size": max(64, self.min_size)}

    def check_shape(self, shape):
        if shape["input_size"] < self.min_size:
            raise UsageError(f"--input-size {shape['input_size']} is too small for {self.name}; "
                             f"accepted: >= {self.min_size}")

    def _build_module(self, shape):
        tv = ensure_torchvision()
        return getattr(tv.models, self.builder)(weights=None, **self.builder_kwargs)

    def _weights_target(self, module):
        return module

    random_weights = "random-unit-variance"

    def _initialise(self, module, shape):
        unit_variance(module, (_images(2, shape["input_size"], seed=7),))

    def example_inputs(self, batch_size, shape, module):
        return (_images(batch_size, shape["input_size"]),)

    def calibration_inputs(self, batch_size, shape, module, n):
        return [(_images(batch_size, shape["input_size"], seed=99 + i),) for i in range(n)]

    def preprocess(self, shape: dict):
        """PIL image -> input tensor: torchvision's own evaluation transforms for this architecture's weights
        (resize, centre crop, normalise; the weights enum carries them, nothing is downloaded), with the crop
        at --input-size and the resize scaled with it."""
        tv = ensure_torchvision()
        preset = getattr(tv.models.get_model_weights(self.builder), self.weights_name).transforms()
        crop = shape["input_size"]
        resize = round(crop * preset.resize_size[0] / preset.crop_size[0])
        transform = type(preset)(crop_size=crop, resize_size=resize, mean=preset.mean, std=preset.std,
                                 interpolation=preset.interpolation, antialias=preset.antialias)
        return lambda image: transform(image.convert("RGB"))


class DetectionModel(nn.Module):
    """Batched image tensor in, torchvision's list of {boxes, labels, scores} out."""

    jit_mode = "script"   # data-dependent control flow: tracing would freeze one path

    def __init__(self, model: nn.Module):
        super().__init__()
        self.model = model

    def forward(self, images: torch.Tensor) -> list[dict[str, torch.Tensor]]:
        batch = list(images.unbind(0))
        if torch.jit.is_scripting():
            return self.model(batch)[1]      # scripted detection models return (losses, detections)
        return self.model(batch)


@dataclass(frozen=True)
class Detector(ModelSpec):
    """A torchvision detection model; `resizes` says whether --input-size sets its internal resize."""

    builder: str = ""
    resizes: bool = True

    def smoke_shape(self):
        return {"input_size": 128}

    def check_shape(self, shape):
        if shape["input_size"] < 64:
            raise UsageError(f"--input-size {shape['input_size']} is too small for {self.name}; accepted: >= 64")

    def _build_module(self, shape):
        tv = ensure_torchvision()
        kwargs = {"min_size": shape["input_size"], "max_size": shape["input_size"]} if self.resizes else {}
        model = getattr(tv.models.detection, self.builder)(weights=None, weights_backbone=None, **kwargs)
        return DetectionModel(model)

    def example_inputs(self, batch_size, shape, module):
        return (_images(batch_size, shape["input_size"]),)

    def calibration_inputs(self, batch_size, shape, module, n):
        return [(_images(batch_size, shape["input_size"], seed=99 + i),) for i in range(n)]

    def preprocess(self, shape: dict):
        """PIL image -> (input tensor, (x, y) scale back to the original image): torchvision's detection
        preset (a float tensor in [0, 1]; the model normalises inside) at the fixed square input size."""
        tv = ensure_torchvision()
        side = shape["input_size"]

        def transform(image):
            width, height = image.size
            resized = image.convert("RGB").resize((side, side), resample=2)     # bilinear
            return tv.transforms.functional.to_tensor(resized), (width / side, height / side)
        return transform


def detections(arrays: list) -> list[tuple]:
    """A detection model's flattened outputs (numpy arrays) as one (boxes N x 4, labels, scores) per image.

    torchvision gives a {boxes, labels, scores} dict per image; flattened by any backend it is one triple
    per image in the model's own key order, told apart by kind (boxes are N x 4, labels are integers).
    """
    out = []
    for i in range(0, len(arrays) - len(arrays) % 3, 3):
        triple = arrays[i:i + 3]
        boxes = next(a for a in triple if a.ndim == 2)
        labels = next(a for a in triple if a.ndim == 1 and not np.issubdtype(a.dtype, np.floating))
        scores = next(a for a in triple if a.ndim == 1 and np.issubdtype(a.dtype, np.floating))
        out.append((boxes.astype(np.float64), labels, scores))
    return out
