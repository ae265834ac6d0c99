"""COCO object detection: a folder of images and its instances annotation file, scored by pycocotools.

Images are scored as the model family's reference evaluation prepares them (`spec.preprocess`: torchvision's
detection reference, Ultralytics' val), and the timed passes run on the first batch resized to the --input-size
square. Boxes come back from the model in its input's pixels and are mapped to the original image's by each
image's `Placement` (and clipped to it); the zoo's detectors number their classes by COCO category id (91 slots:
torchvision's natively, YOLO's mapped from its 80 classes, models/yolo.py), so labels are ids.
Predictions are written as COCO results JSON, which pycocotools (or anyone) rescores as it is.
"""

import numpy as np

from ..core.errors import UsageError
from ..models.vision import detections
from . import metrics
from .base import Evaluation, LabelledDataset, load_image, read_json

ANNOTATIONS = "a COCO instances JSON file (images, annotations, categories)"


class Coco(LabelledDataset):
    name = "coco"
    tasks = ("object-detection",)
    path_kind = "a folder of COCO images, with its instances annotation file (--labels or COCO_ANNO_PATH)"

    def __init__(self, *args, **kwargs):
        self._placements = {}           # image id -> where its image sits in the model's input, for scoring
        super().__init__(*args, **kwargs)

    def _index(self):
        if not self.path.is_dir():
            raise UsageError(f"coco dataset {str(self.path)!r} is not a folder; accepted: {self.path_kind}")
        if self.labels is None:
            raise UsageError(f"coco dataset {str(self.path)!r} needs its annotation file; accepted: {ANNOTATIONS} "
                             "given by --labels or COCO_ANNO_PATH")
        data = read_json(self.labels, ANNOTATIONS)
        if not isinstance(data, dict) or not all(isinstance(data.get(k), list)
                                                 for k in ("images", "annotations", "categories")):
            raise UsageError(f"{str(self.labels)!r} is not a COCO instances file; accepted: {ANNOTATIONS}")
        samples = []
        for image in sorted(data["images"], key=lambda i: i.get("id", 0) if isinstance(i, dict) else 0):
            if not isinstance(image, dict) or "id" not in image or "file_name" not in image:
                raise UsageError(f"{str(self.labels)!r} has an image entry without id and file_name; "
                                 f"accepted: {ANNOTATIONS}")
            file = self.path / image["file_name"]
            if not file.is_file():
                raise UsageError(f"{str(self.labels)!r} names image {image['file_name']!r}, which is not in "
                                 f"{str(self.path)!r}; accepted: the image folder of that annotation file")
            samples.append((file, int(image["id"])))
        return samples

    def _describe_sample(self, sample):
        return [sample[0].name, sample[1]]

    def _preprocessed(self, spec, shape, samples) -> list:
        """(input image, Placement) of each sample, as the model family's reference evaluation makes them."""
        transform = spec.preprocess(shape)
        return [load_image(path, transform) for path, _ in samples]

    def _inputs(self, spec, shape, module, samples):
        preprocessed = self._preprocessed(spec, shape, samples)
        for (_, image_id), (_, placement) in zip(samples, preprocessed, strict=True):
            self._placements[image_id] = placement
        return spec.collate([image for image, _ in preprocessed], shape)

    def example_inputs(self, spec, batch_size, shape, module):
        """The first batch, each image resized (bilinear) to the --input-size square: the timed passes run at one
        fixed shape, where the reference's sizes vary by image."""
        import torch

        side = shape["input_size"]
        chunk = self.samples[:batch_size]
        images = [image if image.shape[-2:] == (side, side) else
                  torch.nn.functional.interpolate(image[None], size=(side, side), mode="bilinear")[0]
                  for image, _ in self._preprocessed(spec, shape, chunk + [chunk[-1]] * (batch_size - len(chunk)))]
        return spec.collate(images, shape)

    def _target(self, sample):
        return (sample[1], self._placements[sample[1]])

    def protocol(self, spec, shape):
        return spec.reference_protocol(shape)

    def ground_truth(self):
        """The annotation file as pycocotools reads it (once per dataset)."""
        if getattr(self, "_coco", None) is None:
            import contextlib
            import io

            from pycocotools.coco import COCO

            with contextlib.redirect_stdout(io.StringIO()):
                try:
                    self._coco = COCO(str(self.labels))
                except Exception as exc:  # noqa: BLE001  (pycocotools asserts and raises KeyError on odd files)
                    raise UsageError(f"{str(self.labels)!r} is not a COCO instances file pycocotools reads "
                                     f"({exc.__class__.__name__}); accepted: {ANNOTATIONS}") from None
        return self._coco

    def evaluation(self, spec, module):
        return CocoEvaluation(self.ground_truth())


class CocoEvaluation(Evaluation):
    """COCO results (x, y, width, height in original pixels) gathered over the batches, scored by COCOeval."""

    def __init__(self, ground_truth):
        self.ground_truth, self.results, self.image_ids = ground_truth, [], []

    def add(self, batch, outputs):
        for (image_id, placement), (boxes, labels, scores) in zip(batch.targets, detections(outputs), strict=False):
            self.image_ids.append(image_id)
            # clipped to the image: a letterboxed input (YOLO's) has padding that boxes reach into
            image = self.ground_truth.imgs.get(image_id, {})
            size = [image.get("width", np.inf), image.get("height", np.inf)]
            boxes = np.clip(placement.to_original(boxes), 0, size * 2)
            for (x1, y1, x2, y2), label, score in zip(boxes, labels, scores, strict=True):
                self.results.append({"image_id": image_id, "category_id": int(label), "score": round(float(score), 5),
                                     "bbox": [round(float(v), 2) for v in (x1, y1, x2 - x1, y2 - y1)]})

    def metrics(self):
        return metrics.coco_detection(self.ground_truth, self.results, self.image_ids)

    def predictions(self):
        return self.results

