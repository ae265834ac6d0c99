"""Points taking turns: a sweep keeps several points' processes alive and lets each measure one round at a time.

A run that measures each point in one stretch of seconds sees the machine in one state, and on a shared
virtual machine that state lasts seconds to minutes and moves a 2-thread point by tens of percent (see
machine/probe.py). Repeating the point in more processes samples more states, but every process pays for
its start, its preparation and its warm-up again. Taking turns pays for them once: up to `interleave`
points are started and warmed up one after another, then the sweep hands out one-second turns, a new
shuffled order every cycle, so each point's passes come from states spread over the whole stretch, while
still only one point runs at a time and each stays in its own process.

This is the sweep's side of the pipes; the process's side, and what it answers, is the turns scenario
(measurement/scenarios/turns.py).
"""

import os
from dataclasses import dataclass
from multiprocessing.connection import Connection

from ..measurement.scenarios.turns import DONE, GO, INTERRUPT, READY, ROUND, STOP


@dataclass
class Taker:
    """The sweep's side of one point's process: its pipes, and whether it is still taking turns."""

    proc: object                     # launch.Isolated
    to_child: Connection
    from_child: Connection
    turns_left: int
    context: object = None           # whatever the sweep needs to make the point's record
    alive: bool = True
    state: dict | None = None        # what a run's configuration said of its measurement after its last round

    @classmethod
    def spawn(cls, argv: list[str], env: dict | None, prefix: list[str] | None, turns: int, context=None,
              echo: bool = False, flag: str = "--turns", hold: bytes | None = None) -> "Taker":
        """Start `python argv... --turns R,W` (a run's configuration: `--rounds R,W`) with the two pipe ends it
        reads and writes inherited."""
        from ..core.processes import Isolated

        to_child_r, to_child_w = os.pipe()
        from_child_r, from_child_w = os.pipe()
        try:
            proc = Isolated([*argv, flag, f"{to_child_r},{from_child_w}"], env=env, prefix=prefix,
                            pass_fds=(to_child_r, from_child_w), echo=echo, hold=hold)
        except BaseException:
            os.close(to_child_w)
            os.close(from_child_r)
            raise
        finally:
            os.close(to_child_r)         # the child's ends: only the child holds them now
            os.close(from_child_w)
        return cls(proc, Connection(to_child_w, readable=False), Connection(from_child_r, writable=False), turns,
                   context)

    def _expect(self, what: str, timeout_s: float) -> bool:
        """Wait for `what` from the child; False if it ended or said nothing in time."""
        try:
            if self.from_child.poll(timeout_s):
                said = self.from_child.recv()
                if isinstance(said, tuple) and said[0] == what:      # a run's configuration says its state too
                    said, self.state = what, said[1]
                if said == what:
                    return True
        except (EOFError, OSError):
            pass
        self.alive = False
        return False

    def rss(self) -> int:
        """Resident memory of the process and its children (numactl execs in place), bytes; 0 once gone."""
        import psutil

        try:
            proc = psutil.Process(self.proc.proc.pid)
            return sum(p.memory_info().rss for p in [proc, *proc.children(recursive=True)])
        except psutil.Error:
            return 0

    def wait_ready(self, timeout_s: float) -> bool:
        return self._expect(READY, timeout_s)

    def turn(self, timeout_s: float, seconds: float | None = None, keep: bool = False) -> bool:
        """One round of passes (a sweep's; with `seconds`, a run's: under the configuration's stop rule, or past
        it when `keep`); False when the process did not answer in time (it crashed or hung)."""
        self.turns_left -= 1
        try:
            self.to_child.send(GO if seconds is None else (ROUND, seconds, keep))
        except OSError:
            self.alive = False
            return False
        return self._expect(DONE, timeout_s)

    def stop(self, timeout_s: float, interrupted: bool = False, told: dict | None = None):
        """Say stop (with what a run's configuration is `told`: turns.py), or interrupt when the sweep was
        stopped early (a process that measured writes its record, saying which, and exits) and wait: its
        Outcome. One that crashed or hung mid-turn is killed by the wait's timeout at the latest."""
        try:
            self.to_child.send(INTERRUPT if interrupted else (STOP, told) if told else STOP)
        except OSError:
            pass
        try:
            return self.proc.wait(timeout_s if self.alive else min(timeout_s, HUNG_S))
        finally:
            self.to_child.close()
            self.from_child.close()


HUNG_S = 10.0     # a process that did not answer its turn has this long to end on its own before it is killed
