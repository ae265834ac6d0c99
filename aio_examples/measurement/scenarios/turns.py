"""Taking turns: a sweep keeps several points' processes alive and tells each when to measure one round.

What is measured is latency, as in latency.py; only when the rounds run differs: whenever the sweep that
started this process says so (drivers/turns.py is its side), so a point's passes come from moments spread
over the whole sweep. The two talk over a pair of pipes (`run --turns R,W`, file descriptors inherited):
the process says `ready` once warmed up, then measures one round for every `go` and answers `done`, until
`stop`, when it writes its record and exits as a lone run would.
"""

import functools
import time
from multiprocessing.connection import Connection

from ...core.errors import UsageError
from ..timing import ROUND_GAP_S, ROUND_S, guarded, warm_up
from .base import Scenario

READY, GO, DONE, STOP, INTERRUPT = "ready", "go", "done", "stop", "interrupt"


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

    def ready(self) -> None:
        self._out.send(READY)

    def wait(self) -> bool:
        """Block until the sweep says go (True) or stop, interrupt (False; also if the sweep is gone)."""
        try:
            said = self._in.recv()
        except (EOFError, OSError):
            said = INTERRUPT
        self.interrupted = said == INTERRUPT
        return said == GO

    def done(self) -> None:
        self._out.send(DONE)


class TurnsScenario(Scenario):
    name = "turns"
    key = "latency"

    def __init__(self, turns: Turns, round_s: float = ROUND_S):
        self.turns, self.round_s = turns, round_s

    def params(self):
        return {"round_s": self.round_s}

    def measure(self, measurements, on_error, probe, timeout_s):
        if len(measurements) != 1:
            raise UsageError("a process taking turns measures exactly one backend at one precision")
        warm_up(measurements, on_error)
        m = measurements[0]
        self.turns.ready()
        while self.turns.wait():
            if not m.done:      # a failed pass ends the measurement; the turns are still answered
                before, started = len(m.samples_ns), round(time.time(), 3)
                guarded(m, functools.partial(m.run_for, self.round_s, stop_rule=False), on_error)
                time.sleep(ROUND_GAP_S)
                if len(m.samples_ns) > before:
                    m.rounds.append([len(m.samples_ns) - before, *(probe.slice() if probe is not None else [None])])
                    m.turn_starts.append(started)
                    time.sleep(ROUND_GAP_S)
            self.turns.done()
        if self.turns.interrupted:
            m.stop_reason = "interrupted"        # cut short: a resumed sweep measures it again
        elif not m.done:
            m.stop_reason = "turns"

    def annotate(self, result, measurement, task_size):
        result.turns = [[r[0], t] for r, t in zip(measurement.rounds, measurement.turn_starts, strict=True)]
