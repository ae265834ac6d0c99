"""Taking turns: a driver keeps several processes alive and tells each when to measure one round.

Two drivers do this. A sweep (drivers/turns.py) keeps several points alive: what is measured is latency, as in
latency.py; only when the rounds run differs: whenever the sweep says so, so a point's passes come from moments
spread over the whole sweep. A run whose configurations each have a process of their own (drivers/launcher.py)
hands out the interleaved rounds that measure() runs in one process, each round under the configuration's own
stop rule: then the process measures as its task's scenario (`inner`: latency or generation) would, and its record
says that scenario. The two talk over a pair of pipes (`run --turns R,W`, file descriptors inherited): the process
says `ready` once warmed up, then measures one round for every `go` (a sweep's) or `(round, seconds, keep)` (a
run's) and answers `done` (to a run: with its measurement's state), until `stop`, when it writes its record and
exits as a lone run would. A run's `stop` carries what the record needs from the others: the eager fp32 median
of the run (for the speedup) and which configurations shared its rounds.
"""

import functools
import time
from multiprocessing.connection import Connection

from ...core.errors import UsageError
from ..timing import ROUND_GAP_S, ROUND_S, guarded, warm_up
from .base import Scenario

READY, GO, ROUND, DONE, STOP, INTERRUPT = "ready", "go", "round", "done", "stop", "interrupt"


class Turns:
    """A point's side of the pipes: told by the sweep that started it when to measure."""

    def __init__(self, spec: str):
        try:
            read_fd, write_fd = (int(x) for x in spec.split(","))
        except ValueError:
            raise UsageError(f"--turns {spec!r} is invalid; accepted: READ_FD,WRITE_FD (set by a sweep)") from None
        self._in = Connection(read_fd, writable=False)
        self._out = Connection(write_fd, readable=False)
        self.interrupted = False
        self.told: dict = {}             # what a run's driver says with `stop`: eager fp32's median, the rounds

    def ready(self) -> None:
        self._out.send(READY)

    def wait(self):
        """Block until the driver says go (GO, or a run's (ROUND, seconds, keep)) or stop, interrupt (None; also
        if the driver is gone)."""
        try:
            said = self._in.recv()
        except (EOFError, OSError):
            said = INTERRUPT
        if isinstance(said, tuple) and said[0] == STOP:
            said, self.told = STOP, said[1]
        self.interrupted = said == INTERRUPT
        return said if said == GO or isinstance(said, tuple) and said[0] == ROUND else None

    def done(self, state: dict | None = None) -> None:
        self._out.send(DONE if state is None else (DONE, state))


class TurnsScenario(Scenario):
    name = "turns"
    key = "latency"

    def __init__(self, turns: Turns, round_s: float = ROUND_S, inner: Scenario | None = None):
        self.turns, self.round_s, self.inner = turns, round_s, inner
        if inner is not None:           # a run's configuration: recorded as the scenario it measures
            self.name, self.key = inner.name, inner.key

    def params(self):
        return self.inner.params() if self.inner is not None else {"round_s": self.round_s}

    def measure(self, measurements, on_error, probe, timeout_s):
        if not measurements:        # its configuration could not be prepared: its record says why, at once
            return
        if len(measurements) != 1:
            raise UsageError("a process taking turns measures exactly one backend at one precision")
        warm_up(measurements, on_error)
        m = measurements[0]
        self.turns.ready()
        while said := self.turns.wait():
            if said == GO:
                if not m.done:      # a failed pass ends the measurement; the turns are still answered
                    self._turn(m, functools.partial(m.run_for, self.round_s, stop_rule=False), on_error, probe)
                self.turns.done()
                continue
            _, seconds, keep = said
            if not m.done or (keep and m.stop_reason == "confidence"):      # as measure() runs its rounds
                self._turn(m, functools.partial(m.run_for, seconds, stop_rule=not m.done), on_error, probe)
            self.turns.done({"done": m.done, "stop_reason": m.stop_reason, "measured_s": m.measured_s})
        if self.turns.interrupted:
            m.stop_reason = "interrupted"        # cut short: a resumed sweep measures it again
        elif not m.done:
            m.stop_reason = "turns"

    @property
    def reference_ms(self) -> float | None:
        """Eager fp32's median in the run this process is one configuration of (the runner's speedups)."""
        return self.turns.told.get("reference_ms")

    def _turn(self, m, step, on_error, probe) -> None:
        before, started = len(m.samples_ns), round(time.time(), 3)
        guarded(m, step, on_error)
        time.sleep(ROUND_GAP_S)
        if len(m.samples_ns) > before and (self.inner is None or probe is not None):
            m.rounds.append([len(m.samples_ns) - before, *(probe.slice() if probe is not None else [None])])
            m.turn_starts.append(started)
            time.sleep(ROUND_GAP_S)

    def annotate(self, result, measurement, task_size):
        if self.inner is not None:
            self.inner.annotate(result, measurement, task_size)
            if "rounds" in self.turns.told:
                result.scenario["rounds"] = self.turns.told["rounds"]
            return
        result.turns = [[r[0], t] for r, t in zip(measurement.rounds, measurement.turn_starts, strict=True)]
