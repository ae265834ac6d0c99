"""Honest timing: warm-up until stable, then measure until the median is known well enough.

Only the pass itself is timed (inputs are made before), with `time.perf_counter_ns`, and
every output is touched inside the timed region so nothing lazy escapes the clock.
"""

import functools
import os
import random
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from ..core.errors import UsageError
from ..machine import contention as others  # `contention` names a Measurement property
from .stats import Summary, summarize


@dataclass(frozen=True)
class StopRule:
    """When to stop measuring: confident median, or a count, or a time budget."""

    timeout_s: float = 60.0          # measured wall time budget per configuration
    num_runs: int | None = None      # exact count of measured passes (still capped by timeout)
    min_runs: int = 10
    min_time_s: float = 2.0
    ci_target: float = 0.01          # CI of the median within +-1% of the median ...
    confidence: float = 0.95         # ... at 95% confidence
    warmup_min: int = 2              # the first passes compile or fill caches
    warmup_window: int = 3           # warm-up ends when this many passes agree ...
    warmup_tolerance: float = 0.10   # ... within this fraction
    warmup_share: float = 0.25       # of the timeout, at most, spent warming up

    def __post_init__(self):
        if not self.timeout_s > 0:
            raise UsageError(f"--timeout {self.timeout_s} is invalid; accepted: seconds > 0")
        if self.num_runs is not None and self.num_runs < 1:
            raise UsageError(f"--num-runs {self.num_runs} is invalid; accepted: a whole number >= 1")
        if not 0 < self.ci_target < 1:
            raise UsageError(f"confidence target {self.ci_target} is invalid; accepted: 0 < target < 1")


def consume(out) -> None:
    """Touch every tensor/array in an output so lazy backends must produce it."""
    if out is None:
        return
    if isinstance(out, dict):
        for v in out.values():
            consume(v)
    elif isinstance(out, (list, tuple)):
        for v in out:
            consume(v)
    elif hasattr(out, "to_tuple"):          # Hugging Face ModelOutput
        consume(out.to_tuple())
    elif hasattr(out, "numel") and out.numel() or isinstance(out, np.ndarray) and out.size:
        out.reshape(-1)[0].item()


@dataclass
class Measurement:
    """Warm-up and measured samples of one pass function (a zero-argument callable)."""

    fn: object
    rule: StopRule
    first_pass_ms: float | None = None
    warmup_passes: int = 0
    warmup_s: float = 0.0
    samples_ns: list = field(default_factory=list)
    extra_ns: dict = field(default_factory=dict)   # per-pass metrics a pass reports (ns, or a list of them), e.g. ttft
    measured_s: float = 0.0
    stop_reason: str | None = None
    error: tuple | None = None                     # (status, reason) when a pass raised
    first_output: object = None                    # what the first pass returned, for output checks
    samples: object = None                         # serving a labelled dataset: its samples by index (accuracy.SampleSource)
    rounds: list = field(default_factory=list)     # [passes, probe ms, reference ms] per round (machine/probe.py)
    turn_starts: list = field(default_factory=list)  # when each turn began (Unix s), taking turns
    cpu_ns: int = 0                                # process CPU time during measured rounds ...
    wall_ns: int = 0                               # ... and their wall time: cores actually used
    elsewhere_s: float = 0.0                       # core-seconds other processes took of our cores then ...
    elsewhere_wall_s: float = 0.0                  # ... over this wall time (machine/contention.py)
    _summary: Summary | None = None

    def _pass(self, keep: bool = False) -> int:
        t0 = time.perf_counter_ns()
        out = self.fn()
        consume(out)
        elapsed = time.perf_counter_ns() - t0
        if keep:
            self.first_output = out
        for name, value in (getattr(self.fn, "pass_metrics", None) or {}).items():
            values = self.extra_ns.setdefault(name, [])
            if isinstance(value, list):
                values.extend(value)
            else:
                values.append(value)
        return elapsed

    def warm_up(self) -> None:
        """At least `warmup_min` passes, then until `warmup_window` passes agree, within a budget."""
        budget = self.rule.timeout_s * self.rule.warmup_share
        start = time.perf_counter()
        times = []
        while True:
            times.append(self._pass(keep=not times and self.first_output is None))
            if self.first_pass_ms is None:
                self.first_pass_ms = times[0] / 1e6
            last = times[-self.rule.warmup_window:]
            stable = (len(last) == self.rule.warmup_window
                      and max(last) <= min(last) * (1 + self.rule.warmup_tolerance))
            if len(times) >= self.rule.warmup_min and (stable or time.perf_counter() - start >= budget):
                break
        self.warmup_passes = len(times)
        self.warmup_s = time.perf_counter() - start
        self.extra_ns.clear()

    @property
    def observed_cores(self) -> float | None:
        """Process CPU time / wall time over the measured rounds: how many cores the backend kept busy."""
        return self.cpu_ns / self.wall_ns if self.wall_ns else None

    @property
    def contention(self) -> float | None:
        """How many of our cores other processes kept busy, on average, over the measured rounds."""
        return max(0.0, self.elsewhere_s / self.elsewhere_wall_s) if self.elsewhere_wall_s else None

    def _add_contention(self, before: others.Snapshot) -> None:
        after = others.snapshot()
        self.elsewhere_s += others.elsewhere_s(before, after)
        self.elsewhere_wall_s += after.wall_s - before.wall_s

    @property
    def done(self) -> bool:
        return self.stop_reason is not None

    def summary(self) -> Summary:
        if self._summary is None or self._summary.n != len(self.samples_ns):
            self._summary = summarize(np.asarray(self.samples_ns) / 1e6, self.rule.confidence)
        return self._summary

    @property
    def confidence_met(self) -> bool:
        n = len(self.samples_ns)
        return n >= 2 and self.summary().ci_rel_halfwidth <= self.rule.ci_target

    def _check_stop(self) -> None:
        rule, n = self.rule, len(self.samples_ns)
        if rule.num_runs is not None and n >= rule.num_runs:
            self.stop_reason = "num_runs"
        elif self.measured_s >= rule.timeout_s and n >= 1:
            self.stop_reason = "timeout"
        elif (rule.num_runs is None and n >= rule.min_runs and self.measured_s >= rule.min_time_s
              and self.confidence_met):
            self.stop_reason = "confidence"

    def run_window(self, start_ns: int, seconds: float) -> list[int]:
        """Passes from a start time shared with other processes (`time.monotonic_ns`, one clock for the
        machine) until `seconds` after it; returns when each pass ended, on that clock."""
        while (wait := start_ns - time.monotonic_ns()) > 0:
            time.sleep(min(wait / 1e9, 0.005))
        end_ns = start_ns + int(seconds * 1e9)
        ends = []
        busy0 = others.snapshot()
        cpu0, wall0 = time.process_time_ns(), time.perf_counter_ns()
        while not ends or ends[-1] < end_ns:
            self.samples_ns.append(self._pass())
            ends.append(time.monotonic_ns())
        self.cpu_ns += time.process_time_ns() - cpu0
        self.wall_ns += time.perf_counter_ns() - wall0
        self._add_contention(busy0)
        self.measured_s = (ends[-1] - start_ns) / 1e9
        self.stop_reason = "window"
        return ends

    def run_for(self, seconds: float, stop_rule: bool = True) -> None:
        """Measure passes for up to `seconds` (used alone, or in interleaved rounds); without `stop_rule`
        only the seconds end it (the sweep that hands out turns decides when the measurement is over, and
        interleaved rounds keep a measurement that is done going while the others run)."""
        start = last = time.perf_counter()
        busy0 = others.snapshot()
        cpu0, wall0 = time.process_time_ns(), time.perf_counter_ns()
        while not stop_rule or not self.done:
            self.samples_ns.append(self._pass())
            now = time.perf_counter()
            round_over = now - start >= seconds
            # Checking the CI costs a few ms: do it at most ~10 times a second.
            if round_over or now - last >= 0.1 or self.rule.num_runs is not None:
                self.measured_s += now - last
                last = now
                if stop_rule:
                    self._check_stop()
            if round_over:
                break
        self.cpu_ns += time.process_time_ns() - cpu0
        self.wall_ns += time.perf_counter_ns() - wall0
        self._add_contention(busy0)


ROUND_S = 1.0             # one round of passes (interleaved backends, the probe's rhythm, a sweep's turn)
ROUND_GAP_S = 0.05
ORDER_SEED = 1234567      # fixed: the same sequence of round orders in every run


def guarded(m: Measurement, step, on_error=None) -> None:
    """Run one step of a measurement; a pass that raises ends that measurement only (`on_error` is told)."""
    try:
        step()
    except Exception as exc:
        m.stop_reason = "error"
        if on_error is None:
            raise
        on_error(m, exc)


def warm_up(measurements: list[Measurement], on_error=None) -> None:
    for m in measurements:
        if m.first_pass_ms is None:
            guarded(m, m.warm_up, on_error)


def measure(measurements: list[Measurement], round_s: float = ROUND_S, on_error=None, probe=None) -> None:
    """Measure several pass functions in interleaved rounds (A B C, C A B, ...) so drift hits all alike.

    Measurements share the same rounds to the end: one that met its confidence target is kept in the rounds
    while another still runs, up to its own timeout, so each median covers the same stretch of the machine's
    drift (here OpenVINO stopped at its target after 2 s, and the same engine inside aio, measured on alone for
    6 s more through a slow spell of the machine, came out 20% slower). A count (`num_runs`) is exact.
    A single measurement simply runs to its end, unless a `probe` (machine/probe.py MachineProbe) is given:
    then every measurement runs in rounds, and after each of its rounds the probe's readings are recorded
    beside the round's pass count (`Measurement.rounds`). A pass that raises ends that measurement only:
    `on_error(measurement, exc)` is told, the others go on.
    """
    warm_up(measurements, on_error)
    rounds = len(measurements) > 1 or probe is not None
    seconds = round_s if rounds else float("inf")
    shuffle = random.Random(ORDER_SEED).shuffle
    order = list(measurements)
    while not all(m.done for m in measurements):
        # A new order every round (a seeded shuffle), so no backend always follows the same neighbour
        # and none always goes first; and a short idle gap after each round: ONNX Runtime's and
        # OpenVINO's worker threads keep spinning for a while after their last pass and would slow the
        # next backend (measured here: OpenVINO mobilenet_v2 5.0 -> 5.2 ms right after ONNX Runtime).
        for m in order:
            if not m.done:
                step = functools.partial(m.run_for, seconds)
            elif rounds and _kept(m, measurements):
                step = functools.partial(m.run_for, seconds, stop_rule=False)
            else:
                continue
            before = len(m.samples_ns)
            guarded(m, step, on_error)
            if rounds:
                time.sleep(ROUND_GAP_S)
            if probe is not None and len(m.samples_ns) > before:
                m.rounds.append([len(m.samples_ns) - before, *probe.slice()])
                time.sleep(ROUND_GAP_S)
        shuffle(order)


def _kept(m: Measurement, measurements: list[Measurement]) -> bool:
    """Whether `m`, done at its confidence target, still runs in the rounds: another is not done yet, and
    its own timeout leaves room."""
    return (m.stop_reason == "confidence" and m.measured_s < m.rule.timeout_s
            and any(not x.done for x in measurements))


TUNING_ROUND_S = 0.5
TUNING_TIMEOUT_S = 6.0        # measured seconds per strategy once enough of its rounds were quiet
TUNING_CONTENDED_CORES = others.CONTENDED_CORES   # beyond the spare cores: a round others took part of
QUIET_WAIT_S = 15.0           # the longest wait for a quiet moment, before the rounds and between them
MIN_QUIET_ROUNDS = 3          # per strategy, for a decision that is not provisional


@dataclass
class Tuned:
    """What timing strategies for a choice found (time_passes)."""

    medians: dict                # name -> median ms over its quiet rounds (all its rounds when it had none)
    ci: dict                     # name -> (low, high) of that median
    quiet: bool                  # every strategy had MIN_QUIET_ROUNDS rounds others left alone
    clear: bool                  # the fastest's interval lies below every other's: a winner beyond noise
    rounds: dict                 # name -> [rounds kept, rounds dropped because others took our cores]
    waited_s: float              # spent waiting for quiet moments
    busy_cores: float            # cores others held on average over all rounds
    limit_cores: float           # a round with more is dropped

    def to_dict(self) -> dict:
        return {"medians_ms": {k: round(v, 3) for k, v in self.medians.items()}, "quiet": self.quiet,
                "clear": self.clear, "rounds_kept_dropped": self.rounds, "waited_for_quiet_s": round(self.waited_s, 1),
                "busy_elsewhere_cores": round(self.busy_cores, 2), "round_limit_cores": self.limit_cores}


def wait_quiet(limit: float, max_wait_s: float, window_s: float = 0.5) -> float:
    """Wait until others hold fewer than `limit` of our cores over a window, at most `max_wait_s`: the seconds
    waited."""
    start = time.monotonic()
    while time.monotonic() - start < max_wait_s:
        before = others.snapshot()
        time.sleep(window_s)
        if others.busy_elsewhere(before, others.snapshot()) <= limit:
            break
    return time.monotonic() - start


def time_passes(passes: dict[str, Callable[[], object]], threads: int | None = None) -> Tuned:
    """Time named pass functions alike for a backend choosing among them (the optimized backend's tuner,
    handed this through PrepareContext), so that a busy machine cannot pick for it.

    After warming each up it waits for a quiet moment, then runs interleaved rounds, reading after every
    round how much of our cores other processes took: a round they took more than the spare cores (the
    affinity set beyond `threads`) plus a quarter of a core of is dropped, and the next waits for quiet.
    Rounds go on until each strategy has MIN_QUIET_ROUNDS quiet rounds and either the fastest is ahead beyond
    the intervals of the medians or each has TUNING_TIMEOUT_S measured; with the machine busy throughout, at
    most twice that. One whose pass raises is left out."""
    spare = max(0, len(os.sched_getaffinity(0)) - threads) if threads else 0
    limit = spare + TUNING_CONTENDED_CORES
    rule = StopRule(timeout_s=TUNING_TIMEOUT_S, min_time_s=1.0, min_runs=5, ci_target=0.02)
    ms = {name: Measurement(fn, rule) for name, fn in passes.items()}
    warm_up(list(ms.values()), on_error=_left_out)
    waited = wait_quiet(limit, QUIET_WAIT_S)
    quiet = {name: [] for name in ms}
    rounds = {name: [0, 0] for name in ms}
    elsewhere = wall = 0.0
    order, shuffle = list(ms), random.Random(ORDER_SEED).shuffle
    while True:
        contended = False
        for name in order:
            m = ms[name]
            if m.error:
                continue
            before, snap = len(m.samples_ns), others.snapshot()
            guarded(m, functools.partial(m.run_for, TUNING_ROUND_S, stop_rule=False), _left_out)
            after = others.snapshot()
            elsewhere, wall = elsewhere + others.elsewhere_s(snap, after), wall + after.wall_s - snap.wall_s
            if others.busy_elsewhere(snap, after) <= limit:
                quiet[name] += m.samples_ns[before:]
                rounds[name][0] += 1
            else:
                rounds[name][1] += 1
                contended = True
            time.sleep(ROUND_GAP_S)
        shuffle(order)
        alive = [n for n in ms if not ms[n].error and ms[n].samples_ns]
        if not alive:
            break
        enough = all(rounds[n][0] >= MIN_QUIET_ROUNDS for n in alive)
        spent = min(ms[n].measured_s for n in alive)
        if enough and (_clear(quiet, alive) or spent >= TUNING_TIMEOUT_S):
            break
        if spent >= 2 * TUNING_TIMEOUT_S:
            break
        if contended and waited < 2 * QUIET_WAIT_S:
            waited += wait_quiet(limit, min(QUIET_WAIT_S, 2 * QUIET_WAIT_S - waited))
    alive = [n for n in ms if not ms[n].error and ms[n].samples_ns]
    summaries = {n: summarize(np.asarray(quiet[n] or ms[n].samples_ns) / 1e6) for n in alive}
    return Tuned({n: s.median for n, s in summaries.items()}, {n: (s.ci_low, s.ci_high) for n, s in summaries.items()},
                 all(rounds[n][0] >= MIN_QUIET_ROUNDS for n in alive), _clear(quiet, alive),
                 {n: rounds[n] for n in alive}, waited, max(0.0, elsewhere / wall) if wall else 0.0, limit)


def _clear(quiet: dict, names: list) -> bool:
    """The fastest median's interval lies wholly below every other's (quiet samples only)."""
    if len(names) < 2 or any(len(quiet[n]) < 2 for n in names):
        return len(names) == 1
    s = sorted((summarize(np.asarray(quiet[n]) / 1e6) for n in names), key=lambda x: x.median)
    return all(s[0].ci_high < other.ci_low for other in s[1:])


def _left_out(m: Measurement, exc: BaseException) -> None:
    m.error = (type(exc).__name__, str(exc))
