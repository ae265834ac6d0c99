"""Which thread count a run uses, and putting it in effect."""

import os
from dataclasses import dataclass

from ..core.errors import UsageError
from .topology import Topology, read_topology


@dataclass(frozen=True)
class ThreadChoice:
    threads: int
    source: str          # "--threads", "AIO_NUM_THREADS", "OMP_NUM_THREADS" or "physical cores"


def _parse(name: str, raw: str) -> int:
    try:
        value = int(str(raw).strip())
    except ValueError:
        value = 0
    if value < 1:
        raise UsageError(f"{name}={raw!r} is invalid; accepted: a whole number of threads >= 1")
    return value


def resolve_threads(cli_value=None, environ=None, topology: Topology | None = None,
                    allow_oversubscribe: bool = False) -> ThreadChoice:
    """`-t`, else AIO_NUM_THREADS, else OMP_NUM_THREADS, else the physical cores available.

    AIO_NUM_THREADS and OMP_NUM_THREADS that disagree are an error unless `-t` settles it,
    and more threads than logical CPUs available needs `allow_oversubscribe`.
    """
    environ = os.environ if environ is None else environ
    topology = topology or read_topology()
    aio = environ.get("AIO_NUM_THREADS", "").strip()
    omp = environ.get("OMP_NUM_THREADS", "").strip()
    aio_n = _parse("AIO_NUM_THREADS", aio) if aio else None
    omp_n = _parse("OMP_NUM_THREADS", omp) if omp else None
    if cli_value is not None:
        choice = ThreadChoice(_parse("--threads", cli_value), "--threads")
    elif aio_n is not None and omp_n is not None and aio_n != omp_n:
        raise UsageError(f"AIO_NUM_THREADS={aio_n} contradicts OMP_NUM_THREADS={omp_n}; "
                         "set them equal, unset one, or pass -t/--threads")
    elif aio_n is not None:
        choice = ThreadChoice(aio_n, "AIO_NUM_THREADS")
    elif omp_n is not None:
        choice = ThreadChoice(omp_n, "OMP_NUM_THREADS")
    else:
        choice = ThreadChoice(topology.physical_cores, "physical cores")
    if choice.threads > topology.logical_cpus and not allow_oversubscribe:
        raise UsageError(f"{choice.source}={choice.threads} is more than the {topology.logical_cpus} CPUs "
                         f"available to this process; accepted: 1..{topology.logical_cpus}, "
                         "or pass --allow-oversubscribe")
    return choice


def thread_env(threads: int) -> dict:
    """The variables thread pools read at start-up (OpenMP's, and ours so a child resolves the same count)."""
    return {"OMP_NUM_THREADS": str(threads), "AIO_NUM_THREADS": str(threads)}


def export_thread_env(threads: int, environ=None) -> None:
    """Set the env vars thread pools read at start-up; call before importing torch where possible."""
    (os.environ if environ is None else environ).update(thread_env(threads))


def apply_threads(threads: int) -> int:
    """Put the thread count in effect for torch and return what torch reports afterwards."""
    import torch

    torch.set_num_threads(threads)
    return torch.get_num_threads()


def apply_in_fork() -> None:
    """In a process forked from a fork server (core/forkserver.py), whose torch loaded without OMP_NUM_THREADS: the
    thread count OpenMP would have read as torch loaded here, OMP_NUM_THREADS (its first number) or else the cores
    this process may run on."""
    import sys

    if "torch" not in sys.modules:
        return
    first = os.environ.get("OMP_NUM_THREADS", "").split(",")[0].strip()
    apply_threads(int(first) if first.isdigit() and int(first) > 0 else len(os.sched_getaffinity(0)))
