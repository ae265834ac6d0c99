"""The memory allocator of a measurement process: a sweep axis, and part of every record's environment.

First-touch page faults of glibc malloc cost eager torch a lot at larger batches; tcmalloc and
jemalloc (through `LD_PRELOAD`) or glibc's huge pages (`GLIBC_TUNABLES=glibc.malloc.hugetlb=1`) avoid
much of that. Not every runtime tolerates a preloaded allocator: OpenVINO aborts (`double free or
corruption`) under both, so its backend refuses to run there (see `preload_conflict`).
"""

import os
from pathlib import Path

from ..core.errors import UnsupportedError, UsageError

ALLOCATORS = ("default", "tcmalloc", "jemalloc", "hugetlb")
_LIBRARIES = {"tcmalloc": ("libtcmalloc.so.4", "libtcmalloc_minimal.so.4"), "jemalloc": ("libjemalloc.so.2",)}
_PACKAGES = {"tcmalloc": "libgoogle-perftools4 (Debian/Ubuntu)", "jemalloc": "libjemalloc2 (Debian/Ubuntu)"}
_LIB_DIRS = ("/usr/lib/x86_64-linux-gnu", "/usr/lib/aarch64-linux-gnu", "/usr/lib64", "/usr/lib", "/usr/local/lib")
HUGETLB_TUNABLE = "glibc.malloc.hugetlb=1"


def validate(name: str) -> str:
    if name not in ALLOCATORS:
        raise UsageError(f"allocator {name!r} is unknown; accepted: {', '.join(ALLOCATORS)}")
    return name


def library(name: str) -> str | None:
    """Path of the shared library that provides a preloadable allocator, if installed."""
    for lib in _LIBRARIES.get(name, ()):
        for folder in _LIB_DIRS:
            path = Path(folder) / lib
            if path.exists():
                return str(path)
    return None


def env_for(name: str, environ=None) -> dict:
    """Variables that make a child process use this allocator (on top of `environ`)."""
    environ = os.environ if environ is None else environ
    validate(name)
    if name == "default":
        return {}
    if name == "hugetlb":
        tunables = [t for t in environ.get("GLIBC_TUNABLES", "").split(":") if t]
        return {"GLIBC_TUNABLES": ":".join([*tunables, HUGETLB_TUNABLE])}
    path = library(name)
    if path is None:
        raise UnsupportedError(f"{name} is not installed here (install {_PACKAGES[name]})")
    preload = [p for p in environ.get("LD_PRELOAD", "").split(":") if p]
    return {"LD_PRELOAD": ":".join([path, *preload])}


def in_use(environ=None) -> str:
    """Which allocator this process runs with, from its environment."""
    environ = os.environ if environ is None else environ
    preloaded = preload_conflict(environ)
    if preloaded:
        return preloaded
    if HUGETLB_TUNABLE in environ.get("GLIBC_TUNABLES", ""):
        return "hugetlb"
    return "default"


def preload_conflict(environ=None) -> str | None:
    """The preloaded allocator (tcmalloc or jemalloc) some runtimes cannot live with, or None."""
    environ = os.environ if environ is None else environ
    for part in environ.get("LD_PRELOAD", "").replace(" ", ":").split(":"):
        base = Path(part).name
        for name in ("tcmalloc", "jemalloc"):
            if base.startswith(f"lib{name}"):
                return name
    return None
