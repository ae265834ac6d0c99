"""ImageNet-style classification: a folder of images with a labels file, or torchvision's ImageFolder layout.

The labels file is the one ImageNet validation sets ship with (`ILSVRC2012_val_00000001.JPEG 65`: a file
name and a 0-based class per line). Without one, the folder must hold one sub-folder per class, as
`torchvision.datasets.ImageFolder` reads it (classes numbered in sorted order). Models with 1001 outputs
(class 0 for background, as TensorFlow's) are scored with that column dropped.
"""

from pathlib import Path

import numpy as np

from ..compat.torchvision_shim import ensure_torchvision
from ..core.errors import UsageError
from . import metrics
from .base import Evaluation, LabelledDataset, load_image, read_text

CLASSES = 1000
LABELS_FORMAT = "a labels file of lines 'IMAGE_FILE CLASS' with CLASS a whole number 0..999"


class ImageNet(LabelledDataset):
    name = "imagenet"
    tasks = ("image-classification",)
    path_kind = "a folder of images with a labels file (--labels), or one sub-folder of images per class"

    def _index(self):
        if not self.path.is_dir():
            raise UsageError(f"imagenet dataset {str(self.path)!r} is not a folder; accepted: {self.path_kind}")
        return self._from_labels_file() if self.labels else self._from_class_folders()

    def _from_labels_file(self):
        text = read_text(self.labels, LABELS_FORMAT)
        samples = []
        for number, line in enumerate(text.splitlines(), 1):
            if not line.strip():
                continue
            parts = line.rsplit(maxsplit=1)
            if len(parts) != 2 or not parts[1].lstrip("-").isdigit():
                raise UsageError(f"{str(self.labels)!r} line {number} is {line.strip()[:80]!r}; "
                                 f"accepted: {LABELS_FORMAT}")
            label = int(parts[1])
            if not 0 <= label < CLASSES:
                raise UsageError(f"{str(self.labels)!r} line {number}: class {label} is out of range; "
                                 f"accepted: 0..{CLASSES - 1}")
            image = self.path / parts[0]
            if not image.is_file():
                raise UsageError(f"{str(self.labels)!r} line {number} names {parts[0]!r}, which is not in "
                                 f"{str(self.path)!r}; accepted: {LABELS_FORMAT}, naming images of that folder")
            samples.append((image, label))
        return samples

    def _from_class_folders(self):
        tv = ensure_torchvision()
        folder = tv.datasets.folder
        try:
            classes, index = folder.find_classes(str(self.path))
            if len(classes) > CLASSES:
                raise UsageError(f"imagenet dataset {str(self.path)!r} has {len(classes)} class folders; "
                                 f"accepted: at most {CLASSES}")
            samples = folder.make_dataset(str(self.path), index, extensions=folder.IMG_EXTENSIONS)
        except FileNotFoundError as exc:     # no class folder, or a class folder without images
            raise UsageError(f"imagenet dataset {str(self.path)!r}: {str(exc).splitlines()[0][:160]}; "
                             f"accepted: {self.path_kind}") from None
        return [(Path(p), label) for p, label in samples]

    def _describe_sample(self, sample):
        return [str(sample[0].relative_to(self.path)), sample[1]]

    def _inputs(self, spec, shape, module, samples):
        transform = spec.preprocess(shape)
        return spec.collate([load_image(path, transform) for path, _ in samples], shape)

    def _target(self, sample):
        return (str(sample[0].relative_to(self.path)), sample[1])

    def evaluation(self, spec, module):
        return TopK()

    def protocol(self, spec, shape):
        return spec.reference_protocol(shape)


class TopK(Evaluation):
    """Top-1/top-5 over the logits; predictions are each image's five best classes."""

    def __init__(self):
        self.top5, self.labels, self.names = [], [], []

    def add(self, batch, outputs):
        logits = np.asarray(outputs[0], dtype=np.float64)[:batch.count]
        if logits.shape[1] == CLASSES + 1:         # background class first, as TensorFlow-trained models have
            logits = logits[:, 1:]
        self.top5.append(metrics.ranked(logits, 5))
        self.labels += [label for _, label in batch.targets]
        self.names += [name for name, _ in batch.targets]

    def metrics(self):
        return metrics.top_k(np.concatenate(self.top5), self.labels)

    def predictions(self):
        ranked = np.concatenate(self.top5)
        return [{"image": n, "label": int(y), "top_5": [int(c) for c in r]}
                for n, y, r in zip(self.names, self.labels, ranked, strict=True)]
