"""This machine's memory bandwidth per thread count: the speed limit of LLM decoding.

Decoding a token reads every weight once, so weight bytes x tokens/s can never exceed what memory delivers;
`roofline_share` says how close a generation came. Two figures, both over float32 arrays far larger than the
last-level cache (each >= LLC_FACTOR x the LLC, the three >= MIN_TOTAL_BYTES), best of REPEATS timed
repetitions after a warm-up, the two interleaved so a disturbance hits both:

- triad, STREAM's `a = b + s*c` (`torch.add(b, c, alpha=s, out=a)`), counted as STREAM counts it: 3 arrays x
  bytes per element x n per iteration (2 reads + 1 write). The write-allocate read of `a` that most CPUs add is
  not counted, as STREAM does not count it, so the triad figure is below the traffic memory really carried.
- read, `torch.sum(b)`: 1 array x bytes per element x n, reads only, like streaming weights.

The roofline uses `read`: a decode step's traffic is reads of the weights (and of the KV cache); the triad's
write half and its uncounted write-allocate make it the lower figure for that. Should the triad count higher on
a machine (a sum that is compute bound at few threads), the roofline takes it: it is a ceiling, the highest rate
memory was seen to deliver. Each thread count is measured in its own process, like the GEMM peak (peak.py), so
the count is in effect before torch starts its pool and the arrays never add to a caller's memory; and it is
cached like that peak: per machine (peak.fingerprint(): CPU model, architecture, ISA, torch and OpenVINO versions)
and per thread count, an entry measured over other array sizes not reused.
"""

import json
import math
import subprocess
import sys
import time
from pathlib import Path

from ..core.errors import UsageError
from ..core.paths import write_json_atomic
from . import peak
from .contention import CONTENDED_CORES

KIND = "bandwidth"                    # the cache's folder: $AIO_CACHE_DIR/bandwidth/<fingerprint digest>.json
DTYPE, ELEMENT_BYTES = "float32", 4
LLC_FACTOR = 4                        # each array >= 4 x the last-level cache, so none of it stays cached
MIN_TOTAL_BYTES = 256 << 20           # ... and the three arrays >= 256 MiB together
DEFAULT_LLC_BYTES = 64 << 20          # when neither /sys nor lscpu says: larger than most LLCs, so arrays stay large
REPEATS = 10                          # timed repetitions after one warm-up; the best counts, as in STREAM
SCALAR = 3.0


def _size(text: str) -> int | None:
    """`32768K`, `1M`, `1048576` (sysfs cache sizes) in bytes."""
    text = text.strip().upper()
    scale = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}.get(text[-1:], 1)
    digits = text[:-1] if text[-1:] in "KMG" else text
    return int(digits) * scale if digits.isdigit() else None


def llc_from_sysfs(cpu_root: Path = Path("/sys/devices/system/cpu")) -> int | None:
    """Bytes of last-level cache over the whole machine: the highest-level data or unified cache, each
    instance (CPUs sharing it) counted once, summed over the instances (sockets, CCXs)."""
    instances: dict[tuple, int] = {}
    for index in cpu_root.glob("cpu[0-9]*/cache/index[0-9]*"):
        try:
            if (index / "type").read_text().strip() == "Instruction":
                continue
            level = int((index / "level").read_text())
            size = _size((index / "size").read_text())
            shared = (index / "shared_cpu_list").read_text().strip()
        except (OSError, ValueError):
            continue
        if size:
            instances[(level, shared)] = size
    if not instances:
        return None
    top = max(level for level, _ in instances)
    return sum(size for (level, _), size in instances.items() if level == top)


def llc_from_lscpu(text: str) -> int | None:
    """The same from `lscpu -C -B` (columns NAME ONE-SIZE ALL-SIZE ... TYPE LEVEL ...): ALL-SIZE of the
    highest level that is not an instruction cache."""
    lines = [line.split() for line in text.splitlines() if line.strip()]
    if not lines or not {"ALL-SIZE", "LEVEL"} <= set(lines[0]):
        return None
    head = lines[0]
    best: tuple[int, int] | None = None
    for row in lines[1:]:
        if len(row) != len(head) or ("TYPE" in head and row[head.index("TYPE")] == "Instruction"):
            continue
        level, size = row[head.index("LEVEL")], _size(row[head.index("ALL-SIZE")])
        if level.isdigit() and size and (best is None or int(level) > best[0]):
            best = (int(level), size)
    return best[1] if best else None


def llc_bytes() -> tuple[int, str]:
    """(bytes of last-level cache, where that came from: `sysfs`, `lscpu` or `default`)."""
    found = llc_from_sysfs()
    if found:
        return found, "sysfs"
    try:
        text = subprocess.run(["lscpu", "-C", "-B"], capture_output=True, text=True, timeout=10, check=False).stdout
    except (OSError, subprocess.SubprocessError):
        text = ""
    found = llc_from_lscpu(text)
    return (found, "lscpu") if found else (DEFAULT_LLC_BYTES, "default")


def _memory_bytes() -> int | None:
    """The machine's memory (MemTotal), or the cgroup's limit when lower: fixed, so the default arrays (and
    with them the cache's entries) do not change from one call to the next as free memory does."""
    found = []
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                found.append(int(line.split()[1]) << 10)
    except (OSError, ValueError, IndexError):
        pass
    try:
        found.append(int(Path("/sys/fs/cgroup/memory.max").read_text()))
    except (OSError, ValueError):       # absent, or "max"
        pass
    return min(found) if found else None


def default_array_bytes(llc: int, memory: int | None = None) -> int:
    """Bytes of each of the three arrays: >= LLC_FACTOR x `llc` and >= a third of MIN_TOTAL_BYTES, in whole
    MiB; the three kept within a quarter of `memory` (then smaller than asked, never below 1 MiB)."""
    mib = 1 << 20
    want = max(LLC_FACTOR * llc, -(-MIN_TOTAL_BYTES // 3))
    want = -(-want // mib) * mib
    if memory:
        want = min(want, max(mib, memory // 12 // mib * mib))
    return want


def measure_here(threads: int, array_bytes: int | None = None, repeats: int = REPEATS) -> dict:
    """Measure in this process at `threads` torch threads (put back afterwards): {"read_gb_s", "triad_gb_s",
    "roofline", "roofline_gb_s", ...}. `array_bytes` per array (default: default_array_bytes); small arrays
    measure the caches, not memory (tests use them to be quick)."""
    import os

    import torch

    from .contention import busy_elsewhere, snapshot

    if threads < 1 or repeats < 1:
        raise UsageError(f"threads={threads}, repeats={repeats}: accepted: whole numbers >= 1")
    llc, llc_source = llc_bytes()
    array_bytes = array_bytes or default_array_bytes(llc, _memory_bytes())
    dtype, size = getattr(torch, DTYPE), ELEMENT_BYTES
    n = _whole_elements(array_bytes) // size
    before_threads = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        a, b, c = (torch.empty(n, dtype=dtype) for _ in range(3))
        for x, v in ((a, 1.0), (b, 2.0), (c, 0.5)):   # first touch by the measuring threads (their NUMA nodes)
            x.fill_(v)
        torch.add(b, c, alpha=SCALAR, out=a)            # warm-up
        torch.sum(b)
        triad_s = read_s = math.inf
        start = snapshot()
        for _ in range(repeats):
            t0 = time.perf_counter()
            torch.add(b, c, alpha=SCALAR, out=a)
            t1 = time.perf_counter()
            torch.sum(b)
            t2 = time.perf_counter()
            triad_s, read_s = min(triad_s, t1 - t0), min(read_s, t2 - t1)
        busy = busy_elsewhere(start, snapshot())
        in_effect = torch.get_num_threads()
    finally:
        torch.set_num_threads(before_threads)
    triad = 3 * size * n / max(triad_s, 1e-9) / 1e9
    read = size * n / max(read_s, 1e-9) / 1e9
    roofline = "read" if read >= triad else "triad"
    spare = max(0, len(os.sched_getaffinity(0)) - in_effect)
    return {"read_gb_s": read, "triad_gb_s": triad, "roofline": roofline, "roofline_gb_s": max(read, triad),
            "threads": in_effect, "array_bytes": size * n, "dtype": DTYPE, "repeats": repeats,
            "llc_bytes": llc, "llc_source": llc_source,
            "busy_elsewhere_cores": round(busy, 2), "contended": busy > spare + CONTENDED_CORES}


def measure_bandwidth(threads_list, array_bytes: int | None = None, timeout_s: float = 300.0) -> dict:
    """Measure every thread count in a fresh process; {threads(str): entry} of this call (an entry with
    "error" when its process failed). Entries that measured are merged into the machine's cached table
    {"fingerprint", "bandwidth": {threads(str): entry}}; failures are not cached."""
    measured = {}
    for threads in threads_list:
        args = [str(threads), str(array_bytes or 0)]
        measured[str(threads)] = peak.measure_in_child(KIND, "aio_examples.machine.bandwidth", args, threads, timeout_s)
    ok = {t: e for t, e in measured.items() if "error" not in e}
    if ok:
        table = peak.cached(KIND) or {"fingerprint": peak.fingerprint(), KIND: {}}   # re-read: others may write
        table.setdefault(KIND, {}).update(ok)
        write_json_atomic(peak.cache_path(KIND), table, indent=1)
    return measured


def memory_bandwidth(threads: int, array_bytes: int | None = None, timeout_s: float = 300.0) -> dict:
    """This machine's bandwidth at `threads`: the cached entry, else measured now (in its own process) and
    cached. {"read_gb_s", "triad_gb_s", "roofline", "roofline_gb_s", "threads", "array_bytes", "dtype",
    "repeats", "llc_bytes", "llc_source", "busy_elsewhere_cores", "contended", "cached"}; "cached" is True when
    nothing was measured. A failed measurement returns {"error", "cached": False, "roofline_gb_s": None}.
    An entry over other arrays than `array_bytes` (default: default_array_bytes) is measured again."""
    if threads < 1:
        raise UsageError(f"threads={threads} is invalid; accepted: a whole number of threads >= 1")
    want = array_bytes or default_array_bytes(llc_bytes()[0], _memory_bytes())
    entry = (peak.cached(KIND).get(KIND) or {}).get(str(threads))
    if entry and entry.get("array_bytes") == _whole_elements(want):
        return {**entry, "cached": True}
    entry = measure_bandwidth([threads], want, timeout_s)[str(threads)]
    return {"roofline_gb_s": None, **entry, "cached": False}


def _whole_elements(array_bytes: int) -> int:
    """The bytes an array of `array_bytes` really has: whole DTYPE elements, at least one."""
    return max(1, array_bytes // ELEMENT_BYTES) * ELEMENT_BYTES


def roofline_share(weight_bytes: int, tokens_per_s: float, bandwidth_gb_s: float) -> float:
    """The share of the memory roofline a generation reached: decode reads every weight once per token, so it
    moved weight_bytes x tokens_per_s bytes a second, against bandwidth_gb_s x 1e9 the memory can deliver.
    1.0 is the limit (above it, part of the weights stayed in cache or the bandwidth was measured low).
    KV-cache reads are not counted: at long contexts the real traffic is higher than the share says."""
    if not (bandwidth_gb_s > 0 and math.isfinite(bandwidth_gb_s)):
        raise ValueError(f"bandwidth_gb_s={bandwidth_gb_s!r}: accepted: a finite number of GB/s > 0")
    if weight_bytes < 0 or not (tokens_per_s >= 0 and math.isfinite(tokens_per_s)):
        raise ValueError(f"weight_bytes={weight_bytes!r}, tokens_per_s={tokens_per_s!r}: accepted: finite, >= 0")
    return weight_bytes * tokens_per_s / (bandwidth_gb_s * 1e9)


if __name__ == "__main__":          # one thread count's measurement in its own process
    n_threads, n_bytes, dest = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
    Path(dest).parent.mkdir(parents=True, exist_ok=True)
    Path(dest).write_text(json.dumps(measure_here(n_threads, n_bytes or None)))
