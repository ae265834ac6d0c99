"""Compare two runs and say what got slower, with statistics instead of a fixed percentage rule.

A configuration is (model, backend, precision, batch size, threads, instances, allocator, input shape,
machine fingerprint, fp32's fast-math mode, torch's runtime variables: `Result.key`). For each configuration present on both sides the relative change of the median
latency (and of throughput) gets a confidence interval, and a verdict:

* `regression` / `improvement`: beyond the threshold and significant (the interval excludes no change),
  with both sides having met their confidence target;
* `suspicious`: beyond the threshold, but not significant, or a side missed its confidence target;
* `unchanged`: otherwise.

The interval has two terms, added on the log scale. The passes of each process give the within-run term
(a bootstrap). A whole process also settles a percent or more away from the next one (memory layout,
placement, the neighbours of a shared machine), which no number of passes in one process shows; that
between-run term comes from, in order: the history's run-to-run spread of the configuration; for
processes that took turns with the rest of their sweep (drivers/turns.py), how far their turn medians scatter
(stats.turn_noise), unless the changes of the configurations at its thread count scatter wider; the spread of
a run's repeated processes (pooled over configurations of the same backend and thread count, disturbed
processes set aside; such a configuration is judged on the median of its processes), unless the changes
of the matched configurations at its thread count scatter wider (the machine itself moved between the
runs, which repeats within a run cannot show); or that scatter alone (robust, so the few configurations
that really changed do not inflate it). Without any of these the interval is the within-run term only,
and the report says so.

Where every process on both sides read the machine beside its passes (machine/probe.py: a one-core
reference with no framework code in it, and the hand-over probe), the machine's own moves are taken out of
the passes first (take_out_machine), and everything above is computed on what is left.

A status change from ok to anything else is a regression (it no longer runs, or its answer is wrong), the
reverse an improvement. Multi-instance configurations are judged on their aggregate throughput, with the
pooled passes of their instances for the interval.

Accuracy has a verdict of its own, beside the timing one: where both records of a configuration carry task
metrics on a labelled dataset (`accuracy`), a metric that fell by more than its tolerance (default 0.5
points) is an accuracy regression, and fails the comparison as a slowdown does. A faster build that lost
accuracy is then caught even when its timing verdict is an improvement.
"""


import math
from dataclasses import dataclass, field

import numpy as np

from ..core import scores
from ..core.errors import UsageError
from ..core.records import KEY_FIELDS, Result
from ..drivers.worker import split_items
from ..measurement import stats
from .noise import MIN_SPREAD_CONFIGS, Noise, between_run_noise, take_out_machine
from .runs import LIBRARIES, Run

VERDICTS = ("regression", "suspicious", "improvement", "unchanged")
IGNORABLE = ("threads", "batch_size", "instances", "allocator", "shape", "scenario", "dataset", "machine", "fpmath",
             "env_axes")
DEFAULT_THRESHOLD = 0.05
TOGETHER = 0.8           # this share of the configurations moving the same way is the whole run moving
# Largest fall of a task metric (a fraction) that is not an accuracy regression: eager fp32 against itself on
# the same samples scores the same, and a backend that only reorders float sums moves a metric by a few
# samples in a thousand; the runner's fp32 allowance against eager is the same 0.5 points.
DEFAULT_ACCURACY_TOLERANCE = 0.005
EVERY_METRIC = "*"       # the key of a tolerance given without a metric name


def parse_threshold(text: str) -> float:
    """`5%` or `0.05`: the smallest relative change that matters."""
    t = str(text).strip()
    try:
        value = float(t[:-1]) / 100 if t.endswith("%") else float(t)
    except ValueError:
        value = None
    if value is None or not (t.endswith("%") or value < 1) or not 0 < value < 1:
        raise UsageError(f"--threshold {text!r} is invalid; accepted: a percentage like 5% or a fraction like 0.05")
    return value


def parse_accuracy_tolerance(text: str | None) -> dict:
    """`top_1=0.3,map=1.0` (points) -> {metric: fraction}; a bare `0.3` applies to every metric not named."""
    if text is None:
        return {}
    out = {}
    for item in split_items(text, "--accuracy-tolerance"):
        name, _, value = item.rpartition("=")
        try:
            points = float(value)
        except ValueError:
            points = -1.0
        if not (0 <= points < 100) or ("=" in item and not name.replace("_", "").isalnum()):
            raise UsageError(f"--accuracy-tolerance {text!r} is invalid at {item!r}; accepted: a comma list of "
                             "METRIC=POINTS like top_1=0.3,map=1.0, or POINTS for every metric (0 <= POINTS < 100)")
        out[name if "=" in item else EVERY_METRIC] = points / 100
    return out


def tolerance_of(tolerances: dict, metric: str) -> float:
    return tolerances.get(metric, tolerances.get(EVERY_METRIC, DEFAULT_ACCURACY_TOLERANCE))


def check_ignore(ignore) -> None:
    bad = [f for f in ignore if f not in IGNORABLE]
    if bad:
        raise UsageError(f"--ignore {','.join(bad)!r} is not a configuration field; accepted: {', '.join(IGNORABLE)}")


@dataclass
class Comparison:
    baseline: Run
    new: Run
    threshold: float
    confidence: float
    ignore: tuple = ()
    rows: list = field(default_factory=list)
    missing: list = field(default_factory=list)     # configurations only in the baseline
    added: list = field(default_factory=list)       # configurations only in the new run
    notes: list = field(default_factory=list)       # machine / library differences, a run moving as a whole: stated first
    accuracy_tolerance: dict = field(default_factory=dict)   # metric (or EVERY_METRIC) -> fraction; else the default

    @property
    def counts(self) -> dict:
        counts = {v: 0 for v in VERDICTS}
        for row in self.rows:
            counts[row["verdict"]] += 1
        return {**counts, "missing": len(self.missing), "new": len(self.added),
                "accuracy_regression": self.accuracy_counts["regression"]}

    @property
    def tolerances(self) -> dict:
        """The accuracy tolerances in effect (fractions): `default` for every metric not named, then the named."""
        named = dict(self.accuracy_tolerance)
        return {"default": named.pop(EVERY_METRIC, DEFAULT_ACCURACY_TOLERANCE), **named}

    @property
    def accuracy_counts(self) -> dict:
        """Accuracy verdicts, over the configurations whose both sides carry a common task metric."""
        counts = {v: 0 for v in VERDICTS}
        for row in self.rows:
            if row.get("accuracy"):
                counts[row["accuracy"]["verdict"]] += 1
        return counts

    @property
    def exit_code(self) -> int:
        return 1 if self.counts["regression"] or self.counts["accuracy_regression"] else 0


def compare(baseline: Run, new: Run, threshold: float = DEFAULT_THRESHOLD, confidence: float = 0.95,
            ignore=(), run_noise: dict | None = None, accuracy_tolerance: dict | None = None) -> Comparison:
    """Match configurations and judge each one. `run_noise`: key -> (run-to-run sd of log medians, its
    degrees of freedom), from the history. `accuracy_tolerance`: from parse_accuracy_tolerance."""
    check_ignore(ignore)
    if not 0.5 <= confidence < 1:
        raise UsageError(f"--confidence {confidence!r} is invalid; accepted: 0.5 to 0.999")
    out = Comparison(baseline, new, threshold, confidence, tuple(ignore),
                     accuracy_tolerance=dict(accuracy_tolerance or {}))
    out.notes = _differences(baseline, new, ignore)
    a, b = baseline.configurations(ignore), new.configurations(ignore)
    matched = sorted(a.keys() & b.keys(), key=str)
    machine = take_out_machine(a, b, matched)
    # The history holds raw medians: where the machine's share is taken out, its spread would count the
    # machine's moves back in, so these configurations take their noise from the (adjusted) runs themselves.
    noise = between_run_noise(a, b, matched, {k: v for k, v in (run_noise or {}).items() if k not in machine})
    for key in matched:
        n = noise.get(key)
        if key in machine and machine[key]["se_log"] > 0:      # the adjustment's own uncertainty, added
            se = float(np.hypot(n.se, machine[key]["se_log"])) if n else machine[key]["se_log"]
            n = Noise(se, n.dof if n else None, n.kind if n else "machine",
                      (n.source if n else "nothing else") + f", and the machine slopes' error "
                      f"({100 * machine[key]['se_log']:.2f}%)")
        row = judge(key, a[key], b[key], threshold, confidence, n)
        if key in machine:
            m = machine[key]
            row["machine_readings"] = m
            if row["latency_change"]:
                row["why"] += " (" + ", ".join(f"machine {name} {pct(r['change'])} x{r['slope']:.2f}"
                                               for name, r in m["readings"].items()) \
                    + f": raw change {pct(m['raw_change'])})"
        row["accuracy"] = judge_accuracy(a[key]["record"], b[key]["record"], out.accuracy_tolerance)
        out.rows.append(row)
    together = _moved_together(out.rows, threshold)
    if together:
        out.notes.append(together)
    unused = _unused_tolerances(out)
    if unused:
        out.notes.append(unused)
    out.missing = [_describe(k, a[k]["record"]) for k in sorted(a.keys() - b.keys(), key=str)]
    out.added = [_describe(k, b[k]["record"]) for k in sorted(b.keys() - a.keys(), key=str)]
    return out


def _differences(baseline: Run, new: Run, ignore) -> list[str]:
    notes = []
    ma, mb = baseline.machines(), new.machines()
    if ma and mb and set(ma) != set(mb):
        how = ("compared anyway (--ignore machine)" if "machine" in ignore
               else "configurations only match on the same machine")
        notes.append(f"Different machines: baseline {'; '.join(ma.values())} vs new {'; '.join(mb.values())}: {how}.")
    va, vb = baseline.versions(), new.versions()
    changed = [f"{lib} {'/'.join(sorted(va.get(lib, {'-'})))} -> {'/'.join(sorted(vb.get(lib, {'-'})))}"
               for lib in LIBRARIES if va.get(lib) != vb.get(lib)]
    if changed:
        notes.append("Library versions differ: " + ", ".join(changed) + ".")
    return notes


def _moved_together(rows: list[dict], threshold: float) -> str | None:
    """A note when the configurations moved together, by at least half the threshold in the median.

    Noise moves each configuration its own way; a machine that runs slower or faster as a whole between
    the runs (measured here: all 24 configurations of a repeat of the same build faster, by up to 12%,
    the 1-thread ones too, which the probe does not adjust) moves them all at once, and so does a build
    that slows everything down. Nothing within the two runs tells these apart, so the report says so first.
    """
    per_threads = {}
    for r in rows:
        if r["latency_change"]:
            per_threads.setdefault(r["threads"], []).append(r["latency_change"]["rel"])
    changes = [ch for chs in per_threads.values() for ch in chs]
    if len(changes) < MIN_SPREAD_CONFIGS:
        return None
    median = float(np.median(changes))
    same_way = sum(np.sign(ch) == np.sign(median) for ch in changes)
    if abs(median) < threshold / 2 or same_way < TOGETHER * len(changes):
        return None
    by = ", ".join(f"{t} thread{'s' * (t != 1)} {pct(float(np.median(v)))}" for t, v in sorted(per_threads.items()))
    return (f"The configurations moved together: {same_way} of {len(changes)} {'slower' if median > 0 else 'faster'}, "
            f"median {pct(median)} ({by}). A machine that moved between the runs looks like this as much as a "
            f"build that did: rerun the baseline's build on this machine before trusting these verdicts.")


def _unused_tolerances(c: Comparison) -> str | None:
    """A tolerance named for a metric no configuration carries on both sides is most likely a typo: said first."""
    compared = {m for r in c.rows if r.get("accuracy") for m in r["accuracy"]["metrics"]}
    unused = sorted(set(c.accuracy_tolerance) - compared - {EVERY_METRIC})
    if not unused:
        return None
    return (f"--accuracy-tolerance names {', '.join(unused)}, which no configuration carries on both sides; "
            f"metrics compared: {', '.join(sorted(compared)) or 'none'}.")


def _describe(key: tuple, record: dict) -> dict:
    return {**dict(zip(KEY_FIELDS, key)), "status": record.status}


def judge(key: tuple, base: dict, new: dict, threshold: float, confidence: float,
          noise: Noise | None = None) -> dict:
    """The verdict for one configuration present on both sides."""
    ra, rb = base["record"], new["record"]
    row = {**dict(zip(KEY_FIELDS, key)), "baseline_status": ra.status, "new_status": rb.status,
           "baseline_ms": base["median_ms"], "new_ms": new["median_ms"], "latency_change": None,
           "throughput_change": None, "baseline_confident": base["confident"], "new_confident": new["confident"],
           "repeats": [base["repeats"], new["repeats"]],
           "noise": {"se": noise.se, "dof": noise.dof, "kind": noise.kind, "source": noise.source} if noise else None}
    if ra.status != "ok" or rb.status != "ok":
        if ra.status == rb.status:
            return {**row, "verdict": "unchanged", "why": f"{ra.status} on both sides"}
        if ra.status == "ok":
            return {**row, "verdict": "regression", "why": f"status ok -> {rb.status}: {rb.reason or ''}"}
        if rb.status == "ok":
            return {**row, "verdict": "improvement", "why": f"status {ra.status} -> ok"}
        return {**row, "verdict": "unchanged", "why": f"status {ra.status} -> {rb.status}"}
    seed = int.from_bytes(str(key).encode()[-8:].rjust(8, b"\0"), "little") % 2**32
    aggregate = bool((rb.instance or {}).get("aggregate"))
    has_samples = base["groups"] and new["groups"]
    lat = stats.relative_change(base["groups"], new["groups"], np.median, confidence, seed=seed) \
        if has_samples else None
    mean = stats.relative_change(base["groups"], new["groups"], np.mean, confidence, seed=seed) \
        if has_samples else None
    tp = _throughput_change(base["throughput"], new["throughput"], mean, confidence)
    if noise:
        lat = stats.widen(lat, noise.se, noise.dof) if lat else None
        tp = stats.widen(tp, noise.se, noise.dof) if tp else None
    row["latency_change"] = lat.to_dict() if lat else None
    row["throughput_change"] = tp.to_dict() if tp else None
    # Slower = positive: latency up, or (multi-instance) throughput down.
    judged = _negated(tp) if aggregate else lat
    if judged is None:
        return {**row, "verdict": "unchanged", "why": "no samples to compare"}
    confident = row["baseline_confident"] and row["new_confident"] or aggregate
    verdict = _verdict(judged, threshold, confident, "throughput" if aggregate else "median latency")
    if noise is None and verdict["verdict"] != "unchanged":
        verdict["why"] += " (interval from the passes only: no repeats, history or other configurations to " \
                          "tell how much a run moves)"
    return {**row, **verdict}


def judge_accuracy(base: Result, new: Result, tolerances: dict) -> dict | None:
    """The accuracy verdict of one configuration, apart from its timing; None when the two records carry no
    task metric in common.

    A metric that fell by more than its tolerance is a regression, one that rose by more an improvement.
    Metrics scored on different samples (the datasets' digests differ) say nothing about the build: suspicious.
    """
    ma, mb = ((r.accuracy or {}).get("metrics") or {} for r in (base, new))
    common = [m for m in mb if m in ma and ma[m] is not None and mb[m] is not None]
    if not common:
        return None
    # Rounded: 0.712 - 0.707 is 0.0050000000000000044 in floats, and a fall of exactly the tolerance is within it.
    metrics = {m: {"baseline": ma[m], "new": mb[m], "change": round(mb[m] - ma[m], 9),
                   "loss": round(scores.loss(m, ma[m], mb[m]), 9), "tolerance": tolerance_of(tolerances, m)}
               for m in common}
    out = {"metrics": metrics, "samples": [(r.accuracy or {}).get("samples") for r in (base, new)]}
    da, db = (((r.accuracy or {}).get("dataset") or {}).get("digest") for r in (base, new))
    if da and db and da != db:
        return {**out, "verdict": "suspicious",
                "why": f"scored on different samples (dataset digest {da[:10]} vs {db[:10]}): not comparable"}
    fell = [m for m, x in metrics.items() if x["loss"] > x["tolerance"]]         # worse: lower, or higher for
    rose = [m for m, x in metrics.items() if x["loss"] < -x["tolerance"]]        # an error rate (core/scores.py)
    judged = fell or rose
    if not judged:
        return {**out, "verdict": "unchanged", "why": "every metric within its tolerance"}
    return {**out, "verdict": "regression" if fell else "improvement",
            "why": "; ".join(f"{accuracy_line(m, metrics[m])}, beyond its tolerance of "
                             f"{scores.shown_loss(m, metrics[m]['tolerance'])}" for m in judged)}


def accuracy_line(metric: str, x: dict) -> str:
    """`top_1 71.2 -> 70.4 (-0.8 pt)`: a metric's change in points, as reports show it (a perplexity's in %)."""
    if metric in scores.UNBOUNDED:
        return (f"{metric} {scores.shown(metric, x['baseline'])} -> {scores.shown(metric, x['new'])} "
                f"({100 * x['change'] / x['baseline']:+.1f}%)" if x["baseline"] else f"{metric} -> {x['new']}")
    return f"{metric} {100 * x['baseline']:.1f} -> {100 * x['new']:.1f} ({100 * x['change']:+.1f} pt)"


def _verdict(ch: stats.Change, threshold: float, confident: bool, what: str) -> dict:
    """Regression: at least `threshold` slower and significantly so (the interval excludes no change).

    A side that missed its confidence target measured less precisely than asked: then only a change whose
    whole interval clears the threshold counts, and anything less beyond it is suspicious.
    """
    slower, faster = ch.rel >= threshold, ch.rel <= -threshold
    significant = ch.low > 0 or ch.high < 0
    if not (slower or faster):
        return {"verdict": "unchanged", "why": f"{what} {pct(ch.rel)}" +
                (", significant but below the threshold" if significant else ", within noise")}
    clears = ch.low >= threshold if slower else ch.high <= -threshold
    note = "" if confident else " (a side missed its confidence target)"
    if significant and (confident or clears):
        return {"verdict": "regression" if slower else "improvement",
                "why": f"{what} {pct(ch.rel)}, beyond the threshold and significant{note}"}
    why = "the interval includes no change" if not significant else \
        "a side missed its confidence target and the interval reaches inside the threshold"
    return {"verdict": "suspicious", "why": f"{what} {pct(ch.rel)}, but {why}"}


def _throughput_change(ta, tb, mean: stats.Change | None, confidence: float) -> stats.Change | None:
    """Throughput change from the recorded values; its interval from the mean latency's (throughput ~ 1/mean)."""
    if not ta or not tb:
        return None
    rel = tb / ta - 1.0
    if mean is None or not math.isfinite(mean.low):
        return stats.Change(rel, float("-inf"), float("inf"), confidence)
    # Mean latency up by x means throughput down by 1/(1+x); keep the recorded point, move the bounds alike.
    scale = (1 + rel) * (1 + mean.rel)
    return stats.Change(rel, scale / (1 + mean.high) - 1, scale / (1 + mean.low) - 1, mean.confidence)


def _negated(ch: stats.Change | None) -> stats.Change | None:
    """A throughput change as a slowdown: throughput down 10% = 1/0.9 - 1 = +11% slower."""
    if ch is None:
        return None
    def inv(x):
        return 1 / (1 + x) - 1 if x > -1 else float("inf")

    return stats.Change(inv(ch.rel), inv(ch.high), inv(ch.low), ch.confidence)


def pct(x) -> str:
    return f"{100 * x:+.1f}%"
