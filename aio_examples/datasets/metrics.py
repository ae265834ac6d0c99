"""Task metrics with the field's reference definitions: top-k, COCO mAP (pycocotools), SQuAD v1.1 EM/F1, GLUE's
per-task metrics (scikit-learn and scipy, as `evaluate`'s glue metric computes them).

Every metric is a fraction in [0, 1] (a correlation in [-1, 1]); reports show points (x100).
"""

import collections
import contextlib
import io
import re
import string

import numpy as np


def ranked(scores, k: int = 5) -> np.ndarray:
    """Each row's `k` best classes, best first; ties broken by the lower index (as torch.topk does)."""
    return np.argsort(-np.asarray(scores, dtype=np.float64), axis=1, kind="stable")[:, :k]


def top_k(best: np.ndarray, labels, ks=(1, 5)) -> dict:
    """Share of rows whose label is among their k best classes (`best` from `ranked`), for each k it holds."""
    hits = np.asarray(best) == np.asarray(labels)[:, None]
    return {f"top_{k}": float(hits[:, :k].any(axis=1).mean()) for k in ks if k <= hits.shape[1]}


def accuracy(predicted, labels) -> dict:
    predicted, labels = np.asarray(predicted), np.asarray(labels)
    return {"accuracy": float((predicted == labels).mean())}


GLUE_TASKS = ("cola", "sst2", "mrpc", "qqp", "stsb", "mnli", "qnli", "rte", "wnli")


def glue(task: str | None, predicted, labels) -> dict:
    """GLUE's metrics of `task` as `evaluate`'s glue metric computes them: Matthews correlation for CoLA, Pearson
    and Spearman correlations for STS-B (a regression: `predicted` holds scores), accuracy and binary F1 for
    MRPC and QQP, accuracy for the others (and for no task). Constant predictions have no correlation: 0, as
    scikit-learn's Matthews correlation gives, where scipy's would be NaN."""
    if task == "cola":
        from sklearn.metrics import matthews_corrcoef

        return {"matthews_correlation": float(matthews_corrcoef(labels, predicted))}
    if task == "stsb":
        from scipy.stats import pearsonr, spearmanr

        predicted, labels = np.asarray(predicted, np.float64), np.asarray(labels, np.float64)
        if len(labels) < 2 or np.ptp(predicted) == 0 or np.ptp(labels) == 0:
            return {"pearson": 0.0, "spearmanr": 0.0}
        return {"pearson": float(pearsonr(predicted, labels)[0]), "spearmanr": float(spearmanr(predicted, labels)[0])}
    if task in ("mrpc", "qqp"):
        from sklearn.metrics import f1_score

        return {**accuracy(predicted, labels), "f1": float(f1_score(labels, predicted))}
    return accuracy(predicted, labels)


def coco_detection(ground_truth, results: list[dict], image_ids: list[int]) -> dict:
    """COCO bounding-box mAP@[.5:.95] and AP50 by pycocotools' COCOeval (the official evaluator), over
    `image_ids` only. `ground_truth` is a pycocotools COCO object; `results` COCO result dicts."""
    from pycocotools.cocoeval import COCOeval

    if not results:                 # loadRes refuses an empty list; no detection scores zero
        return {"map": 0.0, "ap50": 0.0}
    with contextlib.redirect_stdout(io.StringIO()):      # COCOeval prints its progress and table
        detections = ground_truth.loadRes([dict(r) for r in results])     # it adds area, id... to what it is given
        evaluator = COCOeval(ground_truth, detections, "bbox")
        evaluator.params.imgIds = sorted(image_ids)
        evaluator.evaluate()
        evaluator.accumulate()
        evaluator.summarize()
    # stats[0] is AP@[.5:.95], stats[1] AP@.5; -1 means no ground-truth box to score against
    return {"map": max(float(evaluator.stats[0]), 0.0), "ap50": max(float(evaluator.stats[1]), 0.0)}


def normalize_answer(text: str) -> str:
    """SQuAD v1.1's official answer normalisation: lower case, no punctuation, no articles, single spaces."""
    text = "".join(ch for ch in text.lower() if ch not in set(string.punctuation))
    text = re.sub(r"\b(a|an|the)\b", " ", text)
    return " ".join(text.split())


def _f1(prediction: str, truth: str) -> float:
    pred, gold = normalize_answer(prediction).split(), normalize_answer(truth).split()
    common = collections.Counter(pred) & collections.Counter(gold)
    same = sum(common.values())
    if same == 0:
        return 0.0
    precision, recall = same / len(pred), same / len(gold)
    return 2 * precision * recall / (precision + recall)


def squad(predictions: dict, answers: dict) -> dict:
    """SQuAD v1.1 exact match and F1: each question scored against its best-matching gold answer, averaged
    over the questions of `answers`."""
    em = f1 = 0.0
    for qid, golds in answers.items():
        pred = predictions.get(qid, "")
        em += max(float(normalize_answer(pred) == normalize_answer(g)) for g in golds)
        f1 += max(_f1(pred, g) for g in golds)
    n = max(len(answers), 1)
    return {"exact_match": em / n, "f1": f1 / n}
