"""How much a configuration moves between runs, and the machine's share of a change.

The between-run term of a change's interval (between_run_noise) and the machine readings taken out of the
passes first (take_out_machine); see analysis/compare.py for how a verdict uses them.
"""

from dataclasses import dataclass
from functools import cached_property

import numpy as np

from ..core.records import KEY_FIELDS
from ..measurement import stats

MIN_NOISE_DOF = 4        # repeats: degrees of freedom a noise group needs, fewer and all are pooled
MIN_SPREAD_CONFIGS = 6   # matched configurations before their changes' spread is a noise estimate ...
SPREAD_PER_THREAD_COUNT = 12  # ... and per thread count from this many (fewer: all pooled)


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
    """Where every process on both sides carries a machine reading (machine/probe.py): take the machine's
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
        if not ea["median_ms"] or not eb["median_ms"] or ea["record"].threads != eb["record"].threads:
            continue
        used = [column for column, _, fewest, _ in MACHINE_READINGS
                if ea["record"].threads >= fewest and _carried(ea, eb, column)]
        if used:
            sides = [(e["groups"], e["rounds"]) for e in (ea, eb)]
            logs = {c: [np.log([r[c] for rounds in side[1] for r in rounds]) for side in sides] for c in used}
            plans[key] = _Plan(ea["record"].threads, used, sides, logs)
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
