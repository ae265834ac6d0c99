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
