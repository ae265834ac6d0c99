"""Image folders the reference tests of the image datasets write: pictures of several aspect ratios, laid out as
COCO and ImageNet lay them out."""

import json
from pathlib import Path

import numpy as np
from PIL import Image

SIZES = [(640, 480), (480, 640), (500, 333)]      # (width, height): landscape, portrait, and odd sides


def picture(size: tuple, seed: int) -> Image.Image:
    """Smooth random colours (noise on a grid 16 times coarser, upsampled bicubically): details a resize keeps or
    loses differently by method, unlike plain noise or flat colour."""
    width, height = size
    coarse = np.random.default_rng(seed).integers(0, 256, (height // 16 + 1, width // 16 + 1, 3), dtype=np.uint8)
    return Image.fromarray(coarse).resize((width, height), Image.BICUBIC)


def coco_folder(folder: Path, sizes=SIZES) -> Path:
    """JPEG images 1.jpg, 2.jpg... of `sizes` and their COCO instances file (a person in each), which it returns."""
    images, annotations = [], []
    for i, (width, height) in enumerate(sizes, 1):
        picture((width, height), i).save(folder / f"{i}.jpg", quality=95)
        images.append({"id": i, "file_name": f"{i}.jpg", "width": width, "height": height})
        box = [width / 8, height / 4, width / 2, height / 2]
        annotations.append({"id": i, "image_id": i, "category_id": 1, "bbox": box, "area": box[2] * box[3],
                            "iscrowd": 0})
    anno = folder / "instances.json"
    anno.write_text(json.dumps({"images": images, "annotations": annotations,
                                "categories": [{"id": 1, "name": "person"}]}))
    return anno


def imagenet_folder(folder: Path, sizes=SIZES) -> Path:
    """JPEG images of `sizes` and an ImageNet labels file for them (classes 0, 1, 2...), which it returns."""
    lines = []
    for i, size in enumerate(sizes):
        picture(size, 100 + i).save(folder / f"val_{i}.JPEG", quality=95)
        lines.append(f"val_{i}.JPEG {i}")
    labels = folder / "val_map.txt"
    labels.write_text("\n".join(lines) + "\n")
    return labels
