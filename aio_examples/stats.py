"""Summary statistics of latency samples (numpy/scipy, nothing hand-rolled)."""

from dataclasses import asdict, dataclass

import numpy as np
from scipy import stats


@dataclass(frozen=True)
class Summary:
    n: int
    mean: float
    median: float
    p90: float
    p99: float
    min: float
    max: float
    stdev: float
    ci_low: float          # distribution-free CI of the median (order statistics)
    ci_high: float
    confidence: float

    @property
    def ci_rel_halfwidth(self) -> float:
        """Largest distance from the median to a CI bound, relative to the median (inf if unknown)."""
        if not np.isfinite(self.ci_low) or not np.isfinite(self.ci_high) or self.median <= 0:
            return float("inf")
        return max(self.median - self.ci_low, self.ci_high - self.median) / self.median

    def to_dict(self) -> dict:
        d = asdict(self)
        d["ci_rel_halfwidth"] = self.ci_rel_halfwidth
        return d


def median_ci(samples, confidence: float = 0.95) -> tuple[float, float]:
    """CI of the median from the binomial distribution of order statistics; nan when n is too small."""
    x = np.asarray(samples, dtype=float)
    if x.size == 0:
        return float("nan"), float("nan")
    ci = stats.quantile_test(x, q=float(np.median(x)), p=0.5).confidence_interval(confidence)
    return float(ci.low), float(ci.high)


def summarize(samples, confidence: float = 0.95) -> Summary:
    """Summarise samples (any unit; the harness uses milliseconds)."""
    x = np.asarray(samples, dtype=float)
    if x.size == 0:
        raise ValueError("no samples to summarise")
    lo, hi = median_ci(x, confidence)
    p90, p99 = np.percentile(x, [90, 99])
    return Summary(
        n=int(x.size), mean=float(x.mean()), median=float(np.median(x)), p90=float(p90), p99=float(p99),
        min=float(x.min()), max=float(x.max()), stdev=float(x.std(ddof=1)) if x.size > 1 else 0.0,
        ci_low=lo, ci_high=hi, confidence=confidence,
    )


@dataclass(frozen=True)
class Change:
    """Relative change new/baseline - 1 of a statistic, with a bootstrap confidence interval."""

    rel: float
    low: float
    high: float
    confidence: float

    def to_dict(self) -> dict:
        return asdict(self)


MIN_SAMPLES = 5          # fewer passes on a side: no interval (the change is never significant)


def relative_change(baseline, new, statistic=np.median, confidence: float = 0.95, n_resamples: int = 2000,
                    seed: int = 0) -> Change:
    """Change of `statistic` (median or mean) from `baseline` to `new` samples, with a percentile bootstrap CI.

    A side is an array of passes, or a list of arrays: the same configuration measured in several processes.
    Then the statistic is the mean over processes of each one's statistic, and the bootstrap resamples the
    processes as well as their passes, so the interval includes how much a process moves on its own.
    Both sides are resampled independently (different runs), the ratio is taken on a log scale so slower
    and faster are symmetric, and the seed makes a report reproducible.
    """
    ga, gb = _groups(baseline), _groups(new)

    def point(groups):
        return float(np.mean([statistic(g) for g in groups]))

    rel = point(gb) / point(ga) - 1.0
    if sum(g.size for g in ga) < MIN_SAMPLES or sum(g.size for g in gb) < MIN_SAMPLES:
        return Change(rel, float("-inf"), float("inf"), confidence)
    rng = np.random.default_rng(seed)
    if len(ga) == 1 and len(gb) == 1:
        def log_ratio(x, y, axis=-1):
            return np.log(statistic(y, axis=axis) / statistic(x, axis=axis))

        ci = stats.bootstrap((ga[0], gb[0]), log_ratio, n_resamples=n_resamples, confidence_level=confidence,
                             method="percentile", vectorized=True, paired=False, rng=rng).confidence_interval
        low, high = ci.low, ci.high
    else:
        def resampled(groups):        # n_resamples values of the side's statistic: processes, then passes
            per_group = np.column_stack([statistic(rng.choice(g, size=(n_resamples, g.size)), axis=1)
                                         for g in groups])
            pick = rng.integers(len(groups), size=(n_resamples, len(groups)))
            return np.take_along_axis(per_group, pick, axis=1).mean(axis=1)

        ratios = np.log(resampled(gb) / resampled(ga))
        low, high = np.percentile(ratios, [50 * (1 - confidence), 50 * (1 + confidence)])
    return Change(rel, float(np.expm1(low)), float(np.expm1(high)), confidence)


def _groups(side) -> list:
    if isinstance(side, (list, tuple)) and side and np.ndim(side[0]) == 1:
        return [np.asarray(g, dtype=float) for g in side if len(g)]
    return [np.asarray(side, dtype=float)]


def widen(change: Change, run_sd: float) -> Change:
    """Add run-to-run spread to a within-run interval. `run_sd`: standard deviation of one run's log median.

    A run's passes say nothing about how much a whole run moves from one night to the next on this
    machine; when the history knows that spread, it is added in quadrature on the log scale, once for
    each of the two runs compared.
    """
    if not np.isfinite(change.low) or not np.isfinite(change.high) or run_sd <= 0:
        return change
    z = stats.norm.ppf(0.5 + change.confidence / 2)
    center = np.log1p(change.rel)
    se = np.hypot((np.log1p(change.high) - np.log1p(change.low)) / (2 * z), np.sqrt(2) * run_sd)
    return Change(change.rel, float(np.expm1(center - z * se)), float(np.expm1(center + z * se)), change.confidence)
