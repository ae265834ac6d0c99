"""Image classification and object detection models from torchvision's architecture code."""

import functools
from dataclasses import dataclass, field
from typing import NamedTuple

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
        preset = self._preset()
        crop = shape["input_size"]
        transform = type(preset)(crop_size=crop, resize_size=self._resize(preset, crop), mean=preset.mean,
                                 std=preset.std, interpolation=preset.interpolation, antialias=preset.antialias)
        return lambda image: transform(image.convert("RGB"))

    def _preset(self):
        tv = ensure_torchvision()
        return getattr(tv.models.get_model_weights(self.builder), self.weights_name).transforms()

    @staticmethod
    def _resize(preset, crop: int) -> int:
        return round(crop * preset.resize_size[0] / preset.crop_size[0])

    def reference_protocol(self, shape):
        preset = self._preset()
        reference = {"crop_size": preset.crop_size[0], "resize_size": preset.resize_size[0]}
        scored = {"crop_size": shape["input_size"], "resize_size": self._resize(preset, shape["input_size"])}
        return {"protocol": "reference",
                "follows": f"torchvision's classification reference evaluation: the transforms of {self.builder}'s "
                           f"{self.weights_name} weights (resize: {preset.interpolation.value}"
                           f"{', antialiased' if preset.antialias else ''}; centre crop; normalisation)",
                "shape": scored, **({"reference_shape": reference} if scored != reference else {})}


class Placement(NamedTuple):
    """Where a preprocessed image sits in a detector's input: a box (x1, y1, x2, y2) in input pixels is
    ((x - left) * scale_x, (y - top) * scale_y) in the original image's."""

    scale_x: float
    scale_y: float
    left: float = 0.0
    top: float = 0.0

    def to_original(self, boxes: np.ndarray) -> np.ndarray:
        offset, scale = np.array([self.left, self.top] * 2), np.array([self.scale_x, self.scale_y] * 2)
        return (np.asarray(boxes, dtype=np.float64) - offset) * scale


@functools.cache
def reference_transform(builder: str):
    """The builder's own GeneralizedRCNNTransform in eval mode (its normalisation, and its resize: min_size and
    max_size, or a fixed size), built on the meta device: no weights are made."""
    tv = ensure_torchvision()
    with torch.device("meta"):
        model = getattr(tv.models.detection, builder)(weights=None, weights_backbone=None)
    return model.transform.eval()


@functools.cache
def _batching_transform() -> type:
    """GeneralizedRCNNTransform without its per-image steps (a class made once torchvision is imported)."""
    tv = ensure_torchvision()

    class BatchingTransform(tv.models.detection.transform.GeneralizedRCNNTransform):
        """A builder's transform whose normalisation and resize ran in preprocessing (Detector.preprocess): it
        pads a batch to a multiple of its stride, and boxes stay in the pixels of the images it is given."""

        def normalize(self, image: torch.Tensor) -> torch.Tensor:
            return image

        def resize(self, image: torch.Tensor, target: dict[str, torch.Tensor] | None = None
                   ) -> tuple[torch.Tensor, dict[str, torch.Tensor] | None]:
            return image, target

        def batch_images(self, images: list[torch.Tensor], size_divisible: int = 32) -> torch.Tensor:
            """torchvision's batching (zeros to the largest image's size, rounded up to a multiple of the stride),
            the rounding in integers: inductor compiles that for sizes that vary, not the float ceil."""
            if torch.jit.is_tracing():      # an ONNX export: torchvision's own way for it
                return self._onnx_batch_images(images, size_divisible)
            height, width = 0, 0
            for image in images:
                height, width = max(height, image.shape[1]), max(width, image.shape[2])
            height = (height + size_divisible - 1) // size_divisible * size_divisible
            width = (width + size_divisible - 1) // size_divisible * size_divisible
            batched = images[0].new_zeros([len(images), images[0].shape[0], height, width])
            for i, image in enumerate(images):
                batched[i, :, :image.shape[1], :image.shape[2]].copy_(image)
            return batched

    return BatchingTransform


class DetectionModel(nn.Module):
    """A torchvision detector taking its images as one tensor: images (batch, 3, H, W), each at the top-left and
    zero beyond it, and their (height, width) (batch, 2) in; torchvision's list of {boxes, labels, scores} out,
    in the pixels of the images given.

    Each image is cut back to its size and the list goes to the model as `model(images)` takes it (padded to
    the batch's largest, a multiple of 32), so images of different sizes give what torchvision gives them, on
    every backend: an exported graph cuts them itself from an input of one fixed shape. The builder's
    normalisation and resize run in preprocessing, so the network runs at the size of the images given."""

    jit_mode = "script"   # data-dependent control flow: tracing would freeze one path

    def __init__(self, model: nn.Module):
        super().__init__()
        t = model.transform
        model.transform = _batching_transform()(t.min_size, t.max_size, t.image_mean, t.image_std,
                                                t.size_divisible, t.fixed_size)
        self.model = model

    def forward(self, images: torch.Tensor, sizes: torch.Tensor) -> list[dict[str, torch.Tensor]]:
        if torch.jit.is_scripting():
            return self.model(_cut(images, sizes))[1]      # scripted detection models return (losses, detections)
        return self.model(_cut_outside_graphs(images, sizes))


def _cut(images: torch.Tensor, sizes: torch.Tensor) -> list[torch.Tensor]:
    """Each image of the batch at its own size (traced, the sizes stay inputs of the graph)."""
    return [images[i, :, :sizes[i, 0], :sizes[i, 1]] for i in range(images.shape[0])]


@torch.jit.unused
def _cut_outside_graphs(images: torch.Tensor, sizes: torch.Tensor) -> list[torch.Tensor]:
    """`_cut`, which torch.compile leaves out of its graphs: they start from the images cut (reading the sizes is a
    graph break, which it would warn about). Imports dynamo at the first call, not with the zoo."""
    if torch.compiler.is_compiling():
        return _dynamo_skips_cut()(images, sizes)
    return _cut(images, sizes)


@functools.cache
def _dynamo_skips_cut():
    return torch.compiler.disable(_cut)


@dataclass(frozen=True)
class Detector(ModelSpec):
    """A torchvision detection model with random weights. The timed passes run its network on squares of
    --input-size; a dataset is scored by torchvision's reference evaluation (`preprocess`)."""

    builder: str = ""

    def smoke_shape(self):
        return {"input_size": 128}

    def check_shape(self, shape):
        if shape["input_size"] < 64:
            raise UsageError(f"--input-size {shape['input_size']} is too small for {self.name}; accepted: >= 64")

    def _build_module(self, shape):
        tv = ensure_torchvision()
        return DetectionModel(getattr(tv.models.detection, self.builder)(weights=None, weights_backbone=None))

    def example_inputs(self, batch_size, shape, module):
        return self._squares(_images(batch_size, shape["input_size"]))

    def calibration_inputs(self, batch_size, shape, module, n):
        return [self._squares(_images(batch_size, shape["input_size"], seed=99 + i)) for i in range(n)]

    @staticmethod
    def _squares(images: torch.Tensor) -> tuple:
        return images, torch.tensor([list(images.shape[-2:])] * len(images))

    def preprocess(self, shape: dict):
        """PIL image -> (network input, Placement): torchvision's reference evaluation, the weights' preset (a
        float tensor in [0, 1]) then the builder's own transform's per-image steps: normalisation, and its
        resize (bilinear interpolation, the aspect ratio kept between min_size and max_size, or its fixed
        size)."""
        tv = ensure_torchvision()
        preset = tv.models.get_model_weights(self.builder).DEFAULT.transforms()
        reference = reference_transform(self.builder)

        def transform(image):
            normalised = reference.normalize(preset(image.convert("RGB")))
            resized, _ = reference.resize(normalised)
            (height, width), (h, w) = normalised.shape[-2:], resized.shape[-2:]
            return resized, Placement(width / w, height / h)
        return transform

    def collate(self, samples, shape):
        """Preprocessed images of any sizes -> (the canvas, their sizes): each at the top-left of a square as large
        as the largest image the reference resize makes (a multiple of the transform's stride) or the timed
        square, whichever is larger. One shape for every batch, timed or scored, so a backend prepared for
        one input shape takes them all."""
        side = self.canvas(shape)
        canvas = torch.zeros(len(samples), 3, side, side)
        for image, sample in zip(canvas, samples, strict=True):
            image[:, :sample.shape[1], :sample.shape[2]] = sample
        return canvas, torch.tensor([list(s.shape[1:]) for s in samples])

    def canvas(self, shape: dict) -> int:
        t = reference_transform(self.builder)
        largest = max(t.fixed_size) if t.fixed_size else max(t.max_size, t.min_size[-1])
        return max(shape["input_size"], -(-largest // t.size_divisible) * t.size_divisible)

    def reference_protocol(self, shape):
        t = reference_transform(self.builder)
        if t.fixed_size:
            width, height = t.fixed_size
            scored = {"input_size": width} if width == height else {"height": height, "width": width}
            resize = f"fixed size {width} x {height}"
        else:
            scored = {"min_size": t.min_size[-1], "max_size": t.max_size}
            resize = f"aspect ratio kept, min_size {t.min_size[-1]}, max_size {t.max_size}"
        timed = {"input_size": shape["input_size"]}
        return {"protocol": "reference",
                "follows": f"torchvision's detection reference evaluation ({self.builder}): its weights' preset, "
                           f"its GeneralizedRCNNTransform (normalisation, bilinear resize: {resize}; a batch padded "
                           f"to a multiple of {t.size_divisible}), boxes in the original image's pixels",
                "shape": scored, **({"timed_shape": timed} if timed != scored else {})}


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
