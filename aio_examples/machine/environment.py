"""The machine and software a result was measured on, captured once per process."""

import functools
import importlib.metadata
import os
import platform
import socket
import subprocess
from pathlib import Path

from . import allocators
from .cpuinfo import read_cpu
from .topology import read_topology

ENV_PREFIXES = ("AIO_", "OMP_", "DNNL_", "ONEDNN_", "MKL_", "KMP_", "OPENBLAS_", "GOMP_")
ENV_NAMES = ("LD_PRELOAD", "MALLOC_CONF", "GLIBC_TUNABLES", "THP_MEM_ALLOC_ENABLE", "LRU_CACHE_CAPACITY",
             "TORCH_MKLDNN_MATMUL_MIN_DIM")
# What the machine a sweep runs on offers, as its driver saw it before binding a point to some of its cores
# (a container or a Ray node restricted to fewer CPUs than the host has is a smaller machine), and the
# user's name for its kind (a Ray node's `machine` label, e.g. an instance type): set by the sweep drivers.
MACHINE_CPUS_ENV = "AIO_MACHINE_CPUS"
MACHINE_TYPE_ENV = "AIO_MACHINE_TYPE"
PACKAGES = ("torch", "torchvision", "transformers", "numpy", "onnxruntime", "openvino", "ultralytics")


def _version(pkg: str) -> str | None:
    try:
        return importlib.metadata.version(pkg)
    except importlib.metadata.PackageNotFoundError:
        return None


_PROJECT_ROOT = Path(__file__).resolve().parent.parent


def git_commit(path: Path = _PROJECT_ROOT) -> str | None:
    """Commit of the harness checkout (None outside a git checkout)."""
    try:
        out = subprocess.run(["git", "-C", str(path), "rev-parse", "HEAD"], capture_output=True, text=True,
                             timeout=5, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return out.stdout.strip() if out.returncode == 0 else None


@functools.lru_cache(maxsize=1)
def _static() -> dict:
    cpu = read_cpu()
    topo = read_topology()
    arm = {k: cpu[k] for k in ("cpu_id", "sve_vector_bits", "sme_vector_bits") if k in cpu}
    return {
        "cpu_model": cpu["name"],
        "isa": cpu["isa"],
        **arm,
        "arch": platform.machine(),
        "logical_cpus": os.cpu_count(),
        "physical_cores_available": topo.physical_cores,
        "numa_nodes": len(topo.numa_nodes),
        "kernel": platform.release(),
        "os": platform.platform(),
        "python": platform.python_version(),
        "versions": {p: _version(p) for p in PACKAGES},
        "git_commit": git_commit(),
        "hostname": socket.gethostname(),
    }


def capture(extra: dict | None = None) -> dict:
    """Static facts plus the env vars in effect now (they can change between runs in one process)."""
    env = dict(_static())
    env["env_vars"] = {k: v for k, v in sorted(os.environ.items())
                       if k.startswith(ENV_PREFIXES) or k in ENV_NAMES}
    env["allocator"] = allocators.in_use()
    if os.environ.get(MACHINE_CPUS_ENV, "").isdigit():
        env["machine_cpus"] = int(os.environ[MACHINE_CPUS_ENV])
    if os.environ.get(MACHINE_TYPE_ENV, "").strip():
        env["machine_type"] = os.environ[MACHINE_TYPE_ENV].strip()
    env.update(extra or {})
    return env
