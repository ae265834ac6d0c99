"""Compare two runs and say what got slower, with statistics instead of a fixed percentage rule.

A configuration is (model, backend, precision, batch size, threads, instances, allocator, input shape,
machine fingerprint). For each configuration present on both sides the relative change of the median
latency (and of throughput) gets a confidence interval, and a verdict:

* `regression` / `improvement`: beyond the threshold and significant (the interval excludes no change),
  with both sides having met their confidence target;
* `suspicious`: beyond the threshold, but not significant, or a side missed its confidence target;
* `unchanged`: otherwise.

The interval has two terms, added on the log scale. The passes of each process give the within-run term
(a bootstrap). A whole process also settles a percent or more away from the next one (memory layout,
placement, the neighbours of a shared machine), which no number of passes in one process shows; that
between-run term comes from, in order: the history's run-to-run spread of the configuration; for
processes that took turns with the rest of their sweep (turns.py), how far their turn medians scatter
(stats.turn_noise), unless the changes of the configurations at its thread count scatter wider; the spread of
a run's repeated processes (pooled over configurations of the same backend and thread count, disturbed
processes set aside; such a configuration is judged on the median of its processes), unless the changes
of the matched configurations at its thread count scatter wider (the machine itself moved between the
runs, which repeats within a run cannot show); or that scatter alone (robust, so the few configurations
that really changed do not inflate it). Without any of these the interval is the within-run term only,
and the report says so.

Where every process on both sides read the machine beside its passes (machine_probe.py: a one-core
reference with no framework code in it, and the hand-over probe), the machine's own moves are taken out of
the passes first (take_out_machine), and everything above is computed on what is left.

A status change from ok to anything else is a regression (it no longer runs, or its answer is wrong), the
reverse an improvement. Multi-instance configurations are judged on their aggregate throughput, with the
pooled passes of their instances for the interval.
"""

import html
import json
import math
from collections import Counter
from dataclasses import dataclass, field
from datetime import UTC, datetime
from functools import cached_property
from pathlib import Path

import numpy as np

from ..core import records as res
from ..core.errors import UsageError
from ..machine.environment import machine_description, machine_fingerprint
from ..measurement import stats

VERDICTS = ("regression", "suspicious", "improvement", "unchanged")
KEY_FIELDS = ("model", "backend", "precision", "batch_size", "threads", "instances", "allocator", "shape", "machine")
IGNORABLE = ("threads", "batch_size", "instances", "allocator", "shape", "machine")
REQUIRED = ("model", "backend", "precision", "batch_size", "threads", "status")
DEFAULT_THRESHOLD = 0.05
LIBRARIES = ("torch", "torchvision", "transformers", "numpy", "onnxruntime", "openvino")
MIN_NOISE_DOF = 4        # repeats: degrees of freedom a noise group needs, fewer and all are pooled
MIN_SPREAD_CONFIGS = 6   # matched configurations before their changes' spread is a noise estimate ...
SPREAD_PER_THREAD_COUNT = 12  # ... and per thread count from this many (fewer: all pooled)
TOGETHER = 0.8           # this share of the configurations moving the same way is the whole run moving


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


@dataclass
class Run:
    """One side of a comparison: the records of a run and where they came from."""

    label: str
    records: list[dict]

    def machines(self) -> dict:
        """fingerprint -> description, over the records that carry an environment."""
        return {machine_fingerprint(r["env"]): machine_description(r["env"])
                for r in self.records if machine_fingerprint(r.get("env"))}

    def versions(self) -> dict:
        """library -> the set of versions its records were measured with."""
        seen = {}
        for r in self.records:
            for lib, v in ((r.get("env") or {}).get("versions") or {}).items():
                if lib in LIBRARIES and v:
                    seen.setdefault(lib, set()).add(v)
        return seen

    @property
    def started_at(self) -> str | None:
        """When its first record was made (ISO timestamps sort as text)."""
        return min((r["timestamp"] for r in self.records if r.get("timestamp")), default=None)

    @property
    def machine(self) -> str | None:
        """The fingerprint most of its records carry."""
        machines = [m for m in (machine_fingerprint(r.get("env")) for r in self.records) if m]
        return max(set(machines), key=machines.count, default=None)

    def configurations(self, ignore=()) -> dict:
        """key -> the configuration's records in this run: more than one are repeats, each its own process.

        Each entry: `record` (the one shown: the first that did not run ok, else the last), `groups` (the
        passes of each ok record; a multi-instance aggregate's are its instances' passes, pooled), `met`
        (whether each of those met its confidence target), `rounds` (each one's machine probe rounds, or
        None), `median_ms` and `throughput` (the median of
        the ok records, see stats.relative_change) and `confident` (most of its ok records, all of one, met
        their confidence target).
        """
        machines = [machine_fingerprint(r.get("env")) for r in self.records]
        usual = self.machine
        pooled = {}
        for r in self.records:
            group = (r.get("instance") or {}).get("group")
            if group and (r.get("instance") or {}).get("index") is not None:
                pooled.setdefault(group, []).extend(r.get("samples_ms") or [])
        by_key = {}
        for r, machine in zip(self.records, machines):
            if (r.get("instance") or {}).get("index") is not None:
                continue
            # A record whose process died carries no environment: it was measured where its run was.
            by_key.setdefault(config_key(r, machine or usual, ignore), []).append(r)
        configs = {}
        for key, records in by_key.items():
            ok = [r for r in records if r["status"] == "ok"]
            bad = [r for r in records if r["status"] != "ok"]
            groups, met, rounds, turns = [], [], [], []
            for r in ok:
                instance = r.get("instance") or {}
                samples = pooled.get(instance.get("group")) if instance.get("aggregate") else r.get("samples_ms")
                if samples:
                    groups.append(np.asarray(samples, dtype=float))
                    met.append(confident(r))
                    probe = (r.get("probe") or {}).get("rounds")
                    rounds.append(probe if probe and sum(x[0] for x in probe) == len(samples) else None)
                    took = r.get("turns")
                    turns.append(took if took and sum(n for n, _ in took) == len(samples) else None)
            medians = [(r.get("latency_ms") or {}).get("median") for r in ok]
            rates = [(r.get("throughput") or {}).get("value") for r in ok]
            configs[key] = {
                "record": bad[0] if bad else records[-1], "groups": groups, "met": met, "rounds": rounds,
                "turns": turns,
                "repeats": len(records),
                "median_ms": float(np.median(medians)) if ok and all(medians) else None,
                "throughput": float(np.median(rates)) if ok and all(rates) else None,
                # With several processes their median is what is judged: most must be confident.
                "confident": bool(ok) and 2 * sum(confident(r) for r in ok) > len(ok)}
        return configs


def confident(record: dict) -> bool:
    """Whether a process measured as precisely as asked. One that took turns with others in a sweep
    (turns.py) ran as long as the sweep said, on passes from many moments of the machine: a confidence
    target on its passes, as if they were alike, says nothing about it, and how far its median moves is
    judged from the spread of processes and runs like any other's."""
    return bool(record.get("turns")) or bool(record.get("confidence_met"))


def config_key(r: dict, machine: str | None, ignore=()) -> tuple:
    shape = {k: v for k, v in sorted((r.get("input_shape") or {}).items()) if k != "batch_size"}
    values = {"model": r["model"], "backend": r["backend"], "precision": r["precision"],
              "batch_size": r["batch_size"], "threads": r["threads"], "instances": r.get("instances", 1),
              "allocator": (r.get("env") or {}).get("allocator") or "default",
              "shape": ",".join(f"{k}={v}" for k, v in shape.items()), "machine": machine or "unknown"}
    return tuple("*" if k in ignore else values[k] for k in KEY_FIELDS)


def load_run(ref: str, history_path=None) -> Run:
    """A results folder (every results.jsonl below it), a results.jsonl file, or `history:ID|latest`."""
    if str(ref).startswith("history:"):
        from .history import History

        with History.open(history_path, create=False) as h:
            return h.run(str(ref).split(":", 1)[1])
    p = Path(ref)
    files = sorted(p.rglob("results.jsonl")) if p.is_dir() else [p] if p.is_file() else []
    if not files:
        raise UsageError(f"{str(ref)!r} is neither a results.jsonl file nor a folder holding one; accepted: "
                         "result files or folders, or history:ID / history:latest")
    records = [r for f in files for r in res.load(f, require=REQUIRED)]
    if not records:
        raise UsageError(f"{str(ref)!r} holds no records")
    return Run(str(ref), records)


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

    @property
    def counts(self) -> dict:
        counts = {v: 0 for v in VERDICTS}
        for row in self.rows:
            counts[row["verdict"]] += 1
        return {**counts, "missing": len(self.missing), "new": len(self.added)}

    @property
    def exit_code(self) -> int:
        return 1 if self.counts["regression"] else 0


def compare(baseline: Run, new: Run, threshold: float = DEFAULT_THRESHOLD, confidence: float = 0.95,
            ignore=(), run_noise: dict | None = None) -> Comparison:
    """Match configurations and judge each one. `run_noise`: key -> (run-to-run sd of log medians, its
    degrees of freedom), from the history."""
    bad = [f for f in ignore if f not in IGNORABLE]
    if bad:
        raise UsageError(f"--ignore {','.join(bad)!r} is not a configuration field; accepted: {', '.join(IGNORABLE)}")
    if not 0.5 <= confidence < 1:
        raise UsageError(f"--confidence {confidence!r} is invalid; accepted: 0.5 to 0.999")
    out = Comparison(baseline, new, threshold, confidence, tuple(ignore))
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
                row["why"] += " (" + ", ".join(f"machine {name} {_pct(r['change'])} x{r['slope']:.2f}"
                                               for name, r in m["readings"].items()) \
                    + f": raw change {_pct(m['raw_change'])})"
        out.rows.append(row)
    together = _moved_together(out.rows, threshold)
    if together:
        out.notes.append(together)
    out.missing = [_describe(k, a[k]["record"]) for k in sorted(a.keys() - b.keys(), key=str)]
    out.added = [_describe(k, b[k]["record"]) for k in sorted(b.keys() - a.keys(), key=str)]
    return out


# The machine readings taken out of a configuration's passes, in this order: (round column, name, fewest
# threads, rounds a point of its slope). The reference (one core's speed, nothing of the framework in it) at
# every thread count, its slope fitted on blocks of ten rounds: the machine's moves it follows last minutes,
# and one round's reading is noisy enough to flatten a slope fitted round by round (seven processes of ten
# configurations here: their medians' spread, 6.8-7.3%, fell to 3.5-3.7% with slopes from single rounds,
# 1.5-1.6% from blocks of ten). Then the hand-over probe, on what is left, where there are cores to hand work
# between, round by round: the hand-over moves within seconds.
MACHINE_READINGS = ((stats.REFERENCE, "reference", 1, 10), (stats.PROBE, "probe", 2, 1))
BACKFIT = 3              # passes over the readings, each slope refitted with the others' shares taken out


@dataclass
class _Plan:
    """One configuration's machine readings, both sides: what take_out_machine fits and takes out."""

    threads: int
    used: list           # the round columns both sides carry
    sides: list          # per side: (each process's passes, each process's rounds)
    logs: dict           # column -> per side, the log readings of all its rounds

    @cached_property
    def centres(self) -> dict:
        """column -> the reading's median over both sides: what it is taken out relative to."""
        return {c: float(np.exp(np.median(np.concatenate(v)))) for c, v in self.logs.items()}


def take_out_machine(a: dict, b: dict, keys: list) -> dict:
    """Where every process on both sides carries a machine reading (machine_probe.py): take the machine's
    moves out of the configuration's passes, in place, relative to each reading's median over both sides.

    A configuration's slope comes from how its passes followed the reading within each run. Where that is
    not significant (the machine held still within each run, whatever it did between them), the slope of
    all the configurations at its thread count together is used: each alone may have too little spread
    in the reading to show it. With two readings, what one does not take out is noise to the other's slope
    (at two threads the hand-over moves the passes more from one round to the next than the machine's
    computing speed does), which flattens it; so each slope is refitted a few times with the other's share
    taken out (backfitting). key -> {raw_change, se_log, readings: name -> {slope, pooled, change, se_log}}
    for every configuration that carried one (a slope of 0: its latency did not follow that reading, and
    nothing was taken out). se_log is what the slopes' own errors do to the change: the farther a reading
    moved between the runs, the more they matter. Across thread counts nothing is taken out: the slopes
    differ, and the probe reads different work."""
    plans = {}
    for key in keys:
        ea, eb = a[key], b[key]
        if not ea["median_ms"] or not eb["median_ms"] or ea["record"]["threads"] != eb["record"]["threads"]:
            continue
        used = [column for column, _, fewest, _ in MACHINE_READINGS
                if ea["record"]["threads"] >= fewest and _carried(ea, eb, column)]
        if used:
            sides = [(e["groups"], e["rounds"]) for e in (ea, eb)]
            logs = {c: [np.log([r[c] for rounds in side[1] for r in rounds]) for side in sides] for c in used}
            plans[key] = _Plan(ea["record"]["threads"], used, sides, logs)
    slopes = {key: {c: (0.0, 0.0, False) for c in plan.used} for key, plan in plans.items()}
    for _ in range(BACKFIT if any(len(plan.used) > 1 for plan in plans.values()) else 1):
        for column, _, _, block in MACHINE_READINGS:
            own, together = {}, {}
            for key, plan in plans.items():
                if column in plan.used:
                    others = {c: s for c, s in slopes[key].items() if c != column}
                    fitted = [list(zip(_without(groups, rounds, others, plan.centres), rounds, strict=True))
                              for groups, rounds in plan.sides]
                    own[key] = stats.machine_slope(fitted, column, block)
                    together.setdefault(plan.threads, []).extend(fitted)
            pooled = {threads: stats.machine_slope(fitted, column, block) for threads, fitted in together.items()}
            for key, (slope, se) in own.items():
                slopes[key][column] = (slope, se, False) if slope > 0 else (*pooled[plans[key].threads], True)
    out = {}
    for key, plan in plans.items():
        ea, eb = a[key], b[key]
        raw = eb["median_ms"] / ea["median_ms"] - 1
        for e, (groups, rounds) in zip((ea, eb), plan.sides, strict=True):
            e["groups"] = _without(groups, rounds, slopes[key], plan.centres)
            median = float(np.median([np.median(g) for g in e["groups"]]))
            if e["throughput"]:
                e["throughput"] *= e["median_ms"] / median
            e["median_ms"] = median
        readings = {}
        for column, name, _, _ in MACHINE_READINGS:
            if column in plan.used:
                slope, se, pooled = slopes[key][column]
                moved = float(np.median(plan.logs[column][1]) - np.median(plan.logs[column][0]))
                readings[name] = {"slope": slope, "pooled": pooled, "change": float(np.expm1(moved)),
                                  "se_log": se * abs(moved)}
        out[key] = {"raw_change": raw, "readings": readings,
                    "se_log": float(np.sqrt(sum(r["se_log"] ** 2 for r in readings.values())))}
    return out


def _carried(ea: dict, eb: dict, column: int) -> bool:
    """Whether every process on both sides read `column` in every round."""
    return all(e["groups"] and all(rounds and all(len(r) > column and r[column] for r in rounds)
                                   for rounds in e["rounds"]) for e in (ea, eb))


def _without(groups: list, rounds: list, slopes: dict, centres: dict) -> list:
    """Each process's passes with the shares of the readings (column -> (slope, ...)) taken out."""
    out = []
    for passes, process_rounds in zip(groups, rounds, strict=True):
        for column, (slope, *_) in slopes.items():
            if slope > 0:
                passes = stats.without_machine(passes, process_rounds, slope, centres[column], column)
        out.append(passes)
    return out


@dataclass(frozen=True)
class Noise:
    """The between-run term of a change's interval: sd of the log change, its degrees of freedom, its source."""

    se: float
    dof: float | None
    kind: str            # history | turns | repeats | spread | machine
    source: str


def noise_group(key: tuple) -> tuple:
    """Configurations whose processes are disturbed alike: the same backend at the same thread count (a
    process using every core is stalled by any neighbour; one using fewer has room to spare)."""
    return key[KEY_FIELDS.index("backend")], key[KEY_FIELDS.index("threads")]


def _threads(key: tuple) -> int:
    """Configurations whose changes scatter alike: those at the same thread count."""
    return key[KEY_FIELDS.index("threads")]


def between_run_noise(a: dict, b: dict, keys: list, run_noise: dict) -> dict:
    """key -> Noise for the matched configurations, from the best source each has (see the module's doc)."""
    # Repeats: processes of one configuration in one run, pooled over the configurations of a noise group
    # (over all of them when a group has too few).
    sides = {}
    for configs in (a, b):
        for key, c in configs.items():
            if len(c["groups"]) >= 2:
                sides.setdefault(noise_group(key), []).append(c["groups"])
    every = stats.process_spread([side for group in sides.values() for side in group])
    pooled = {name: own if own[1] >= MIN_NOISE_DOF else every
              for name, own in ((name, stats.process_spread(group)) for name, group in sides.items())}
    # How far the matched configurations' changes scatter, robustly, per thread count (or over all of them).
    changes = {}
    for key in keys:
        ma, mb = a[key]["median_ms"], b[key]["median_ms"]
        if ma and mb and a[key]["groups"] and b[key]["groups"]:
            changes.setdefault(_threads(key), []).append(np.log(mb / ma))
    all_changes = [v for vs in changes.values() for v in vs]
    spread = {}
    for name, vs in changes.items():
        vs = vs if len(vs) >= SPREAD_PER_THREAD_COUNT else all_changes
        if len(vs) >= MIN_SPREAD_CONFIGS:
            spread[name] = (stats.change_spread(vs), len(vs))
    out = {}
    for key in keys:
        ka, kb = len(a[key]["groups"]), len(b[key]["groups"])
        sd, dof = pooled.get(noise_group(key), (float("nan"), 0))
        turns = [stats.turn_noise(c["groups"], c["turns"]) for c in (a[key], b[key])]
        (wide, wide_dof), n = spread.get(_threads(key), ((0.0, 0), 0))
        if run_noise.get(key):
            run_sd, run_dof = run_noise[key]
            out[key] = Noise(float(np.sqrt(2) * run_sd), run_dof, "history",
                             f"the history's run-to-run spread (sd {100 * run_sd:.2f}%, {run_dof:.0f} df)")
        # Turns and repeats within a run cannot see the machine move between runs; the changes of the other
        # configurations can: the wider of the two is taken.
        elif all(d > 0 for _, d in turns):    # processes that took turns: their own turns tell their noise
            se = float(np.hypot(turns[0][0], turns[1][0]))
            out[key] = _unless_wider(Noise(se, turns[0][1] + turns[1][1], "turns",
                                           f"the processes' turns (sd {100 * se:.2f}% of the change)"),
                                     wide, wide_dof, n)
        elif dof > 0 and ka and kb:           # few degrees of freedom widen it through Student's t
            se = float(sd * np.sqrt(stats.median_variance(ka) + stats.median_variance(kb)))
            out[key] = _unless_wider(Noise(se, dof, "repeats",
                                           f"repeated processes (sd {100 * sd:.2f}% a process, {dof:.0f} df)"),
                                     wide, wide_dof, n)
        elif _threads(key) in spread:
            (sd, dof), n = spread[_threads(key)]
            out[key] = Noise(sd, dof, "spread", f"the spread of {n} configurations' changes (sd {100 * sd:.2f}%)")
    return out


def _unless_wider(own: Noise, wide: float, wide_dof: float, n: int) -> Noise:
    """A configuration's own noise, or the spread of `n` configurations' changes where that is wider."""
    if own.se >= wide:
        return own
    return Noise(wide, wide_dof, "spread", f"the spread of {n} configurations' changes "
                 f"(sd {100 * wide:.2f}%, wider than the {own.kind}' {100 * own.se:.2f}%)")


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
    by = ", ".join(f"{t} thread{'s' * (t != 1)} {_pct(float(np.median(v)))}" for t, v in sorted(per_threads.items()))
    return (f"The configurations moved together: {same_way} of {len(changes)} {'slower' if median > 0 else 'faster'}, "
            f"median {_pct(median)} ({by}). A machine that moved between the runs looks like this as much as a "
            f"build that did: rerun the baseline's build on this machine before trusting these verdicts.")


def _describe(key: tuple, record: dict) -> dict:
    return {**dict(zip(KEY_FIELDS, key)), "status": record["status"]}


def judge(key: tuple, base: dict, new: dict, threshold: float, confidence: float,
          noise: Noise | None = None) -> dict:
    """The verdict for one configuration present on both sides."""
    ra, rb = base["record"], new["record"]
    row = {**dict(zip(KEY_FIELDS, key)), "baseline_status": ra["status"], "new_status": rb["status"],
           "baseline_ms": base["median_ms"], "new_ms": new["median_ms"], "latency_change": None,
           "throughput_change": None, "baseline_confident": base["confident"], "new_confident": new["confident"],
           "repeats": [base["repeats"], new["repeats"]],
           "noise": {"se": noise.se, "dof": noise.dof, "kind": noise.kind, "source": noise.source} if noise else None}
    if ra["status"] != "ok" or rb["status"] != "ok":
        if ra["status"] == rb["status"]:
            return {**row, "verdict": "unchanged", "why": f"{ra['status']} on both sides"}
        if ra["status"] == "ok":
            return {**row, "verdict": "regression", "why": f"status ok -> {rb['status']}: {rb.get('reason') or ''}"}
        if rb["status"] == "ok":
            return {**row, "verdict": "improvement", "why": f"status {ra['status']} -> ok"}
        return {**row, "verdict": "unchanged", "why": f"status {ra['status']} -> {rb['status']}"}
    seed = int.from_bytes(str(key).encode()[-8:].rjust(8, b"\0"), "little") % 2**32
    aggregate = bool((rb.get("instance") or {}).get("aggregate"))
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


def _verdict(ch: stats.Change, threshold: float, confident: bool, what: str) -> dict:
    """Regression: at least `threshold` slower and significantly so (the interval excludes no change).

    A side that missed its confidence target measured less precisely than asked: then only a change whose
    whole interval clears the threshold counts, and anything less beyond it is suspicious.
    """
    slower, faster = ch.rel >= threshold, ch.rel <= -threshold
    significant = ch.low > 0 or ch.high < 0
    if not (slower or faster):
        return {"verdict": "unchanged", "why": f"{what} {_pct(ch.rel)}" +
                (", significant but below the threshold" if significant else ", within noise")}
    clears = ch.low >= threshold if slower else ch.high <= -threshold
    note = "" if confident else " (a side missed its confidence target)"
    if significant and (confident or clears):
        return {"verdict": "regression" if slower else "improvement",
                "why": f"{what} {_pct(ch.rel)}, beyond the threshold and significant{note}"}
    why = "the interval includes no change" if not significant else \
        "a side missed its confidence target and the interval reaches inside the threshold"
    return {"verdict": "suspicious", "why": f"{what} {_pct(ch.rel)}, but {why}"}


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


def _pct(x) -> str:
    return f"{100 * x:+.1f}%"


# ---------------------------------------------------------------- outputs

def _table_rows(rows: list[dict]) -> list[dict]:
    shown = []
    for r in rows:
        lat, tp = r["latency_change"], r["throughput_change"]
        shown.append({
            "model": r["model"], "backend": r["backend"], "precision": r["precision"], "batch": r["batch_size"],
            "threads": r["threads"], "inst": r["instances"],
            "baseline ms": f"{r['baseline_ms']:.2f}" if r["baseline_ms"] else r["baseline_status"],
            "new ms": f"{r['new_ms']:.2f}" if r["new_ms"] else r["new_status"],
            "latency": _pct(lat["rel"]) if lat else "-",
            f"{round(100 * (lat or tp or {}).get('confidence', 0.95))}% CI":
                f"{_pct(lat['low'])} .. {_pct(lat['high'])}" if lat and math.isfinite(lat["low"]) else "-",
            "throughput": _pct(tp["rel"]) if tp else "-",
            "run noise": f"{100 * r['noise']['se']:.1f}% ({r['noise']['kind']})" if r.get("noise") else "-",
            "verdict": r["verdict"], "why": r["why"],
        })
    return shown


def summary_line(c: Comparison) -> str:
    n = c.counts
    return (f"{n['regression']} regression(s), {n['suspicious']} suspicious, {n['improvement']} improvement(s), "
            f"{n['unchanged']} unchanged, {n['missing']} missing, {n['new']} new; threshold {100 * c.threshold:g}%, "
            f"{100 * c.confidence:g}% intervals of the change (passes and between-run noise)"
            + (f"; ignoring {', '.join(c.ignore)}" if c.ignore else ""))


def noise_line(c: Comparison) -> str:
    """Where the between-run term of the intervals came from, over the configurations judged on timings."""
    kinds = Counter((r["noise"] or {}).get("kind") for r in c.rows if r["latency_change"] or r["throughput_change"])
    if not kinds:
        return ""
    said = {"repeats": "repeated processes", "history": "the history's run-to-run spread",
            "turns": "the spread of the processes' turns",
            "spread": "the spread of the other configurations' changes", "machine": "the machine slopes' error only"}
    parts = [f"{said[k]} for {n}" for k, n in kinds.items() if k]
    if kinds.get(None):
        parts.append(f"nothing for {kinds[None]} (their intervals cover the passes only)")
    return "Between-run noise in the intervals: " + "; ".join(parts) + "."


READING_SAID = {
    "reference": "the machine reference (one core's speed at numpy matmuls: no framework code in it)",
    "probe": "the machine probe (how fast the cores hand work over, on the framework's own threads; a build "
             "that changes how its threads synchronise moves it too: compare its change with the raw one)",
}


def machine_line(c: Comparison) -> str:
    """What the machine readings took out, over the configurations that carried them on both sides."""
    rows = [r for r in c.rows if r.get("machine_readings")]
    if not rows:
        return ""
    moved = [r["machine_readings"]["raw_change"] - (r["latency_change"] or {}).get("rel", r["machine_readings"]["raw_change"])
             for r in rows]
    parts = []
    for name, said in READING_SAID.items():
        read = [r["machine_readings"]["readings"][name] for r in rows if name in r["machine_readings"]["readings"]]
        if read:
            changes = [x["change"] for x in read]
            parts.append(f"{said} on both sides of {len(read)}: it changed {_pct(min(changes))} .. "
                         f"{_pct(max(changes))}, and {sum(x['slope'] > 0 for x in read)} followed it")
    return (f"Machine readings beside every second of passes: {'; '.join(parts)}. The changes judged are with "
            f"the machine's share taken out ({_pct(min(moved))} .. {_pct(max(moved))} of raw change).")


def to_markdown(c: Comparison) -> str:
    import pandas as pd

    lines = [f"## Performance comparison: `{c.new.label}` vs baseline `{c.baseline.label}`", ""]
    lines += [f"> **{note}**" for note in c.notes] + ([""] if c.notes else [])
    lines += [f"**{summary_line(c)}**", ""] + [x for line in (noise_line(c), machine_line(c)) if line
                                                for x in (line, "")]
    for verdict, title in (("regression", "Regressions"), ("suspicious", "Suspicious"),
                           ("improvement", "Improvements"), ("unchanged", "Unchanged")):
        rows = [r for r in c.rows if r["verdict"] == verdict]
        if not rows:
            continue
        table = pd.DataFrame(_table_rows(rows)).to_markdown(index=False)
        if verdict == "unchanged":
            lines += [f"<details><summary>{title} ({len(rows)})</summary>", "", table, "", "</details>", ""]
        else:
            lines += [f"### {title} ({len(rows)})", "", table, ""]
    for items, title in ((c.missing, "Missing (baseline only)"), (c.added, "New (new run only)")):
        if items:
            lines += [f"### {title} ({len(items)})", "",
                      pd.DataFrame(items).drop(columns=["machine"]).to_markdown(index=False), ""]
    return "\n".join(lines)


def to_html(c: Comparison) -> str:
    import pandas as pd

    from ..reporting.report import STYLE

    esc = html.escape
    parts = [(f"<!doctype html><html><head><meta charset='utf-8'><title>aio-examples comparison</title>"
             f"<style>{STYLE}.regression{{color:#a00;font-weight:bold}}.improvement{{color:#070}}"
             f".suspicious{{color:#a60}}</style></head><body>"),
             (f"<h1>Performance comparison</h1><p>New <code>{esc(c.new.label)}</code> against baseline "
             f"<code>{esc(c.baseline.label)}</code>; generated {datetime.now(UTC).isoformat(timespec='seconds')}.</p>")]
    parts += [f"<p class='bad'><b>{esc(note)}</b></p>" for note in c.notes]
    parts.append(f"<p><b>{esc(summary_line(c))}</b></p><p>{esc(noise_line(c))}</p><p>{esc(machine_line(c))}</p>")
    for verdict in VERDICTS:
        rows = [r for r in c.rows if r["verdict"] == verdict]
        if rows:
            table = pd.DataFrame(_table_rows(rows)).to_html(index=False, escape=True)
            parts.append(f"<h2 class='{verdict}'>{verdict} ({len(rows)})</h2>{table}")
    for items, title in ((c.missing, "Missing (baseline only)"), (c.added, "New (new run only)")):
        if items:
            parts.append(f"<h2>{title} ({len(items)})</h2>"
                         + pd.DataFrame(items).drop(columns=["machine"]).to_html(index=False))
    parts.append("</body></html>")
    return "\n".join(parts)


def to_json(c: Comparison) -> str:
    def clean(v):          # JSON has no infinity: an interval that could not be computed is null
        if isinstance(v, float) and not math.isfinite(v):
            return None
        if isinstance(v, dict):
            return {k: clean(x) for k, x in v.items()}
        if isinstance(v, list):
            return [clean(x) for x in v]
        return v

    return json.dumps(clean({
        "baseline": c.baseline.label, "new": c.new.label, "threshold": c.threshold, "confidence": c.confidence,
        "ignore": list(c.ignore), "notes": c.notes, "counts": c.counts, "exit_code": c.exit_code,
        "configurations": c.rows, "missing": c.missing, "new_only": c.added,
    }), indent=1)


FORMATS = {"md": to_markdown, "html": to_html, "json": to_json}


def render(c: Comparison, fmt: str) -> str:
    if fmt not in FORMATS:
        raise UsageError(f"--format {fmt!r} is unknown; accepted: {', '.join(FORMATS)}")
    return FORMATS[fmt](c)
