"""Run one measurement point in a process of its own, so a crash, a hang or a leak stays in that point.

Thread settings must be in place before torch starts, and a segfault in one compiler must not take
a whole sweep down: every point of a matrix or sweep is its own `python -m aio_examples run ...`, forked from a
server that has loaded torch and the engines already (core/forkserver.py) or, where it cannot be, a fresh
interpreter.
"""

import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field

from .forkserver import DRIVER_PID_ENV, die_with_parent  # noqa: F401  (callers import die_with_parent from here)

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
    def signal_name(self) -> str | None:
        """The signal that killed it (SIGSEGV, SIGILL, SIGKILL: the OOM killer's too), if one did."""
        return signal_name(self.returncode)

    @property
    def reason(self) -> str:
        last = next((line for line in reversed(self.stderr_tail) if line.strip()), "")
        if self.timed_out:
            head = f"timed out after {self.seconds:.0f} s and was killed"
        elif self.signal_name:
            head = f"killed by {self.signal_name}"
        else:
            head = f"exit code {self.returncode}"
        return head + (f"; last stderr: {last.strip()[:300]}" if last else "")


def signal_name(returncode: int | None) -> str | None:
    """The name of the signal a child's return code says killed it (subprocess: -N), or None."""
    if returncode is None or returncode >= 0:
        return None
    try:
        return signal.Signals(-returncode).name
    except ValueError:
        return f"signal {-returncode}"


class Isolated:
    """A `python argv...` child in its own session (so a timeout kills its whole process group), with
    an optional command prefix (numactl) binding it to cores. With `echo`, what the child writes to stderr (its
    log, its progress bars) is also shown on ours as it comes, as if the work ran here; but lines that begin with
    `hold` (its one-line error, which the driver says in its own words), which only the file keeps."""

    def __init__(self, argv: list[str], env: dict | None = None, cwd=None, prefix: list[str] | None = None,
                 pass_fds=(), echo: bool = False, hold: bytes | None = None):
        self.start = time.perf_counter()
        env = dict(os.environ if env is None else env)
        env[DRIVER_PID_ENV] = str(os.getpid())      # the child asks to die with us (die_with_parent)
        self.err = tempfile.TemporaryFile("w+b")  # noqa: SIM115  (closed in wait(), after the child ends)
        self._echo = None
        if echo:
            read_end, write_end = os.pipe()
            self._echo = threading.Thread(target=_tee, args=(read_end, self.err, hold), daemon=True)
        try:
            self.proc = _forked(argv, env, cwd, prefix, write_end if echo else self.err.fileno(), pass_fds)
            if self.proc is None:
                self.proc = subprocess.Popen([*(prefix or []), sys.executable, *argv], stdout=subprocess.DEVNULL,
                                             stderr=write_end if echo else self.err, env=env, cwd=cwd,
                                             start_new_session=True, pass_fds=pass_fds)
        finally:
            if echo:
                os.close(write_end)             # the child's end: EOF reaches the reader when the child ends
        if self._echo is not None:
            self._echo.start()

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
        if self._echo is not None:
            self._echo.join(timeout=5)          # what the child wrote last is in the file before it is read
        self.err.seek(0)
        tail = self.err.read().decode(errors="replace").splitlines()[-STDERR_TAIL_LINES:]
        self.err.close()
        return Outcome(None if timed_out else self.proc.returncode, time.perf_counter() - self.start, timed_out,
                       tail)


def _forked(argv, env, cwd, prefix, stderr: int, pass_fds):
    """The child forked from the fork server for its environment (core/forkserver.py), or None: a fresh one."""
    from . import forkserver

    stdin = 0 if _valid_fd(0) else None
    devnull = os.open(os.devnull, os.O_RDWR)
    try:
        return forkserver.spawn(argv, env, cwd, prefix, (devnull if stdin is None else stdin, devnull, stderr),
                                tuple(pass_fds))
    finally:
        os.close(devnull)


def _valid_fd(fd: int) -> bool:
    try:
        os.fstat(fd)
    except OSError:
        return False
    return True


def _tee(fd: int, keep, hold: bytes | None) -> None:
    """Copy a child's stderr to ours and to `keep` until it closes (raw bytes: progress bars redraw in place);
    lines that begin with `hold` go to `keep` only."""
    out = getattr(sys.stderr, "buffer", None)
    with os.fdopen(fd, "rb", buffering=0) as pipe:
        while chunk := pipe.read(65536):
            try:
                keep.write(chunk)
                if hold:
                    chunk = b"".join(line for line in chunk.splitlines(keepends=True) if not line.startswith(hold))
                if out is not None:
                    out.write(chunk)
                    out.flush()
                else:                           # a notebook's stderr takes text
                    sys.stderr.write(chunk.decode(errors="replace"))
            except (OSError, ValueError):       # closed (the child was killed and waited for): drain the pipe
                pass


def run_isolated(argv: list[str], timeout_s: float, env: dict | None = None, cwd=None,
                 prefix: list[str] | None = None) -> Outcome:
    """Run `python argv...` in its own session; on timeout kill the whole process group (SIGKILL)."""
    return Isolated(argv, env, cwd, prefix).wait(timeout_s)
