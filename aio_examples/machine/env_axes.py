"""torch runtime settings that are environment variables, read once when the process starts: sweep axes like the
allocator (machine/allocators.py), set in a point's environment before it imports torch.

- `LRU_CACHE_CAPACITY`: how many oneDNN primitives torch keeps created for reuse, which a model with many distinct
  shapes can outgrow. 0 (none kept) is refused: torch 2.13 segfaults at its first strided 7x7 convolution with it
  here (resnet_18's stem), so every conv net would only record a crash.
- `THP_MEM_ALLOC_ENABLE`: 1 lets torch's CPU allocator align large allocations to huge pages and advise the
  kernel to back them with transparent huge pages (fewer TLB misses and page faults); 0 or unset does not.

A record carries the ones set in its process in `env.env_axes` (read there, in the measuring process) and they are
part of its configuration key (`env_axes`); unset is the runtime's default.
"""

import os
from dataclasses import dataclass

from ..core.errors import UsageError


@dataclass(frozen=True)
class EnvAxis:
    key: str                  # the sweep's key (and flag) for a list of values
    variable: str             # the environment variable torch reads
    accepted: str             # what a value may be, as a usage error says it
    smallest: int
    largest: int | None = None


ENV_AXES = (
    EnvAxis("lru_cache_capacity", "LRU_CACHE_CAPACITY", "whole numbers >= 1 (torch crashes at 0)", 1),
    EnvAxis("thp_mem_alloc", "THP_MEM_ALLOC_ENABLE", "0 or 1", 0, 1),
)
VARIABLES = tuple(a.variable for a in ENV_AXES)


def check(axis: EnvAxis, values) -> list[int]:
    """A sweep's values of `axis`: a non-empty list of whole numbers in its range, each once."""
    if not isinstance(values, list) or not values:
        raise UsageError(f"{axis.key} {values!r} is invalid; accepted: a non-empty list of {axis.accepted}")
    for v in values:
        if (isinstance(v, bool) or not isinstance(v, int) or v < axis.smallest
                or (axis.largest is not None and v > axis.largest)):
            raise UsageError(f"{axis.key} value {v!r} is invalid; accepted: {axis.accepted}")
    twice = sorted({v for v in values if values.count(v) > 1})
    if twice:
        raise UsageError(f"{axis.key} lists {', '.join(map(str, twice))} more than once; accepted: each value once")
    return values


def env_for(settings) -> dict:
    """The variables of a point's settings, ((VARIABLE, value), ...), for its environment."""
    return {variable: str(value) for variable, value in settings}


def in_use(environ=None) -> dict:
    """The axes' variables set in this process's environment, {VARIABLE: value}."""
    environ = os.environ if environ is None else environ
    return {v: environ[v] for v in VARIABLES if v in environ}
