"""Core and memory binding of a measurement process, decided by the parent before the process starts.

`AIO_CPU_BIND` (default 1) binds a point to its cores, `AIO_MEM_BIND` (default 1) binds its memory
to the NUMA node(s) of those cores, `AIO_NUMA_CPUS` ("0 1 ...") chooses the cores, the first N for
N threads (default: the first N physical cores, SMT siblings last). numactl does the binding when it
is installed, else the child calls `sched_setaffinity` on itself before torch starts (no memory binding). What was really applied, including any
fallback and why, travels to the child in `AIO_BINDING` and ends up in its records' `binding`.
"""

import json
import os
import shutil
import subprocess
from dataclasses import asdict, dataclass, field

from ..core.errors import UsageError
from .threads import thread_env
from .topology import Topology, format_cpu_list

BINDING_ENV = "AIO_BINDING"


def _switch(environ, name: str) -> bool:
    value = environ.get(name, "1").strip()
    if value not in ("0", "1"):
        raise UsageError(f"{name}={value!r} is invalid; accepted: 0 (off) or 1 (on, the default)")
    return value == "1"


@dataclass
class Binding:
    """How a process is bound: `method` is numactl, sched_setaffinity or none."""

    method: str
    cores: tuple[int, ...]
    membind: tuple[int, ...] | None = None
    warnings: list[str] = field(default_factory=list)

    def prefix(self) -> list[str]:
        """The command prefix that applies the binding (numactl), or nothing."""
        if self.method != "numactl":
            return []
        argv = ["numactl", f"--physcpubind={format_cpu_list(self.cores)}"]
        if self.membind:
            argv.append(f"--membind={format_cpu_list(self.membind)}")
        return argv

    def child_env(self, threads: int) -> dict:
        """Thread and binding variables for the child, in place before it imports torch."""
        return {**thread_env(threads),
                "AIO_NUMA_CPUS": " ".join(str(c) for c in self.cores),
                "OPENBLAS_NUM_THREADS": "1",      # numpy's own pool would compete with the measured one
                BINDING_ENV: json.dumps(self.to_dict())}

    def to_dict(self) -> dict:
        d = asdict(self)
        d["cores"] = list(self.cores)
        d["membind"] = list(self.membind) if self.membind else None
        return d


def plan(topology: Topology, cores: tuple[int, ...], environ=None) -> Binding:
    """The binding the switches ask for on these cores, applied for real once by `probe`."""
    environ = os.environ if environ is None else environ
    if not _switch(environ, "AIO_CPU_BIND"):
        return Binding("none", tuple(cores), None, ["AIO_CPU_BIND=0: not bound to cores"])
    membind = topology.nodes_of(cores) if _switch(environ, "AIO_MEM_BIND") else None
    if shutil.which("numactl"):
        return Binding("numactl", tuple(cores), membind)
    warning = "numactl is not installed: bound with sched_setaffinity"
    if membind:
        warning += ", memory not bound"
    return Binding("sched_setaffinity", tuple(cores), None, [warning])


_probed: dict = {}


def probe(binding: Binding) -> Binding:
    """Try the binding on a trivial command; fall back (with a warning) to what works, never fail.

    In a container numactl's memory binding is often refused (no CAP_SYS_NICE, or the node is not in
    the cpuset): then the cores are still bound. Results are cached per binding for the sweep.
    """
    key = (binding.method, binding.cores, binding.membind)
    if key in _probed:
        return _copy(_probed[key], binding.warnings)
    result = binding
    if binding.method == "numactl":
        err = _numactl_error(binding)
        if err and binding.membind:
            result = Binding("numactl", binding.cores, None,
                             [*binding.warnings, f"memory binding refused ({err}): cores bound, memory not"])
            err = _numactl_error(result)
        if err:
            result = Binding("sched_setaffinity", binding.cores, None,
                             [*binding.warnings, f"numactl refused the binding ({err}): used sched_setaffinity"])
    if result.method == "sched_setaffinity" and not set(result.cores) <= os.sched_getaffinity(0):
        outside = (f"cores {format_cpu_list(result.cores)} are outside this process's CPUs "
                   f"{format_cpu_list(sorted(os.sched_getaffinity(0)))}: not bound")
        result = Binding("none", result.cores, None, [*result.warnings, outside])
    _probed[key] = result
    return _copy(result, [])


def _copy(b: Binding, extra: list[str]) -> Binding:
    return Binding(b.method, b.cores, b.membind, list(dict.fromkeys([*extra, *b.warnings])))


def _numactl_error(binding: Binding) -> str | None:
    proc = subprocess.run([*binding.prefix(), "true"], capture_output=True, text=True, check=False)
    if proc.returncode == 0:
        return None
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    return lines[-1].strip() if lines else f"exit code {proc.returncode}"


def apply_in_child() -> None:
    """The sched_setaffinity method is applied by the child itself, first thing, before torch starts."""
    applied = observed()
    if applied.get("method") == "sched_setaffinity" and applied.get("cores"):
        os.sched_setaffinity(0, applied["cores"])


def observed() -> dict:
    """The binding this process was started with (from its parent), or `none` for a plain run."""
    raw = os.environ.get(BINDING_ENV)
    if not raw:
        return {"method": "none", "cores": None, "membind": None, "warnings": []}
    try:
        return json.loads(raw)
    except ValueError:
        return {"method": "unknown", "cores": None, "membind": None, "warnings": [f"unreadable {BINDING_ENV}"]}


def unused_switches(environ=None) -> list[str]:
    """The binding variables set for a plain `run`, which no driver binds: they would be ignored without a word.
    Each as a warning line (the run goes on: not binding is what a plain run does)."""
    environ = os.environ if environ is None else environ
    if BINDING_ENV in environ:          # a point of a sweep or throughput run: its driver applied them
        return []
    return [f"{name}={environ[name]!r} is for sweeps and throughput runs, which bind each point; this run is not "
            "bound by it (bind it with numactl or taskset, or run it as a sweep)"
            for name in ("AIO_NUMA_CPUS", "AIO_CPU_BIND", "AIO_MEM_BIND") if name in environ]
