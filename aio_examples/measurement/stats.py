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
    Then the statistic is the median of the processes' statistics: a process that a neighbour held back,
    or one that ran while the machine was unusually idle, does not move it, and for a handful of
    processes it varies less than their fastest one (0.29 of one process's variance from five processes,
    against 0.45 for the fastest; see median_variance). The bootstrap resamples passes
    (within each process): the interval covers the noise of the passes only. How much a whole process or run
    moves on its own is a separate, larger term that a handful of processes cannot bootstrap; `widen` adds it.
    Both sides are resampled independently (different runs), the ratio is taken on a log scale so slower
    and faster are symmetric, and the seed makes a report reproducible.
    """
    ga, gb = _groups(baseline), _groups(new)

    def point(groups):
        return float(np.median([statistic(g) for g in groups]))

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
        def resampled(groups):        # n_resamples values of the side's statistic, passes resampled per process
            return np.median([statistic(rng.choice(g, size=(n_resamples, g.size)), axis=1) for g in groups], axis=0)

        ratios = np.log(resampled(gb) / resampled(ga))
        low, high = np.percentile(ratios, [50 * (1 - confidence), 50 * (1 + confidence)])
    return Change(rel, float(np.expm1(low)), float(np.expm1(high)), confidence)


def _groups(side) -> list:
    if isinstance(side, (list, tuple)) and side and np.ndim(side[0]) == 1:
        return [np.asarray(g, dtype=float) for g in side if len(g)]
    return [np.asarray(side, dtype=float)]


def widen(change: Change, se_log: float, dof: float | None = None) -> Change:
    """Add between-run noise to a within-run interval, in quadrature on the log scale.

    `se_log`: standard deviation of the log change that whole processes and runs add (what the passes of
    one process cannot show). `dof`: its degrees of freedom when it was estimated from few values; the
    interval then uses Student's t instead of the normal quantile.
    """
    if not np.isfinite(change.low) or not np.isfinite(change.high) or not se_log > 0:
        return change
    z = stats.norm.ppf(0.5 + change.confidence / 2)
    q = stats.t.ppf(0.5 + change.confidence / 2, dof) if dof else z
    center = np.log1p(change.rel)
    se = np.hypot((np.log1p(change.high) - np.log1p(change.low)) / (2 * z), se_log)
    return Change(change.rel, float(np.expm1(center - q * se)), float(np.expm1(center + q * se)), change.confidence)


OUTLIER_SDS = 3.0        # a process this many robust sds from its side's median was disturbed


def process_spread(sides) -> tuple[float, float]:
    """How far one process's log median settles from another's, as a standard deviation, pooled over
    configurations, with its degrees of freedom.

    `sides`: lists of processes' passes, each the same configuration measured in several processes of one
    run. A disturbed process (a neighbour on a shared machine held it back throughout) would inflate a
    plain pooled standard deviation, and a median-based one needs about three times the processes for the
    same precision. So: a robust first guess (the median gap between two processes of a side), then the
    processes more than OUTLIER_SDS of it from their side's median are set aside, and the rest give the
    classical pooled estimate with its degrees of freedom (one fewer than the processes kept, per side). The
    bulk of the processes is what their median varies with. (nan, 0) without any repeats.
    """
    logs = [np.log([np.median(g) for g in groups]) for groups in sides if len(groups) >= 2]
    gaps = [abs(x - y) for side in logs for i, x in enumerate(side) for y in side[i + 1:]]
    if not gaps:
        return float("nan"), 0
    # |x - y| of two normal values has median 0.6745 * sqrt(2) * sd.
    guess = float(np.median(gaps) / (stats.norm.ppf(0.75) * np.sqrt(2)))
    squares, dof = 0.0, 0
    for side in logs:
        kept = side[np.abs(side - np.median(side)) <= OUTLIER_SDS * guess] if guess > 0 else side
        if kept.size >= 2:
            squares += float(np.sum((kept - kept.mean()) ** 2))
            dof += kept.size - 1
    if not dof:
        return guess, 1.0
    return float(np.sqrt(squares / dof)), float(dof)


# Variance of the median of k normal values, in units of one value's variance (to three places).
_MEDIAN_VARIANCE = {1: 1.0, 2: 0.5, 3: 0.448, 4: 0.298, 5: 0.286, 6: 0.215, 7: 0.211, 8: 0.169, 9: 0.166,
                    10: 0.138}


def median_variance(k: int) -> float:
    """How much the median of k processes still moves, relative to one process (pi/2k for large k)."""
    return _MEDIAN_VARIANCE.get(k, np.pi / (2 * k))


MIN_TURNS = 5            # turns a process needs before they tell how much its median moves


def turn_noise(groups, turns) -> tuple[float, float]:
    """How much a side's median moves with the moments its processes measured at, from their turns: the
    sd of the log side median, and its degrees of freedom; (nan, 0) unless every process took MIN_TURNS.

    `groups`: each process's passes; `turns`: each one's [[passes, start], ...] per turn, in order (turns.py,
    a record's `turns`). A process
    that took turns in a sweep measured at moments spread over it, each turn a draw of the machine's
    state: the spread of its turn medians (outliers set aside as in change_spread) gives how much the
    median of its T turns moves (pi/2 sd^2/T), with T - 1 degrees of freedom per process, where two or
    three processes alone would give one or two.
    """
    if not groups:
        return float("nan"), 0
    variances, dof = [], 0.0
    for passes, counts in zip(groups, turns, strict=True):
        if not counts or len(counts) < MIN_TURNS:
            return float("nan"), 0
        medians = np.log([np.median(c) for c in split_rounds(passes, counts) if len(c)])
        sd, d = change_spread(medians)
        variances.append(np.pi / 2 * sd ** 2 / medians.size)
        dof += d
    return float(np.sqrt(median_variance(len(groups)) * np.mean(variances))), dof


def change_spread(log_changes) -> tuple[float, float]:
    """Standard deviation of run-to-run log changes over many configurations, and its degrees of freedom.

    Most configurations do not change between two runs, so how far their changes scatter is the noise of a
    change. Like process_spread: a robust first guess (the MAD), the changes more than OUTLIER_SDS of it
    from the median set aside (the few configurations that really changed), then the classical standard
    deviation of the rest with its n - 1 degrees of freedom. The MAD alone is worth about 0.37 n values,
    which for a dozen configurations made Student's t 2.8 instead of 2.2.
    """
    x = np.asarray(log_changes, dtype=float)
    guess = float(stats.median_abs_deviation(x, scale="normal"))
    kept = x[np.abs(x - np.median(x)) <= OUTLIER_SDS * guess] if guess > 0 else x
    if kept.size < 3:
        return guess, 1.0
    return float(np.std(kept, ddof=1)), float(kept.size - 1)


MIN_PROBE_POINTS = 8     # points (rounds or blocks, over both sides) before a machine slope is estimated
MAX_MACHINE_SLOPE = 2.0  # a model waits at most this much more than a machine reading for the same machine move
PROBE, REFERENCE = 1, 2  # columns of a round: [passes, hand-over probe ms, machine reference ms] (machine/probe.py)


def machine_slope(sides, column: int = PROBE, block: int = 1) -> tuple[float, float]:
    """How much a configuration's log latency moves with a machine reading's log time (machine/probe.py).

    `sides`: per run, the processes as (passes, rounds) with rounds [[passes in the round, probe ms,
    reference ms], ...]; `column` picks the reading. Each `block` consecutive rounds of a process give a
    point (log median of their readings, log median of their passes): a reading's own noise from one round
    to the next flattens a slope fitted on single rounds (errors in x), and blocks average it out where what
    matters moves more slowly than a round. Each side is centred on its own medians first, so a real change
    between the runs does not enter the slope, only how the two move together within a run. Theil-Sen
    (scipy) keeps a few odd points from tilting it. Returns the slope and its standard error (from
    Theil-Sen's 95% interval); (0, 0) when it is not significantly positive (a quiet machine): then nothing
    is taken out.
    """
    xs, ys = [], []
    for side in sides:
        x, y = [], []
        for passes, rounds in side:
            kept = [(chunk, r[column]) for chunk, r in zip(split_rounds(passes, rounds), rounds, strict=True)
                    if r[0] and r[column] > 0]
            for part in np.array_split(np.arange(len(kept)), max(1, len(kept) // block)) if kept else ():
                x.append(np.log(np.median([kept[i][1] for i in part])))
                y.append(np.log(np.median(np.concatenate([kept[i][0] for i in part]))))
        if x:
            xs.append(np.asarray(x) - np.median(x))
            ys.append(np.asarray(y) - np.median(y))
    if not xs or sum(x.size for x in xs) < MIN_PROBE_POINTS:
        return 0.0, 0.0
    x, y = np.concatenate(xs), np.concatenate(ys)
    if not np.ptp(x) > 0:
        return 0.0, 0.0
    with np.errstate(invalid="ignore"):          # its interval is nan for a handful of points: then 0
        fit = stats.theilslopes(y, x, alpha=0.95)
    if not fit.low_slope > 0:
        return 0.0, 0.0
    return float(min(fit.slope, MAX_MACHINE_SLOPE)), float((fit.high_slope - fit.low_slope) / (2 * 1.96))


def without_machine(passes, rounds, slope: float, reference_ms: float, column: int = PROBE) -> np.ndarray:
    """The passes as if the machine reading in `column` had been `reference_ms` in every round: each
    round's passes divided by (reading / reference_ms) ** slope."""
    chunks = split_rounds(np.asarray(passes, dtype=float), rounds)
    return np.concatenate([chunk / (r[column] / reference_ms) ** slope
                           for chunk, r in zip(chunks, rounds, strict=True)])


def split_rounds(passes, rounds) -> list:
    """The passes of each round: `rounds` is [[passes in the round, ...], ...] in order (probe rounds, turns)."""
    return np.split(np.asarray(passes), np.cumsum([r[0] for r in rounds])[:-1])
