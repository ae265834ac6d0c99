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


class Isolated:
    """A `python argv...` child in its own session (so a timeout kills its whole process group), with
    an optional command prefix (numactl) binding it to cores."""

    def __init__(self, argv: list[str], env: dict | None = None, cwd=None, prefix: list[str] | None = None,
                 pass_fds=()):
        self.start = time.perf_counter()
        env = dict(os.environ if env is None else env)
        env[DRIVER_PID_ENV] = str(os.getpid())      # the child asks to die with us (die_with_parent)
        self.err = tempfile.TemporaryFile("w+")  # noqa: SIM115  (closed in wait(), after the child ends)
        self.proc = subprocess.Popen([*(prefix or []), sys.executable, *argv], stdout=subprocess.DEVNULL,
                                     stderr=self.err, env=env, cwd=cwd, start_new_session=True,
                                     pass_fds=pass_fds)

    def kill(self) -> None:
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self.proc.wait()

    def wait(self, timeout_s: float | None) -> Outcome:
        """Wait for the child (killing it on timeout or Ctrl-C) and say how it ended."""
        timed_out = False
        try:
            self.proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            timed_out = True
            self.kill()
        except KeyboardInterrupt:
            self.kill()
            self.err.close()
            raise
        self.err.seek(0)
        tail = self.err.read().splitlines()[-STDERR_TAIL_LINES:]
        self.err.close()
        return Outcome(None if timed_out else self.proc.returncode, time.perf_counter() - self.start, timed_out,
                       tail)


def run_isolated(argv: list[str], timeout_s: float, env: dict | None = None, cwd=None,
                 prefix: list[str] | None = None) -> Outcome:
    """Run `python argv...` in its own session; on timeout kill the whole process group (SIGKILL)."""
    return Isolated(argv, env, cwd, prefix).wait(timeout_s)


DRIVER_PID_ENV = "AIO_DRIVER_PID"


def die_with_parent() -> None:
    """In a point's process: be killed when the driver that started it dies (Linux `PR_SET_PDEATHSIG`).

    Otherwise a killed driver would leave its current point running, and the rerun that resumes the
    sweep would measure that point a second time while the orphan is still writing its record.
    """
    driver = os.environ.get(DRIVER_PID_ENV)
    if not driver or not sys.platform.startswith("linux"):
        return
    import ctypes

    pr_set_pdeathsig = 1
    ctypes.CDLL(None, use_errno=True).prctl(pr_set_pdeathsig, signal.SIGKILL)
    if str(os.getppid()) != driver:       # the driver died before we asked
        os.kill(os.getpid(), signal.SIGKILL)
