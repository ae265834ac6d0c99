"""What the example notebooks show: a made-up picture, its labels, boxes and answers, the results split into
what ran and what could not, and where the time goes. Nothing is downloaded.

The zoo's weights are random unless a weights file or model folder is given, so predictions are then
arbitrary; every function here says which case it is in (`weights`), and the notebooks say it plainly.
"""

import torch

from ..compat.torchvision_shim import ensure_torchvision
from ..measurement.profile import NAMES
from ..models import get_model
from .plots import draw_profile_categories

NOT_RUN_COLUMNS = ["model", "backend", "precision", "status", "reason"]

IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)


def demo_image(size: int = 224) -> torch.Tensor:
    """A deterministic picture (3 x size x size, values in [0, 1]): sky, sun, hills and a house."""
    y, x = torch.meshgrid(torch.linspace(0, 1, size), torch.linspace(0, 1, size), indexing="ij")
    img = torch.stack([0.35 + 0.3 * y, 0.6 + 0.3 * y, torch.full_like(y, 0.95)])          # sky
    sun = (x - 0.78) ** 2 + (y - 0.2) ** 2 < 0.01
    img[:, sun] = torch.tensor([1.0, 0.85, 0.2])[:, None]
    hills = y > 0.62 + 0.08 * torch.sin(7 * x)
    img[:, hills] = torch.stack([0.2 + 0.1 * y, 0.55 - 0.2 * y, 0.2 * y])[:, hills]
    wall = (x > 0.2) & (x < 0.45) & (y > 0.5) & (y < 0.75)
    img[:, wall] = torch.tensor([0.75, 0.3, 0.25])[:, None]
    roof = (y > 0.35) & (y <= 0.5) & ((x - 0.325).abs() < (y - 0.35) * 1.0)
    img[:, roof] = torch.tensor([0.35, 0.2, 0.15])[:, None]
    return img.clamp(0, 1)


def imagenet_categories() -> list[str]:
    """The 1000 ImageNet class names torchvision ships with its weight metadata (no download)."""
    return list(ensure_torchvision().models.ResNet50_Weights.IMAGENET1K_V1.meta["categories"])


def coco_categories() -> list[str]:
    tv = ensure_torchvision()
    return list(tv.models.detection.FasterRCNN_MobileNet_V3_Large_FPN_Weights.COCO_V1.meta["categories"])


def _build(model: str, weights: str | None, input_size: int):
    spec = get_model(model)
    module = spec.build(weights=weights, shape=spec.shape(input_size=input_size)).eval()
    return module, ("file" if weights else "random")


def classify(model: str, image: torch.Tensor, weights: str | None = None, k: int = 5) -> dict:
    """Top-k ImageNet labels of `image` by a zoo classifier, eager fp32."""
    module, kind = _build(model, weights, image.shape[-1])
    mean, std = torch.tensor(IMAGENET_MEAN)[:, None, None], torch.tensor(IMAGENET_STD)[:, None, None]
    with torch.no_grad():
        probs = module(((image - mean) / std)[None]).softmax(-1)[0]
    top = probs.topk(k)
    names = imagenet_categories()
    return {"weights": kind, "top": [(names[i], float(p)) for p, i in zip(top.values, top.indices)]}


def detect(model: str, image: torch.Tensor, weights: str | None = None, top: int = 10) -> dict:
    """The `top` highest-scoring boxes of a zoo detector on `image` (in its pixels), with COCO names: the image
    prepared as a COCO dataset's are (the model family's reference evaluation, `spec.preprocess`)."""
    from PIL import Image

    spec = get_model(model)
    shape = spec.shape(input_size=image.shape[-1])
    module, kind = _build(model, weights, image.shape[-1])
    picture = Image.fromarray((image.permute(1, 2, 0) * 255).round().to(torch.uint8).numpy())
    prepared, placement = spec.preprocess(shape)(picture)
    with torch.no_grad():
        out = spec.postprocess(module(*spec.collate([prepared], shape)))[0]     # YOLO's NMS runs after its network
    boxes = placement.to_original(out["boxes"].numpy())
    names = coco_categories()
    order = out["scores"].argsort(descending=True)[:top]
    return {"weights": kind, "boxes": [(boxes[i].tolist(), names[int(out["labels"][i]) % len(names)],
                                        float(out["scores"][i])) for i in order]}


def draw_boxes(ax, image: torch.Tensor, boxes) -> None:
    """Draw the image and its (box, label, score) detections on a matplotlib axis."""
    from matplotlib.patches import Rectangle

    ax.imshow(image.permute(1, 2, 0).numpy())
    for (x0, y0, x1, y1), label, score in boxes:
        ax.add_patch(Rectangle((x0, y0), x1 - x0, y1 - y0, fill=False, edgecolor="yellow", linewidth=1.5))
        ax.text(x0, y0, f"{label} {score:.2f}", color="black", backgroundcolor="yellow", fontsize=7)
    ax.axis("off")


def records(*outcomes) -> list:
    """The records of one or more `benchmark` calls in one list: a call measuring one configuration returns a
    `Result`, one measuring several (a list of backends or precisions) returns a list."""
    return [r for o in outcomes for r in (o if isinstance(o, (list, tuple)) else [o])]


def split_results(results):
    """`benchmark` results split into (those that ran ok, for the tables and charts; a DataFrame of the others
    with their status and reason), so a configuration a backend cannot run is listed, not silently left out."""
    import pandas as pd

    ok = [r for r in results if r.status == "ok"]
    not_run = pd.DataFrame([{"model": r.model, "backend": r.backend, "precision": r.precision, "status": r.status,
                             "reason": r.reason or ""} for r in results if r.status != "ok"], columns=NOT_RUN_COLUMNS)
    return ok, not_run


def profile_figure(results, title: str):
    """The op-category bars of the report's "Where the time goes" for the results profiled ok
    (`benchmark(..., profile=True)`): one bar per backend, aio's named with the strategy it chose."""
    import matplotlib.pyplot as plt

    rows = [r for r in results if r.status == "ok" and (r.metrics or {}).get("profile")]
    labels = [r.backend if r.strategy in (None, r.backend) else f"{r.backend} ({r.strategy})" for r in rows]
    fig, ax = plt.subplots(figsize=(8, 1.2 + 0.45 * len(rows)))
    draw_profile_categories(ax, labels, [r.metrics["profile"]["categories_share"] for r in rows], NAMES)
    ax.set_title(title)
    fig.tight_layout()
    return fig


def answer(question: str, context: str, model: str = "bert_base", model_dir: str | None = None,
           config: list[str] | None = None) -> dict:
    """Extractive question answering: the span of `context` a zoo QA model picks (`config`: its architecture's
    overrides, as `benchmark(config=...)`).

    With a local Hugging Face folder its tokenizer is used; without one the words are mapped to ids
    by a fixed hash (no vocabulary can be downloaded) and the random-weight model's span is arbitrary.
    """
    spec = get_model(model).with_config(config)
    module = spec.build(model_dir=model_dir, shape=spec.shape(seq_len=128)).eval()
    words = context.split()
    tokenizer = getattr(module, "tokenizer", None)
    if tokenizer is not None:
        enc = tokenizer(question, context, return_tensors="pt", truncation=True, max_length=384)
        ids, mask = enc["input_ids"], enc["attention_mask"]
    else:
        vocab = module.model.config.vocab_size
        q = [hash_word(w, vocab) for w in question.split()]
        ids = torch.tensor([[101, *q, 102, *(hash_word(w, vocab) for w in words), 102]])
        mask = torch.ones_like(ids)
    with torch.no_grad():
        out = module(ids, mask)
    start_logits, end_logits = (out.start_logits, out.end_logits) if hasattr(out, "start_logits") else out[:2]
    start = int(start_logits[0].argmax())
    end = max(start, int(end_logits[0, start:].argmax()) + start)
    if tokenizer is not None:
        text = tokenizer.decode(ids[0, start:end + 1], skip_special_tokens=True)
    else:
        offset = len(question.split()) + 2          # [CLS] question [SEP]
        text = " ".join(words[max(0, start - offset):max(0, end - offset) + 1]) or "(outside the context)"
    return {"weights": "model-dir" if model_dir else "random", "answer": text, "start": start, "end": end}


def hash_word(word: str, vocab: int) -> int:
    """A stable id for a word (not Python's salted hash), away from the special ids at the start."""
    import zlib

    return 1000 + zlib.crc32(word.lower().encode()) % (vocab - 1000)
