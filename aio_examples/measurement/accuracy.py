"""Accuracy mode: every sample of a labelled dataset through each prepared configuration, once, outside the
timed passes; the task metrics beside eager fp32's on the same samples, and every prediction in a file.

Eager fp32 is scored first, before any backend is prepared, so a dataset that cannot be read or a model it
does not fit stops the run before anything is measured.
"""

import time
from pathlib import Path

from ..core import interrupts
from ..core.paths import safe_name, write_json_atomic
from ..core.precision import PRECISIONS
from .output_check import flatten

# Largest drop of any metric below eager fp32 on the same samples, as a fraction (0.005 = 0.5 points), per
# precision: fp32 backends should only reorder float sums; reduced precisions are allowed one point, MLPerf's
# int8 rule (99% of fp32's top-1) on a ResNet-50 at 76%.
DROP_MAX = dict.fromkeys(PRECISIONS, 0.01) | {"fp32": 0.005}
# Metrics where less is better: for them a rise is the drop the allowance bounds.
LOWER_IS_BETTER = {"wer", "perplexity", "nll"}


def score(dataset, spec, module, prepared, batch_size: int, shape: dict) -> tuple[dict, object, int, float]:
    """(metrics, predictions, samples, seconds) of one prepared configuration over the whole dataset."""
    evaluation = dataset.evaluation(spec, module)
    start, samples = time.perf_counter(), 0
    for batch in dataset.batches(spec, batch_size, shape, module):
        interrupts.check()
        inputs = prepared.feed(batch.inputs)
        drive = getattr(dataset, "drive", None)     # a generator's dataset steps the model itself
        evaluation.add(batch, drive(prepared.fn, inputs) if drive else flatten(prepared.fn(*inputs)))
        samples += batch.count
    return evaluation.metrics(), evaluation.predictions(), samples, time.perf_counter() - start


def block(dataset, metrics: dict, samples: int, seconds: float, reference: dict | None,
          predictions_file: Path | None) -> dict:
    """The record's `accuracy` block."""
    delta = ({k: round(v - reference[k], 6) for k, v in metrics.items() if k in reference}
             if reference is not None else None)
    return {"metrics": {k: round(v, 6) for k, v in metrics.items()}, "samples": samples,
            "dataset": dataset.describe(), "predictions": str(predictions_file) if predictions_file else None,
            "reference": reference, "delta_vs_eager_fp32": delta, "seconds": round(seconds, 2)}


def verdict(accuracy: dict, precision: str) -> str | None:
    """Why a configuration's metrics fall too far behind eager fp32's (below it, or above it for a metric in
    LOWER_IS_BETTER), or None when they do not."""
    limit = DROP_MAX[precision]
    for name, delta in (accuracy.get("delta_vs_eager_fp32") or {}).items():
        if name in LOWER_IS_BETTER and delta > limit:
            return (f"{name} {accuracy['metrics'][name]:.4g} is {delta:.4g} above eager fp32's "
                    f"{accuracy['reference'][name]:.4g} on the same samples ({precision} allows {limit:.4g})")
        if name not in LOWER_IS_BETTER and delta < -limit:
            return (f"{name} {100 * accuracy['metrics'][name]:.1f} is {-100 * delta:.1f} points below eager fp32's "
                    f"{100 * accuracy['reference'][name]:.1f} on the same samples ({precision} allows "
                    f"{100 * limit:.1f})")
    return None


def save_predictions(out_dir: Path | None, run_id: str, backend: str, precision: str, predictions) -> Path | None:
    """Every prediction of a configuration, in the form the field rescores, beside the results."""
    if out_dir is None:
        return None
    path = Path(out_dir) / "predictions" / f"{safe_name(run_id)}-{safe_name(backend)}-{precision}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    write_json_atomic(path, predictions)
    return path.resolve()
