"""Run one measurement point in a fresh process, so a crash, a hang or a leak stays in that point.

Thread settings must be in place before torch starts, and a segfault in one compiler must not take
a whole sweep down: every point of a matrix or sweep is its own `python -m aio_examples run ...`.
"""

import os
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field

STDERR_TAIL_LINES = 15


@dataclass
class Outcome:
    """How a point's process ended."""

    returncode: int | None
    seconds: float
    timed_out: bool = False
    stderr_tail: list = field(default_factory=list)

    @property
    def crashed(self) -> bool:
        """Killed by a signal (segfault, OOM killer) or by our timeout: its records were never written."""
        return self.timed_out or (self.returncode is not None and self.returncode < 0)

    @property
    def reason(self) -> str:
        last = next((line for line in reversed(self.stderr_tail) if line.strip()), "")
        if self.timed_out:
            head = f"timed out after {self.seconds:.0f} s and was killed"
        elif self.returncode is not None and self.returncode < 0:
            head = f"killed by {signal.Signals(-self.returncode).name}"
        else:
            head = f"exit code {self.returncode}"
        return head + (f"; last stderr: {last.strip()[:300]}" if last else "")


def run_isolated(argv: list[str], timeout_s: float, env: dict | None = None, cwd=None) -> Outcome:
    """Run `python argv...` in its own session; on timeout kill the whole process group (SIGKILL)."""
    start = time.perf_counter()
    with tempfile.TemporaryFile("w+") as err:
        proc = subprocess.Popen([sys.executable, *argv], stdout=subprocess.DEVNULL, stderr=err, env=env, cwd=cwd,
                                start_new_session=True)
        timed_out = False
        try:
            proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            timed_out = True
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        except KeyboardInterrupt:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            raise
        err.seek(0)
        tail = err.read().splitlines()[-STDERR_TAIL_LINES:]
    return Outcome(None if timed_out else proc.returncode, time.perf_counter() - start, timed_out, tail)
