"""CPU topology as the process sees it: allowed CPUs, physical cores, cgroup quota.

Readers take a sysfs/cgroup root so tests can feed canned trees of other machines.
"""

import math
import os
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Topology:
    allowed_cpus: tuple[int, ...]            # logical CPUs in this process's affinity mask
    core_of: dict[int, tuple[int, int]]      # cpu -> (package, core) for allowed cpus
    numa_nodes: tuple[int, ...]
    cgroup_cpu_limit: float | None           # cpu.max quota / period, None when unlimited

    @property
    def physical_cores(self) -> int:
        """Distinct physical cores among allowed CPUs, capped by the cgroup quota."""
        cores = len({self.core_of[c] for c in self.allowed_cpus}) or len(self.allowed_cpus)
        if self.cgroup_cpu_limit is not None:
            cores = min(cores, max(1, math.floor(self.cgroup_cpu_limit)))
        return max(1, cores)

    @property
    def logical_cpus(self) -> int:
        """Logical CPUs the process may run on, capped by the cgroup quota."""
        n = len(self.allowed_cpus)
        if self.cgroup_cpu_limit is not None:
            n = min(n, max(1, math.ceil(self.cgroup_cpu_limit)))
        return max(1, n)


def _read(path: Path) -> str | None:
    try:
        return path.read_text().strip()
    except OSError:
        return None


def parse_cpu_list(text: str) -> tuple[int, ...]:
    """Parse a kernel CPU list such as '0-3,8,10-11'."""
    cpus: list[int] = []
    for part in text.replace(" ", ",").split(","):
        if not part:
            continue
        if "-" in part:
            lo, hi = part.split("-", 1)
            cpus.extend(range(int(lo), int(hi) + 1))
        else:
            cpus.append(int(part))
    return tuple(sorted(set(cpus)))


def cgroup_cpu_limit(cgroup_root: Path = Path("/sys/fs/cgroup")) -> float | None:
    """CPU quota in cores from cgroup v2 `cpu.max` or v1 `cpu.cfs_quota_us`; None if unlimited."""
    v2 = _read(cgroup_root / "cpu.max")
    if v2:
        quota, _, period = v2.partition(" ")
        if quota != "max" and period:
            return int(quota) / int(period)
        return None
    quota = _read(cgroup_root / "cpu" / "cpu.cfs_quota_us")
    period = _read(cgroup_root / "cpu" / "cpu.cfs_period_us")
    if quota and period and int(quota) > 0:
        return int(quota) / int(period)
    return None


def read_topology(allowed: tuple[int, ...] | None = None, sysfs: Path = Path("/sys/devices/system"),
                  cgroup_root: Path = Path("/sys/fs/cgroup")) -> Topology:
    """Read the topology of this machine (or of canned sysfs/cgroup trees)."""
    if allowed is None:
        allowed = tuple(sorted(os.sched_getaffinity(0)))
    core_of = {}
    for cpu in allowed:
        topo = sysfs / "cpu" / f"cpu{cpu}" / "topology"
        pkg = _read(topo / "physical_package_id")
        core = _read(topo / "core_id")
        core_of[cpu] = (int(pkg) if pkg else 0, int(core) if core else cpu)
    nodes = sorted(int(p.name[4:]) for p in (sysfs / "node").glob("node[0-9]*")) if (sysfs / "node").is_dir() else [0]
    return Topology(tuple(allowed), core_of, tuple(nodes) or (0,), cgroup_cpu_limit(cgroup_root))
