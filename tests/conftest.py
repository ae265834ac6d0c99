import contextlib
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

# A shell that starts pytest in the background ignores SIGINT, and the children the Ctrl-C tests
# interrupt would inherit that and never see KeyboardInterrupt. A handler (unlike "ignore") is reset
# to the default when a child starts, so put Python's own back.
if signal.getsignal(signal.SIGINT) == signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)


@pytest.fixture(autouse=True)
def _isolated_cache(tmp_path_factory, monkeypatch, request):
    """Keep caches the harness writes (FLOPs, stand-in libraries) out of the user's home."""
    monkeypatch.setenv("AIO_CACHE_DIR", str(tmp_path_factory.getbasetemp() / "aio-cache"))
    for var in ("AIO_NUM_THREADS", "OMP_NUM_THREADS", "AIO_DEBUG_MODE", "AIO_KNOB_BUDGET_S", "AIO_SPLIT_BUDGET_S"):
        monkeypatch.delenv(var, raising=False)
    # aio's knob trials (compiling each strategy again per setting) and split stage (each segment on each engine)
    # would add minutes to every aio test; their own tests turn them on (tests/backends/test_aio_knobs.py,
    # test_aio_split.py)
    monkeypatch.setenv("AIO_TUNE_KNOBS", "0")
    monkeypatch.setenv("AIO_TUNE_SPLIT", "0")
    for var in ("AIO_TUNE", "AIO_LAUNCHER", "AIO_JOURNAL"):
        monkeypatch.delenv(var, raising=False)
    # The backends' tests check what a backend does, often with its functions patched or the machine's contention
    # ignored (monkeypatch): their runs measure in the test's own process. A run's processes, one per
    # configuration, are tested in tests/drivers/test_launcher.py and tests/backends/test_aio_crashes.py.
    if request.node.path.parent.name == "backends":
        monkeypatch.setenv("AIO_LAUNCHER", "inline")


MEASURING = {"run", "profile", "matrix", "sweep", "throughput", "loadgen", "peak"}


def run_cli(args, cwd=ROOT, env=None, timeout=600, cpus=None):
    """Run a real command (a run.py or `python -m aio_examples`) and capture it; `cpus` pins it to those CPUs.

    A command that measures (`python -m aio_examples run ...`) is forked from the harness's fork server, as its
    configurations are, so the tests do not pay a fresh interpreter's imports for each command and configuration
    (a run.py, the front door, starts fresh as a user's does; `AIO_FORKSERVER=0` in `env` starts any command
    fresh). The others import no engine and start in a fraction of a second anyway."""
    full_env = {k: v for k, v in os.environ.items() if k not in ("AIO_NUM_THREADS", "OMP_NUM_THREADS")}
    full_env.update(env or {})
    if cpus is None and args[:2] == ["-m", "aio_examples"] and len(args) > 2 and args[2] in MEASURING:
        done = _forked_cli(args, cwd, full_env, timeout)
        if done is not None:
            return done
    command, pin = [sys.executable, *args], None
    if cpus is not None and shutil.which("taskset"):
        command = ["taskset", "-c", ",".join(map(str, sorted(cpus))), *command]
    elif cpus is not None:
        pin = lambda: os.sched_setaffinity(0, cpus)   # no taskset here
    return subprocess.run(command, cwd=cwd, env=full_env, capture_output=True, text=True,
                          timeout=timeout, check=False, preexec_fn=pin)


def _forked_cli(args, cwd, env, timeout):
    """`subprocess.run(..., capture_output=True, text=True)` of a command forked from the fork server; None when
    it cannot be forked."""
    import tempfile

    from aio_examples.core import forkserver

    # it dies with the tests, as a fresh one does; without pytest's name of the current test, which would make
    # every test's environment another and start a server of its own
    env = {**{k: v for k, v in env.items() if k != "PYTEST_CURRENT_TEST"}, forkserver.DRIVER_PID_ENV: str(os.getpid())}
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err, open(os.devnull, "rb") as stdin:
        child = forkserver.spawn(args, env, cwd, None, (stdin.fileno(), out.fileno(), err.fileno()))
        if child is None:
            return None
        try:
            child.wait(timeout)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(child.pid, signal.SIGKILL)
            child.wait()
            raise
        out.seek(0)
        err.seek(0)
        return subprocess.CompletedProcess([sys.executable, *args], child.returncode,
                                           out.read().decode(errors="replace"), err.read().decode(errors="replace"))


def handicap(monkeypatch, slowed=lambda passes: "kept" if "kept" in passes else None):
    """Slow one of the passes each of aio's tuning timings compares by 2 ms a pass (a real sleep, really timed):
    the one `slowed(passes)` names, or none. By default the settings kept so far: every trial wins."""
    import time

    from aio_examples.measurement import runner

    real = runner.time_passes

    def handicapped(passes, threads):
        name = slowed(passes)
        if name:
            passes = {**passes, name: lambda f=passes[name]: (time.sleep(0.002), f())[1]}
        return real(passes, threads)

    monkeypatch.setattr(runner, "time_passes", handicapped)
    return real


SMALL_SWEEP = ["squeezenet", "--input-size", "32", "--timeout", "0.5", "--point-timeout", "120", "--quiet",
               "--backends", "eager,torchscript", "--threads", "1,2"]


@pytest.fixture(scope="session")
def small_sweep(tmp_path_factory):
    """A real 4-point sweep (squeezenet at 32x32, eager and torchscript, 1 and 2 threads), run once."""
    out = tmp_path_factory.mktemp("small-sweep")
    proc = run_cli(["-m", "aio_examples", "sweep", *SMALL_SWEEP, "--output", str(out)],
                   env={"AIO_CACHE_DIR": str(tmp_path_factory.getbasetemp() / "aio-cache")})
    assert proc.returncode == 0, proc.stderr[-2000:]
    return out, proc
