import numpy as np
import pytest

from aio_examples.stats import median_ci, summarize


def test_summary_matches_numpy():
    rng = np.random.default_rng(0)
    x = rng.lognormal(3, 0.2, 500)
    s = summarize(x)
    assert s.n == 500
    assert s.median == pytest.approx(np.median(x))
    assert s.mean == pytest.approx(x.mean())
    assert s.p90 == pytest.approx(np.percentile(x, 90))
    assert s.p99 == pytest.approx(np.percentile(x, 99))
    assert s.stdev == pytest.approx(x.std(ddof=1))
    assert (s.min, s.max) == (x.min(), x.max())
    assert s.ci_low <= s.median <= s.ci_high


def test_median_ci_covers_true_median_about_95_percent():
    rng = np.random.default_rng(1)
    true_median = np.exp(3.0)
    hits = 0
    trials = 400
    for _ in range(trials):
        lo, hi = median_ci(rng.lognormal(3.0, 0.3, 60))
        hits += lo <= true_median <= hi
    assert 0.92 <= hits / trials <= 0.995


def test_ci_narrows_with_more_samples_and_is_unknown_for_tiny_samples():
    rng = np.random.default_rng(2)
    small = summarize(rng.normal(100, 5, 30)).ci_rel_halfwidth
    large = summarize(rng.normal(100, 5, 3000)).ci_rel_halfwidth
    assert large < small / 4
    assert summarize([1.0, 2.0, 3.0]).ci_rel_halfwidth == float("inf")


def test_summary_of_nothing_is_an_error():
    with pytest.raises(ValueError):
        summarize([])
