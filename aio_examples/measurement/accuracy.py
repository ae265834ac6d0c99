"""Accuracy mode: every sample of a labelled dataset through each prepared configuration, once, outside the
timed passes; the task metrics beside eager fp32's on the same samples, and every prediction in a file.

Eager fp32 is scored first, before any backend is prepared, so a dataset that cannot be read or a model it
does not fit stops the run before anything is measured.
"""

import time
from pathlib import Path
from typing import NamedTuple

from ..core import interrupts, scores
from ..core.paths import safe_name, write_json_atomic
from ..core.precision import PRECISIONS
from .output_check import flatten

# Largest loss of any score against eager fp32 on the same samples (core/scores.py: 0.005 = 0.5 points, or
# 0.5% of a perplexity), per precision: fp32 backends should only reorder float sums; reduced precisions are
# allowed one point, MLPerf's int8 rule (99% of fp32's top-1) on a ResNet-50 at 76%.
DROP_MAX = dict.fromkeys(PRECISIONS, 0.01) | {"fp32": 0.005}


class Scored(NamedTuple):
    """One configuration scored over the whole dataset."""

    metrics: dict
    predictions: object
    samples: int
    seconds: float


def score(dataset, spec, module, prepared, batch_size: int, shape: dict) -> Scored:
    """One prepared configuration scored over the whole dataset."""
    evaluation = dataset.evaluation(spec, module)
    start, samples = time.perf_counter(), 0
    for batch in dataset.batches(spec, batch_size, shape, module):
        interrupts.check()
        inputs = prepared.feed(batch.inputs)
        drive = getattr(dataset, "drive", None)     # a generator's dataset steps the model itself
        evaluation.add(batch, drive(prepared.fn, inputs) if drive else flatten(spec.postprocess(prepared.fn(*inputs))))
        samples += batch.count
    return Scored(evaluation.metrics(), evaluation.predictions(), samples, time.perf_counter() - start)


def block(dataset, scored: Scored, reference: dict | None, predictions_file: Path | None,
          protocol: dict | None = None) -> dict:
    """The record's `accuracy` block; `reference` is eager fp32's metrics on the same samples, `protocol` the
    reference evaluation the scoring followed (`Dataset.protocol`)."""
    delta = ({k: round(v - reference[k], 6) for k, v in scored.metrics.items() if k in reference}
             if reference is not None else None)
    return {"metrics": {k: round(v, 6) for k, v in scored.metrics.items()}, "samples": scored.samples,
            "dataset": dataset.describe(), "predictions": str(predictions_file) if predictions_file else None,
            "reference": reference, "delta_vs_eager_fp32": delta, "seconds": round(scored.seconds, 2),
            **({"protocol": protocol} if protocol else {})}


def verdict(accuracy: dict, precision: str) -> str | None:
    """Why a configuration's scores fall too far behind eager fp32's on the same samples (below it, or above
    it for an error rate or perplexity: core/scores.py), or None when they do not. `precision`: whose allowance
    applies (core/precision.judged_as: fp32 in a fast-math mode has the narrower type's)."""
    limit = DROP_MAX[precision]
    for name, value in accuracy["metrics"].items():
        reference = (accuracy.get("reference") or {}).get(name)
        if reference is not None and scores.loss(name, reference, value) > limit:
            worse = "above" if name in scores.LOWER_IS_BETTER else "below"
            return (f"{name} {scores.shown(name, value)} is {scores.shown_loss(name, scores.loss(name, reference, value))} "
                    f"{worse} eager fp32's {scores.shown(name, reference)} on the same samples ({precision} allows "
                    f"{scores.shown_loss(name, limit)})")
    return None


def save_predictions(out_dir: Path | None, run_id: str, backend: str, precision: str, predictions) -> Path | None:
    """Every prediction of a configuration, in the form the field rescores, beside the results."""
    if out_dir is None:
        return None
    path = Path(out_dir) / "predictions" / f"{safe_name(run_id)}-{safe_name(backend)}-{precision}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    write_json_atomic(path, predictions)
    return path.resolve()


class SampleSource:
    """A labelled dataset's samples by index through one prepared configuration, and the scoring of answers
    given per sample: what an instance serving LoadGen's accuracy mode runs (measurement/scenarios/serve.py).

    An answer is one sample's outputs as the evaluation takes a batch of one: a batch's outputs are split by
    their leading (batch) dimension, so a model whose outputs are not batch-major (detection: boxes per
    image) serves one sample a pass."""

    def __init__(self, dataset, spec, shape: dict, module, prepared, batch_size: int, reference: dict | None):
        self.dataset, self.spec, self.shape, self.module = dataset, spec, shape, module
        self.prepared, self.batch_size, self.reference = prepared, batch_size, reference

    def __len__(self) -> int:
        return len(self.dataset.samples)

    def answers(self, indices: list[int]) -> list[list]:
        from ..core.errors import UnsupportedError

        chunk = [self.dataset.samples[i] for i in indices]
        padded = chunk + [chunk[-1]] * (self.batch_size - len(chunk))
        inputs = self.prepared.feed(self.dataset._inputs(self.spec, self.shape, self.module, padded))
        outputs = flatten(self.spec.postprocess(self.prepared.fn(*inputs)))
        if self.batch_size == 1:
            return [outputs]
        if not all(getattr(o, "shape", ())[:1] == (self.batch_size,) for o in outputs):
            raise UnsupportedError(f"{self.spec.name}'s outputs are not batch-major: its accuracy mode under LoadGen "
                                   "serves one sample a pass (-b 1)")
        return [[o[i:i + 1] for o in outputs] for i in range(len(chunk))]

    def score(self, answers: dict) -> dict:
        """The task metrics of {sample index: answer}, beside eager fp32's on the whole dataset."""
        from ..datasets.base import Batch

        evaluation = self.dataset.evaluation(self.spec, self.module)
        for index in sorted(answers):
            evaluation.add(Batch((), [self.dataset._target(self.dataset.samples[index])]), answers[index])
        scored = Scored(evaluation.metrics(), evaluation.predictions(), len(answers), 0.0)
        return block(self.dataset, scored, self.reference, None, self.dataset.protocol(self.spec, self.shape))
