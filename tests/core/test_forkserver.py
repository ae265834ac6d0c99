"""Measurement processes forked from the fork server (core/forkserver.py): each one as a fresh interpreter would be
(its command, environment, folder, descriptors, exit code), a crash only its own, none left behind its driver."""

import json
import os
import shutil
import subprocess
import sys
import textwrap
import time

import pytest

from aio_examples.core import forkserver
from aio_examples.core.processes import Isolated, run_isolated

# What the child says of itself, one line on fd W: its parent, argv, folder, a variable, and whether torch was
# loaded before its first line ran (the server's preload).
REPORT = textwrap.dedent("""
    import json, os, sys
    fd = int(sys.argv[1])
    os.write(fd, json.dumps({"ppid": os.getppid(), "argv": sys.argv, "cwd": os.getcwd(),
                             "var": os.environ.get("AIO_TEST_VAR"),
                             "debug": os.environ.get("AIO_DEBUG_MODE"), "torch": "torch" in sys.modules,
                             "cpus": sorted(os.sched_getaffinity(0)),
                             "threads": sys.modules["torch"].get_num_threads() if "torch" in sys.modules else None
                             }).encode())
    print("to stderr", file=sys.stderr)
    sys.exit(int(sys.argv[2]))
""")


def _report(env=None, cwd=None, code=0, prefix=None):
    r, w = os.pipe()
    try:
        proc = Isolated(["-c", REPORT, str(w), str(code)], env=env, cwd=cwd, pass_fds=(w,), prefix=prefix)
    finally:
        os.close(w)
    outcome = proc.wait(120)
    with os.fdopen(r, "rb") as f:
        said = f.read()
    return outcome, json.loads(said)


def test_a_forked_process_gets_its_command_environment_folder_descriptors_and_exit_code(tmp_path):
    env = {**os.environ, "AIO_TEST_VAR": "seen"}
    outcome, said = _report(env, tmp_path, code=7)
    assert outcome.returncode == 7 and outcome.stderr_tail == ["to stderr"]
    assert said["argv"][0] == "-c" and said["argv"][2] == "7"
    assert said["cwd"] == str(tmp_path) and said["var"] == "seen"
    assert said["ppid"] != os.getpid() and said["torch"]          # forked from the server, torch already loaded
    # the same command as a fresh interpreter, as AIO_FORKSERVER=0 asks: our own child, nothing preloaded
    outcome, said = _report({**env, forkserver.ENABLE_ENV: "0"}, tmp_path, code=7)
    assert outcome.returncode == 7 and said["ppid"] == os.getpid() and not said["torch"]


def test_a_per_process_variable_shares_the_server_and_another_environment_gets_its_own():
    # a command's own variables (the journal, AIO_DEBUG_MODE, its caches, the verbosity every command sets) share a
    # server and reach the process; a variable an import may read (OMP_* but the thread count) gets a server of its own
    base = dict(os.environ)          # the other tests' server
    said = _report({**base, forkserver.JOURNAL_ENV: "/tmp/one"})[1]
    said_too = _report({**base, forkserver.JOURNAL_ENV: "/tmp/two", "AIO_DEBUG_MODE": "1",
                        "AIO_CACHE_DIR": os.environ["AIO_CACHE_DIR"] + "-another",
                        "TORCHINDUCTOR_CACHE_DIR": os.environ["AIO_CACHE_DIR"] + "-inductor",
                        "TRANSFORMERS_VERBOSITY": "error"})[1]
    other = _report({**base, "OMP_TEST_VAR": "b"})[1]["ppid"]
    assert said["ppid"] == said_too["ppid"] != other
    assert (said["debug"], said_too["debug"]) == (None, "1")


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2 or not shutil.which("numactl"), reason="needs numactl, 2 CPUs")
def test_thread_counts_and_core_bindings_fork_from_one_server_each_on_its_cores():
    # what a sweep's points differ in: the thread count (OpenMP's variable) and the cores (numactl's, or the
    # sched_setaffinity binding in AIO_BINDING); each process runs on its cores with its threads, as a fresh one would
    first, second = sorted(os.sched_getaffinity(0))[:2]
    base = {k: v for k, v in os.environ.items() if k not in ("OMP_NUM_THREADS", "AIO_BINDING")}
    runs = [_report({**base, "OMP_NUM_THREADS": "1"}, prefix=["numactl", f"--physcpubind={first}"])[1],
            _report({**base, "OMP_NUM_THREADS": "2"}, prefix=["numactl", f"--physcpubind={first},{second}"])[1],
            _report({**base, "AIO_BINDING": json.dumps({"method": "sched_setaffinity", "cores": [second]})})[1],
            _report(base, prefix=["numactl", f"--physcpubind={second}"])[1]]
    assert len({r["ppid"] for r in runs}) == 1 and runs[0]["ppid"] != os.getpid()
    assert [r["cpus"] for r in runs] == [[first], [first, second], [second], [second]]
    # no OMP_NUM_THREADS: OpenMP's default, the cores it may run on
    assert [r["threads"] for r in runs] == [1, 2, 1, 1]
    fresh = _report({**base, "OMP_NUM_THREADS": "1", forkserver.ENABLE_ENV: "0"},
                    prefix=["numactl", f"--physcpubind={second}"])[1]
    assert (fresh["cpus"], fresh["ppid"]) == ([second], os.getpid())


def test_a_crash_in_a_forked_process_is_its_own_and_a_timeout_kills_it():
    crashed = run_isolated(["-c", "import os, signal; os.kill(os.getpid(), signal.SIGSEGV)"], 60)
    assert crashed.crashed and crashed.signal_name == "SIGSEGV"
    hung = run_isolated(["-c", "import time; time.sleep(600)"], 2)
    assert hung.timed_out and hung.crashed
    outcome, said = _report(code=0)              # the server that forked them goes on
    assert outcome.returncode == 0 and said["ppid"] != os.getpid()


def test_an_uncaught_exception_and_ctrl_c_end_a_forked_process_as_the_interpreter_would():
    failed = run_isolated(["-c", "raise ValueError('bad')"], 60)
    assert failed.returncode == 1 and failed.stderr_tail[-1] == "ValueError: bad"
    said = run_isolated(["-c", "import sys; sys.exit('a message')"], 60)
    assert said.returncode == 1 and said.stderr_tail == ["a message"]
    interrupted = run_isolated(["-c", "raise KeyboardInterrupt"], 60)
    assert interrupted.signal_name == "SIGINT"
    threads = run_isolated(["-c", ("import threading, time, sys\n"
                                  "threading.Thread(target=lambda: (time.sleep(0.5), print('joined', file=sys.stderr)))"
                                  ".start()")], 60)
    assert threads.returncode == 0 and threads.stderr_tail == ["joined"]


@pytest.mark.skipif(not forkserver.enabled(), reason="no fork server on this platform")
def test_no_process_outlives_a_driver_that_was_killed(tmp_path):
    pids = tmp_path / "pids"
    driver = subprocess.Popen([sys.executable, "-c", textwrap.dedent(f"""
        import os, time
        from aio_examples.core.processes import Isolated
        child = Isolated(["-c", "import os, time; open({str(pids)!r}, 'w').write(f'{{os.getppid()}} {{os.getpid()}}');"
                                " time.sleep(600)"])
        time.sleep(600)
    """)])
    try:
        deadline = time.monotonic() + 120
        while not (pids.exists() and pids.read_text().strip()) and time.monotonic() < deadline:
            time.sleep(0.2)
        server, child = map(int, pids.read_text().split())
        assert server != driver.pid
    finally:
        driver.kill()
        driver.wait()
    deadline = time.monotonic() + 20
    while any(_alive(p) for p in (server, child)) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not _alive(server) and not _alive(child)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    with open(f"/proc/{pid}/stat") as f:        # a zombie no one reaped yet is gone all the same
        return f.read().split(") ")[1][0] != "Z"


def test_a_command_the_server_cannot_run_is_a_fresh_interpreter(tmp_path):
    script = tmp_path / "script.py"
    script.write_text("import os, sys\nprint(os.getppid(), file=sys.stderr)\n")
    outcome = run_isolated([str(script)], 60)
    assert outcome.returncode == 0 and outcome.stderr_tail == [str(os.getpid())]     # our own child


@pytest.mark.skipif(not forkserver.enabled(), reason="no fork server on this platform")
def test_a_forked_driver_forks_its_processes_from_the_same_server_and_they_end_with_it(tmp_path):
    """A driver that was itself forked (a sweep's point, a test's command) asks its server for its own
    processes instead of starting a server of its own; when it is killed, what it started is killed too."""
    pids = tmp_path / "pids"
    code = textwrap.dedent(f"""
        import os, time
        from aio_examples.core.processes import Isolated
        inner = Isolated(["-c", "import os, time; open({str(pids)!r}, 'w').write(f'{{os.getppid()}} {{os.getpid()}}');"
                                " time.sleep(600)"])
        time.sleep(600)
    """)
    driver = Isolated(["-c", code])
    try:
        deadline = time.monotonic() + 120
        while not (pids.exists() and pids.read_text().strip()) and time.monotonic() < deadline:
            time.sleep(0.2)
        server, inner = map(int, pids.read_text().split())
        assert server == _ppid(driver.proc.pid)      # a sibling of its driver: forked by the same server
    finally:
        driver.kill()
    deadline = time.monotonic() + 20
    while _alive(inner) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not _alive(inner) and _alive(server)


def _ppid(pid: int) -> int:
    with open(f"/proc/{pid}/stat") as stat:
        return int(stat.read().rsplit(")", 1)[1].split()[1])
