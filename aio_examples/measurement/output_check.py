"""Output checks: every result is compared with eager fp32 on the same inputs.

Numeric closeness (max abs / relative error, cosine similarity over all floating outputs) and a
task-level agreement (top-1/top-5, matched boxes, span or token agreement) are recorded. The
verdict uses the tolerances below; a result outside them gets status `fail_accuracy`.
"""

from dataclasses import dataclass

import numpy as np

from ..models import is_generator
from ..models.vision import detections

# Minimum cosine similarity with eager fp32, per precision. Reduced precisions keep ~3 significant
# digits (bf16: 8 mantissa bits), int8 fewer; deep networks accumulate that error layer by layer.
# int4: the full Llama 3.2 1B with random weights (prompt 512) gave 0.697-0.698 with torchao's group-128 int4
# (eager, inductor) and 0.725-0.728 with Q4_0 / MatMulNBits block-32 (llama.cpp, ONNX Runtime GenAI, aio):
# five implementations agreeing on the quantization's own error, which 16 layers of random weights compound
# (4 layers gave 0.87). A wrong kernel gives near 0, so 0.6.
COSINE_MIN = {"fp32": 0.9999, "bf16": 0.98, "fp16": 0.99, "int8": 0.95, "int4": 0.6}
# Minimum task agreement (e.g. top-1 agreement), judged only with real weights: random weights
# give near-tied scores whose order any rounding may flip, so there it is reported, not judged.
AGREEMENT_MIN = {"fp32": 0.99, "bf16": 0.9, "fp16": 0.9, "int8": 0.8, "int4": 0.7}
# Probabilities (a recommender's click probabilities) all lie in (0, 1), where any two vectors have a cosine near 1
# (DLRM's random-weight outputs against a shuffled copy: 0.85): they are also judged by their largest absolute
# difference from eager fp32's. DLRM here, batches of 1 to 1024: fp32 backends 7e-7, bf16 0.0075, int8 (dynamic
# int8 MLPs, 8-bit row-wise tables) 0.05 at most (0.007 on average); OpenVINO's static int8 calibrated on 8
# single samples 0.13, which these limits catch.
PROBABILITY_TASKS = ("recommendation",)
PROBABILITY_ERR_MAX = {"fp32": 1e-4, "bf16": 0.03, "fp16": 0.02, "int8": 0.1, "int4": 0.2}
# Detection: share of the top reference boxes matched by the output (same label, IoU >= 0.5).
IOU_MIN = 0.5
DETECTION_TOP = 20


def flatten(out) -> list[np.ndarray]:
    """Every tensor/array of a (nested) output, in order, as numpy arrays (bf16/fp16 widened)."""
    if out is None:
        return []
    if isinstance(out, dict):
        return [a for v in out.values() for a in flatten(v)]
    if isinstance(out, (list, tuple)):
        return [a for v in out for a in flatten(v)]
    if hasattr(out, "to_tuple"):
        return flatten(out.to_tuple())
    if hasattr(out, "detach"):
        t = out.detach()
        if t.is_floating_point():
            t = t.float()
        return [t.cpu().numpy()]
    return [np.asarray(out)]


def _floats(arrays):
    return [a.astype(np.float64) for a in arrays if np.issubdtype(a.dtype, np.floating)]


@dataclass
class Check:
    """The comparison of one backend's outputs with eager fp32's."""

    precision: str                     # whose tolerances judged it (core/precision.judged_as: fp32 in fast math too)
    passed: bool
    reason: str | None
    metrics: dict
    reference: str = "eager-fp32"      # what ran the reference (a user's ONNX file: ONNX Runtime, unoptimized)
    abs_err_max: float | None = None   # probabilities: the largest absolute error allowed (PROBABILITY_ERR_MAX)

    def to_dict(self) -> dict:
        tolerance = {"precision": self.precision, "cosine_min": COSINE_MIN[self.precision],
                     "agreement_min": AGREEMENT_MIN[self.precision]}
        if self.abs_err_max is not None:
            tolerance["abs_err_max"] = self.abs_err_max
        return {"reference": self.reference, "passed": self.passed, "reason": self.reason, **self.metrics,
                "tolerance": tolerance}


# How the messages name a reference (Check.reference)
REFERENCE_WORDS = {"eager-fp32": "eager fp32", "onnxruntime-fp32-unoptimized": "ONNX Runtime fp32 (graph optimizations off)"}


def check_outputs(task: str, reference, output, precision: str, judge_agreement: bool,
                  reference_name: str = "eager-fp32") -> Check:
    """Compare `output` with the `reference` outputs (both as returned by one pass) that `reference_name` ran:
    eager fp32, or for a user's ONNX file ONNX Runtime fp32 with its graph optimizations off."""
    ref, out = flatten(reference), flatten(output)
    who = REFERENCE_WORDS.get(reference_name, reference_name)
    metrics: dict = {}
    if task == "object-detection":
        agreement = _detection_agreement(ref, out)
        metrics["agreement"] = agreement
        metrics.update(_numeric(ref, out) if _same_shapes(ref, out) else {"cosine": None})
        # Box order follows scores, so numbers are not compared element by element; with random weights
        # the scores tie and which boxes survive is arbitrary: then nothing is judged, only recorded.
        metrics["judged"] = ["boxes_matched"] if judge_agreement else []
        share = agreement["boxes_matched"]
        ok = not judge_agreement or share is None or share >= AGREEMENT_MIN[precision]
        return Check(precision, ok, None if ok else f"{share:.0%} of {who}'s boxes matched "
                     f"(tolerance {AGREEMENT_MIN[precision]:.0%} at {precision})", metrics, reference_name)
    if is_generator(task) and len(out) == 1 < len(ref):
        ref = ref[:1]           # an engine that exposes no logits: its tokens against the reference's
    if not _same_shapes(ref, out):
        shapes = ([a.shape for a in ref], [a.shape for a in out])
        return Check(precision, False, f"outputs differ in structure from {who}: {shapes[1]} vs {shapes[0]}",
                     {"cosine": None}, reference_name)
    metrics.update(_numeric(ref, out))
    metrics["agreement"] = _task_agreement(task, ref, out)
    # an engine without logits gives tokens alone: no cosine to judge
    metrics["judged"] = (["cosine"] if metrics["cosine"] is not None else []) + \
        (list(metrics["agreement"]) if judge_agreement else [])
    cosine, err = metrics["cosine"], metrics["max_abs_err"]
    limit = PROBABILITY_ERR_MAX[precision] if task in PROBABILITY_TASKS else None
    if limit is not None:
        metrics["judged"].append("max_abs_err")
    if cosine is not None and cosine < COSINE_MIN[precision]:
        return Check(precision, False, f"cosine similarity {cosine:.4f} with {who} is below "
                     f"{COSINE_MIN[precision]} (the {precision} tolerance)", metrics, reference_name, limit)
    if limit is not None and err is not None and err > limit:
        return Check(precision, False, f"probabilities differ from {who} by up to {err:.4f}, more than "
                     f"{limit} (the {precision} tolerance)", metrics, reference_name, limit)
    if judge_agreement:
        for name, value in metrics["agreement"].items():
            if value is not None and value < AGREEMENT_MIN[precision]:
                return Check(precision, False, f"{name} agreement {value:.0%} with {who} is below "
                             f"{AGREEMENT_MIN[precision]:.0%} (the {precision} tolerance)", metrics, reference_name,
                             limit)
    return Check(precision, True, None, metrics, reference_name, limit)


def _same_shapes(ref, out) -> bool:
    return len(ref) == len(out) and all(a.shape == b.shape for a, b in zip(ref, out, strict=True))


def _numeric(ref, out) -> dict:
    r, o = _floats(ref), _floats(out)
    if not r or len(r) != len(o):
        return {"max_abs_err": None, "max_rel_err": None, "cosine": None}
    abs_err = max(float(np.max(np.abs(a - b))) if a.size else 0.0 for a, b in zip(r, o, strict=True))
    # Relative to the largest reference magnitude: elementwise relative error explodes near zero.
    scale = max(float(np.max(np.abs(a))) if a.size else 0.0 for a in r)
    rv, ov = np.concatenate([a.ravel() for a in r]), np.concatenate([b.ravel() for b in o])
    if not np.all(np.isfinite(ov)):
        return {"max_abs_err": float("inf"), "max_rel_err": float("inf"), "cosine": -1.0}
    norm = float(np.linalg.norm(rv) * np.linalg.norm(ov))
    cosine = float(rv @ ov / norm) if norm > 0 else float(np.array_equal(rv, ov))
    return {"max_abs_err": abs_err, "max_rel_err": abs_err / scale if scale else abs_err, "cosine": cosine}


def _task_agreement(task: str, ref, out) -> dict:
    first_r, first_o = ref[0], out[0]
    if task == "image-classification" or task == "text-classification":
        top1 = float(np.mean(first_r.argmax(-1) == first_o.argmax(-1)))
        result = {"top1": top1}
        if task == "image-classification" and first_r.shape[-1] >= 5:
            tr, to = np.argsort(-first_r, -1)[..., :5], np.argsort(-first_o, -1)[..., :5]
            result["top5"] = float(np.mean([len(set(a) & set(b)) / 5 for a, b in zip(tr, to, strict=True)]))
        return result
    if task == "question-answering" and len(ref) >= 2:
        start = ref[0].argmax(-1) == out[0].argmax(-1)
        end = ref[1].argmax(-1) == out[1].argmax(-1)
        return {"span": float(np.mean(start & end))}
    if task == "fill-mask":
        return {"token": float(np.mean(first_r.argmax(-1) == first_o.argmax(-1)))}
    if is_generator(task):
        # Greedy decoding: after the first different token the rest follows a different context.
        tokens_r, tokens_o = first_r.reshape(first_r.shape[0], -1), first_o.reshape(first_o.shape[0], -1)
        same = np.cumprod(tokens_r == tokens_o, axis=1)
        result = {"token_prefix": float(same.mean())}
        if len(ref) > 1 and len(out) > 1 and ref[1].shape == out[1].shape:   # steps fed the same tokens
            result["teacher_forced_top1"] = float(np.mean(ref[1].argmax(-1) == out[1].argmax(-1)))
        return result
    return {}


def _detection_agreement(ref, out) -> dict:
    """Share of the top reference boxes that the output has too (same label, IoU >= 0.5), per image."""
    if len(ref) % 3 or len(out) != len(ref):
        return {"boxes_matched": 0.0, "reference_boxes": None}
    matched = total = 0
    for (rb, rl, rs), (ob, ol, _) in zip(detections(ref), detections(out), strict=True):
        for j in np.argsort(-rs)[:DETECTION_TOP]:
            total += 1
            if len(ob):
                matched += bool(np.any((_iou(rb[j], ob) >= IOU_MIN) & (ol == rl[j])))
    return {"boxes_matched": matched / total if total else None, "reference_boxes": total}


def _iou(box, boxes) -> np.ndarray:
    x1, y1 = np.maximum(box[0], boxes[:, 0]), np.maximum(box[1], boxes[:, 1])
    x2, y2 = np.minimum(box[2], boxes[:, 2]), np.minimum(box[3], boxes[:, 3])
    inter = np.clip(x2 - x1, 0, None) * np.clip(y2 - y1, 0, None)
    area = (box[2] - box[0]) * (box[3] - box[1])
    areas = (boxes[:, 2] - boxes[:, 0]) * (boxes[:, 3] - boxes[:, 1])
    return inter / np.maximum(area + areas - inter, 1e-9)
