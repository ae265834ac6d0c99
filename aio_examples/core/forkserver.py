"""Measurement processes forked from a server that has loaded the heavy libraries once.

A fresh `python -m aio_examples run ...` spends seconds importing torch, transformers and the engines before it
does anything, and a run of several configurations, a sweep, a notebook and the tests paid that for every process.
A fork server (multiprocessing's forkserver with preloaded modules) imports them once, single-threaded, before any
thread pool starts; each process is then a fork of it and starts in milliseconds. Isolation is as before: every
process is its own (its own session and process group, its own pages once it writes them), so a crash, a hang or a
leak still takes only its own process, and it dies with the driver (through the server) as a fresh one does.

A server only forks processes whose environment and command prefix (numactl) are its own, since libraries read
their variables once, at import, and numactl binds a process before it starts: another environment or prefix
gets a server of its own (idle ones beyond MAX_SERVERS are stopped, least recently used first). The variables a
driver sets per process (PER_PROCESS) are set in the fork. A command other than `-m MODULE` or `-c CODE`,
`AIO_FORKSERVER=0`, a platform without fork, or a server that did not start runs a fresh interpreter as before.
What an interpreter runs as it starts (`sitecustomize`, `.pth` files) ran once, in the server: a fork inherits its
effects but does not run it again, and its `/proc/self/cmdline` is the server's.

The server's side runs as `python -m aio_examples.core.forkserver FD`, reading requests on the socket FD: a JSON
header (argv, environment, working folder, the fd numbers the child expects) with the child's status socket, its
stdin, stdout, stderr and passed fds attached (SCM_RIGHTS). It answers on the status socket with the child's pid,
then with its exit code as subprocess gives it (-N: killed by signal N).
"""

import atexit
import contextlib
import gc
import importlib
import json
import os
import select
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import weakref
from collections import OrderedDict

from .log import logger

ENABLE_ENV = "AIO_FORKSERVER"          # "0": every process a fresh interpreter
DRIVER_PID_ENV = "AIO_DRIVER_PID"      # die_with_parent: the pid whose death kills a process
JOURNAL_ENV = "AIO_JOURNAL"            # backends/crashes.py: where a configuration's process notes its candidate
# Variables that differ from process to process and that no preloaded import reads: the server for an environment
# is chosen without them (each fork still gets them). pytest's changes with every test. The harness's own AIO_*
# variables are read when a command runs, never at import, so they choose no server either. The preload reads one,
# the cache folder torchvision's shim builds its stand-ins in: a server takes the first driver's (a folder it can
# write in; else that command runs fresh), and its forks, whatever their own, use the torchvision it loaded (each
# fork's command then caches in its own folder).
PER_PROCESS = frozenset({DRIVER_PID_ENV, JOURNAL_ENV, "PYTEST_CURRENT_TEST"})
SERVER_TAKES = frozenset({"AIO_CACHE_DIR"})
# What a fork applies itself, before its command runs, so that none chooses a server and a run over thread counts
# and core sets forks every process from one server: transformers' verbosity (which every command sets), the thread
# count (OpenMP reads OMP_NUM_THREADS once, when torch loads; the fork sets it as OpenMP would have: FORK_STEPS) and
# the cores (numactl's --physcpubind is a sched_setaffinity, which the fork calls; numactl's memory binding, which
# must hold for every page, still starts a server of its own). Neither thread pool has started in the server, so
# the fork's threads start on its cores.
FORK_APPLIED = frozenset({"OMP_NUM_THREADS", "TRANSFORMERS_VERBOSITY"})
# Read where they are used, not at import: inductor's cache folder (which inductor itself sets in the driver the first
# time it looks, after the driver's server has started).
READ_WHEN_USED = frozenset({"TORCHINDUCTOR_CACHE_DIR"})
FORK_STEPS = ("aio_examples.machine.binding:apply_in_child", "aio_examples.machine.threads:apply_in_fork",
              "aio_examples.core.log:apply_in_fork")
# What every measurement process imports before its first pass, in this order; a module that does not import (an
# engine not installed) is left to the processes that need it. Not ONNX Runtime: it starts a thread at import, which
# a fork does not have and which its exit then fails to join (std::system_error). Named, not imported: the server
# runs what the layers above provide.
PRELOAD = ("torch", "aio_examples.compat.torchvision_shim:ensure_torchvision", "aio_examples.cli.commands",
           "aio_examples.measurement.runner", "aio_examples.backends", "aio_examples.models", "transformers",
           "transformers.modeling_utils", "torch._dynamo", "torch._inductor.compile_fx", "openvino")
MAX_SERVERS = 4
MAX_HEADER = 1 << 20                   # bytes: a longer command or environment runs a fresh interpreter
START_TIMEOUT_S = 300.0                # a server's imports; past it the process runs a fresh interpreter


def enabled(environ=None) -> bool:
    environ = os.environ if environ is None else environ
    return (environ.get(ENABLE_ENV, "1").strip() != "0" and hasattr(os, "fork") and hasattr(socket, "send_fds")
            and sys.platform.startswith("linux"))


# --- the driver's side ---------------------------------------------------------------------------------------

class Child:
    """A forked process, as much of `subprocess.Popen` as the drivers use: pid, returncode, poll, wait, signals."""

    def __init__(self, pid: int, status: socket.socket, args: list):
        self.pid, self.args, self.returncode = pid, args, None
        self._status, self._buf = status, b""

    def _ended(self, timeout_s: float | None) -> bool:
        try:
            line = _line(self._status, self, timeout_s)
        except TimeoutError:
            return False
        # EOF without a status: the server died, and its children with it (PR_SET_PDEATHSIG)
        self.returncode = int(line) if line is not None else -signal.SIGKILL
        self._status.close()
        return True

    def poll(self) -> int | None:
        if self.returncode is None:
            self._ended(0)
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        if self.returncode is None and not self._ended(timeout):
            raise subprocess.TimeoutExpired(self.args, timeout)
        return self.returncode

    def send_signal(self, sig: int) -> None:
        if self.poll() is None:                 # not yet reaped by the server, so the pid is still this process's
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.pid, sig)

    def terminate(self) -> None:
        self.send_signal(signal.SIGTERM)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)


def _line(sock: socket.socket, holder, timeout_s: float | None) -> str | None:
    """The next line on a status socket (`holder._buf` keeps what came after it); None at EOF; TimeoutError when
    none came in time."""
    deadline = None if timeout_s is None else time.monotonic() + timeout_s
    while b"\n" not in holder._buf:
        left = None if deadline is None else max(0.0, deadline - time.monotonic())
        if not select.select([sock], [], [], left)[0]:
            raise TimeoutError
        chunk = sock.recv(4096)
        if not chunk:
            return None
        holder._buf += chunk
    line, holder._buf = holder._buf.split(b"\n", 1)
    return line.decode()


class Server:
    """One fork server process (for one environment and prefix), and the children it forked for us."""

    def __init__(self, env: dict, prefix: list):
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        self.log = tempfile.TemporaryFile()  # noqa: SIM115  (what it said if it fails to start; closed in stop())
        try:
            self.proc = subprocess.Popen([*prefix, sys.executable, "-m", __name__, str(theirs.fileno())],
                                         env={**env, DRIVER_PID_ENV: str(os.getpid())}, stdin=subprocess.DEVNULL,
                                         stdout=subprocess.DEVNULL, stderr=self.log, pass_fds=(theirs.fileno(),),
                                         start_new_session=True)
        finally:
            theirs.close()
        self.sock, self.children, self.lock = ours, weakref.WeakSet(), threading.Lock()

    @property
    def busy(self) -> bool:
        return any(c.returncode is None for c in self.children)

    def fork(self, header: bytes, fds: list, args: list) -> Child | None:
        """The child forked for `header`, or None: the server did not start (or has ended), or cannot give the
        child its descriptors under their numbers (then a fresh interpreter does)."""
        status, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            with self.lock:
                socket.send_fds(self.sock, [header], [theirs.fileno(), *fds])
        except OSError:
            status.close()
            return None
        finally:
            theirs.close()
        child = Child(0, status, args)
        try:
            line = _line(status, child, START_TIMEOUT_S)
        except TimeoutError:            # its imports hang: it is stopped, so no child runs late
            line = None
            self.stop()
        if line is None or not line.isdigit():
            status.close()
            if line is None:
                self.log.seek(0)
                said = self.log.read().decode(errors="replace").strip().splitlines()
                logger.debug("the fork server ended (%s): a fresh interpreter instead", said[-1] if said else
                             f"exit code {self.proc.poll()}")
            return None
        child.pid = int(line)
        self.children.add(child)
        return child

    def stop(self) -> None:
        with contextlib.suppress(OSError):
            self.sock.close()           # EOF: the server exits (and so do children it still has)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(5)
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        self.log.close()


class Parent(Server):
    """In a forked process, the server it was forked from, for processes of the same environment and prefix: a
    forked driver's configurations fork from it too instead of from a server of their own. The server kills what
    it forked for this process when the process's end of the socket closes (it ended, or was killed)."""

    def __init__(self, sock: socket.socket):
        self.sock, self.children, self.lock = sock, weakref.WeakSet(), threading.Lock()
        self.proc = _Alive()
        self.log = tempfile.TemporaryFile()  # noqa: SIM115  (closed in stop())

    def stop(self) -> None:
        with contextlib.suppress(OSError):
            self.sock.close()
        self.log.close()


class _Alive:
    """The parent server, as `Server.proc`: while this process lives, so does it (this one dies with it)."""

    def __init__(self):
        self.pid = os.getppid()

    @staticmethod
    def poll():
        return None


def adopt(key: tuple, sock: socket.socket) -> None:
    """In a fork: the server it came from serves the processes of its environment and prefix (`key`)."""
    _servers[key] = Parent(sock)
    atexit.register(stop_all)


_servers: "OrderedDict[tuple, Server]" = OrderedDict()
_servers_lock = threading.Lock()


def _shapes_server(name: str) -> bool:
    """Whether a variable may change what the server's imports do, so that it needs a server of its own."""
    return not (name in PER_PROCESS or name in FORK_APPLIED or name in READ_WHEN_USED or name.startswith("AIO_"))


def _key(env: dict, prefix: list) -> tuple:
    return tuple(prefix), tuple(sorted((k, v) for k, v in env.items() if _shapes_server(k)))


def _cpu_list(text: str) -> list[int] | None:
    """numactl's "0-3,6" as CPU numbers; None for what else numactl accepts ("all", "+1", "!2", ...)."""
    cpus = []
    for part in text.split(","):
        low, _, high = part.partition("-")
        if not (low.isdigit() and (not high or high.isdigit())):
            return None
        cpus.extend(range(int(low), int(high or low) + 1))
    return cpus or None


def server_prefix(prefix: list) -> tuple[list, list[int] | None]:
    """The prefix of the server a command with `prefix` forks from, and the CPUs the fork binds itself to: a numactl
    prefix of --physcpubind and --membind loses its --physcpubind (FORK_APPLIED's comment); any other is kept."""
    if not prefix or os.path.basename(prefix[0]) != "numactl":
        return list(prefix), None
    cpus, kept = None, []
    for arg in prefix[1:]:
        name, _, value = arg.partition("=")
        if name == "--physcpubind" and cpus is None and (cpus := _cpu_list(value)) is not None:
            continue
        if name != "--membind":
            return list(prefix), None
        kept.append(arg)
    return (["numactl", *kept] if kept else []), cpus


def _writable_folder(path: str) -> bool:
    """Whether `path` is, or can be made, a folder this user writes in."""
    path = os.path.abspath(path)
    while not os.path.lexists(path):
        path = os.path.dirname(path)
    return os.path.isdir(path) and os.access(path, os.W_OK | os.X_OK)


def _server(env: dict, prefix: list) -> Server | None:
    key = _key(env, prefix)
    with _servers_lock:
        server = _servers.get(key)
        if server is not None and server.proc.poll() is not None:       # it ended (killed, a crash)
            del _servers[key]
            server = None
        if server is None:
            cache = env.get("AIO_CACHE_DIR")
            if cache and not _writable_folder(cache):     # the command says so itself; no server is built on it
                return None
            idle = [k for k, s in _servers.items() if not s.busy]
            while len(_servers) >= MAX_SERVERS and idle:
                _servers.pop(idle.pop(0)).stop()
            if not _servers:
                atexit.register(stop_all)
            server = _servers[key] = Server({k: v for k, v in env.items() if _shapes_server(k) or k in SERVER_TAKES},
                                            prefix)
            logger.debug("fork server %d started (%d running)", server.proc.pid, len(_servers))
        _servers.move_to_end(key)
        return server


def spawn(argv: list, env: dict, cwd, prefix: list | None, stdio: tuple, pass_fds=()) -> Child | None:
    """`python argv...` forked from the server for `env` and `prefix`, with `stdio` (fds for its stdin, stdout and
    stderr) and `pass_fds` under the same numbers; None when it must be a fresh interpreter (the module's
    docstring says when)."""
    if not (len(argv) > 1 and argv[0] in ("-m", "-c") and enabled(env)):
        return None
    prefix, cpus = server_prefix(list(prefix or []))
    header = json.dumps({"argv": list(argv), "env": dict(env), "cwd": str(cwd or os.getcwd()),
                         "targets": [0, 1, 2, *pass_fds], "prefix": prefix, "cpus": cpus}).encode()
    if len(header) > MAX_HEADER:
        return None
    server = _server(env, prefix)
    return None if server is None else server.fork(header, [*stdio, *pass_fds], [sys.executable, *argv])


def prestart(env: dict, prefix: list | None = None) -> None:
    """Start the server for `env` and `prefix` now, so its imports run while the driver does its own."""
    if enabled(env):
        _server(env, server_prefix(list(prefix or []))[0])


def stop_all() -> None:
    """Stop every server (at exit; their children end with them, as a fresh process ends with its driver)."""
    with _servers_lock:
        while _servers:
            _servers.popitem()[1].stop()


# --- the server's side ---------------------------------------------------------------------------------------

def _preload() -> None:
    for name in PRELOAD:
        module, _, call = name.partition(":")
        try:
            loaded = importlib.import_module(module)
            if call:
                getattr(loaded, call)()
        except Exception:  # noqa: BLE001, S110  (not installed or not loadable here: its processes say so)
            pass


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



def serve(control: socket.socket):
    """Fork a child per request until the driver closes the socket; in a child, return (request, fds, the
    connection on which it may ask for forks of its own)."""
    die_with_parent()
    _preload()
    gc.collect()
    gc.freeze()             # the collector leaves the preloaded objects alone: their pages stay shared with forks
    wake_r, wake_w = os.pipe()
    os.set_blocking(wake_w, False)
    os.set_blocking(wake_r, False)
    signal.set_wakeup_fd(wake_w)
    signal.signal(signal.SIGCHLD, lambda *_: None)
    jobs: dict[int, socket.socket] = {}
    # the driver's socket, and one per forked process (which may ask for forks of its own): what each asked for
    conns: dict[socket.socket, set] = {control: set()}
    while True:
        readable = select.select([*conns, wake_r], [], [])[0]
        if wake_r in readable:
            with contextlib.suppress(BlockingIOError):
                while os.read(wake_r, 4096):
                    pass
            _reap(jobs)
        for conn in [c for c in readable if c in conns]:
            try:
                data, fds, _, _ = socket.recv_fds(conn, MAX_HEADER + 1, 256)
            except OSError:
                data, fds = b"", []
            if not data:
                if conn is control:             # the driver has gone
                    return None
                for pid in conns.pop(conn):     # a forked process ended: what it started ends with it
                    if pid in jobs:
                        with contextlib.suppress(OSError):
                            os.killpg(pid, signal.SIGKILL)
                conn.close()
                continue
            job = _fork(conn, conns, jobs, fds, json.loads(data), (wake_r, wake_w))
            if job is not None:
                return job
        _reap(jobs)


def _fork(conn, conns: dict, jobs: dict, fds: list, request: dict, wake: tuple):
    """Fork the child `request` asks for on `conn`; in the child, return (request, fds, its own connection)."""
    status = socket.socket(fileno=fds[0])
    ours = {*(c.fileno() for c in conns), *wake, *fds, *(s.fileno() for s in jobs.values())}
    if {t for t in request["targets"] if t > 2} & (_open_fds() - ours):
        for fd in fds[1:]:          # a library of ours holds one of those numbers: a fresh interpreter
            os.close(fd)
        with contextlib.suppress(OSError):
            status.sendall(b"fresh\n")
        status.close()
        return None
    mine, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    sys.stdout.flush()
    sys.stderr.flush()
    pid = os.fork()
    if pid == 0:
        signal.set_wakeup_fd(-1)
        for sock in (*conns, *jobs.values(), mine, status):
            sock.close()
        for fd in wake:
            os.close(fd)
        return request, fds[1:], theirs
    theirs.close()
    for fd in fds[1:]:
        os.close(fd)
    with contextlib.suppress(OSError):
        status.sendall(f"{pid}\n".encode())
    jobs[pid] = status
    conns[conn].add(pid)
    conns[mine] = set()
    return None


def _open_fds() -> set:
    listing = os.open("/proc/self/fd", os.O_RDONLY | os.O_DIRECTORY)
    try:
        return {int(fd) for fd in os.listdir(listing)} - {listing}
    finally:
        os.close(listing)


def _reap(jobs: dict) -> None:
    while True:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        sock = jobs.pop(pid, None)
        if sock is not None:
            with contextlib.suppress(OSError):
                sock.sendall(f"{os.waitstatus_to_exitcode(status)}\n".encode())
            sock.close()


def _become(request: dict, fds: list, conn: socket.socket) -> None:
    """In the fork: the session, descriptors, environment, folder and signals of a fresh `python argv...`; the
    server it came from forks what it asks for with the same environment and prefix (`adopt`)."""
    import fcntl

    registry = importlib.import_module("aio_examples.core.forkserver")     # this file runs as __main__

    os.setsid()
    targets = request["targets"]
    moved = [fcntl.fcntl(fd, fcntl.F_DUPFD_CLOEXEC, max(targets) + 1) for fd in fds]
    for fd in fds:
        os.close(fd)
    kept = socket.socket(fileno=fcntl.fcntl(conn.fileno(), fcntl.F_DUPFD_CLOEXEC, max(targets) + 1))
    conn.close()
    registry.adopt(_key(request["env"], request.get("prefix", [])), kept)
    for fd, target in zip(moved, targets, strict=True):
        os.dup2(fd, target)
        os.close(fd)
    os.environ.clear()
    os.environ.update(request["env"])
    os.environ[DRIVER_PID_ENV] = str(os.getppid())      # it dies with the server, which dies with the driver
    die_with_parent()                                   # whatever it runs (a fork does not keep the server's)
    os.chdir(request["cwd"])
    if request.get("cpus"):
        os.sched_setaffinity(0, request["cpus"])        # numactl --physcpubind's own call
    for step in FORK_STEPS:
        module, _, call = step.partition(":")
        getattr(importlib.import_module(module), call)()
    signal.signal(signal.SIGCHLD, signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)


def _run(argv: list) -> None:
    """Run `-m MODULE args...` or `-c CODE args...` as the interpreter would, and end the process as it would (its
    threads joined, its atexit functions run, its output flushed), but without tearing down every module: in a fork,
    that touches every page of the server's heap, copying each (2-3 s here for torch and transformers)."""
    import runpy
    import traceback
    import types

    code, interrupted = 0, False
    try:
        if argv[0] == "-m":
            sys.argv = [argv[1], *argv[2:]]
            sys.path[0] = os.getcwd()
            runpy.run_module(argv[1], run_name="__main__", alter_sys=True)
        else:
            sys.argv = ["-c", *argv[2:]]
            sys.path[0] = ""
            main = types.ModuleType("__main__")
            sys.modules["__main__"] = main
            exec(compile(argv[1], "<string>", "exec"), main.__dict__)  # noqa: S102  (the driver's own command)
    except SystemExit as exc:
        code = _exit_code(exc.code)
    except KeyboardInterrupt:
        traceback.print_exc()
        interrupted = True
    except BaseException:  # noqa: BLE001  (as the interpreter: its traceback, exit code 1)
        traceback.print_exc()
        code = 1
    threading._shutdown()                # as Py_Finalize does first: wait for the threads it started
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    if interrupted:                      # as the interpreter reports an uncaught Ctrl-C: killed by SIGINT
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGINT)
    os._exit(code)


def _exit_code(value) -> int:
    if value is None:
        return 0
    if isinstance(value, int):
        return value & 0xFF
    print(value, file=sys.stderr)
    return 1


if __name__ == "__main__":
    job = serve(socket.socket(fileno=int(sys.argv[1])))
    if job is not None:
        _become(*job)
        _run(job[0]["argv"])
