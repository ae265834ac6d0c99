"""CPU topology as the process sees it: allowed CPUs, physical cores, SMT siblings, sockets, NUMA nodes, cgroup quota.

Everything here is pure: the readers take canned text or a sysfs/cgroup root so tests can describe other machines,
and the selection helpers only look at a `Topology`. Pinning a run to CPUs is the caller's business.
"""

import math
import os
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from ..core.errors import UsageError

NUMA_CPUS_ENV = "AIO_NUMA_CPUS"


@dataclass(frozen=True)
class Topology:
    allowed_cpus: tuple[int, ...]            # logical CPUs in this process's affinity mask
    core_of: dict[int, tuple[int, int]]      # cpu -> (package, core) for allowed cpus
    numa_nodes: tuple[int, ...]              # every NUMA node of the machine, allowed CPUs or not
    cgroup_cpu_limit: float | None           # cpu.max quota / period, None when unlimited
    node_of: dict[int, int] = field(default_factory=dict)   # cpu -> NUMA node; missing means node 0

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

    def _core(self, cpu: int) -> tuple[int, int]:
        return self.core_of.get(cpu, (0, cpu))

    def _node(self, cpu: int) -> int:
        return self.node_of.get(cpu, 0)

    @property
    def sockets(self) -> tuple[int, ...]:
        """Packages that hold at least one allowed CPU."""
        return tuple(sorted({self._core(c)[0] for c in self.allowed_cpus}))

    @property
    def node_cpus(self) -> dict[int, tuple[int, ...]]:
        """NUMA node -> its allowed CPUs, only for nodes this process can run on."""
        out: dict[int, list[int]] = {}
        for cpu in self.allowed_cpus:
            out.setdefault(self._node(cpu), []).append(cpu)
        return {node: tuple(sorted(cpus)) for node, cpus in sorted(out.items())}

    @property
    def core_cpus(self) -> tuple[tuple[int, ...], ...]:
        """Allowed CPUs grouped by physical core (SMT siblings together, lowest first), in `primary_cpus` order,
        ignoring the cgroup quota."""
        groups: dict[tuple[int, int], list[int]] = {}
        for cpu in sorted(self.allowed_cpus):
            groups.setdefault(self._core(cpu), []).append(cpu)
        ordered = sorted(groups.items(), key=lambda kv: (self._node(kv[1][0]), kv[0][0], kv[0][1], kv[1][0]))
        return tuple(tuple(cpus) for _, cpus in ordered)

    def siblings(self, cpu: int) -> tuple[int, ...]:
        """Allowed CPUs sharing `cpu`'s physical core, itself included."""
        key = self._core(cpu)
        return tuple(c for c in sorted(self.allowed_cpus) if self._core(c) == key)

    def primary_cpus(self) -> tuple[int, ...]:
        """One CPU per physical core (the lowest sibling), by NUMA node, socket, core, cpu; at most floor(quota)
        cores when a cgroup quota is set, since more cores than the quota only buys throttling."""
        primaries = tuple(group[0] for group in self.core_cpus)
        if self.cgroup_cpu_limit is not None:
            primaries = primaries[:max(1, math.floor(self.cgroup_cpu_limit))]
        return primaries

    def _preferred_order(self) -> tuple[int, ...]:
        """Every allowed CPU: one per physical core first, then second siblings, third siblings, ...

        The quota does not remove CPUs here: it limits CPU time, not which CPUs may be used."""
        groups = self.core_cpus
        depth = max((len(g) for g in groups), default=0)
        return tuple(g[k] for k in range(depth) for g in groups if k < len(g))

    def _check_numa_cpus(self, numa_cpus: Sequence[int]) -> tuple[int, ...]:
        listed = tuple(int(c) for c in numa_cpus)
        allowed = set(self.allowed_cpus)
        accepted = f"accepted: CPUs from {format_cpu_list(self.allowed_cpus)}, each at most once"
        for cpu in listed:
            if cpu not in allowed:
                raise UsageError(f"{NUMA_CPUS_ENV} lists CPU {cpu}, which this process may not run on; {accepted}")
        dup = next((c for i, c in enumerate(listed) if c in listed[:i]), None)
        if dup is not None:
            raise UsageError(f"{NUMA_CPUS_ENV} lists CPU {dup} twice; {accepted}")
        return listed

    def pick_cpus(self, n: int, numa_cpus: Sequence[int] | None = None) -> tuple[int, ...]:
        """The CPUs for `n` threads: the first n of `numa_cpus` (the user's explicit choice) when given, else one per
        physical core first (SMT siblings share execution units, so they add little for dense compute), then the
        remaining siblings."""
        if n < 1:
            raise UsageError(f"threads={n} is invalid; accepted: a whole number of threads >= 1")
        if numa_cpus is not None:
            listed = self._check_numa_cpus(numa_cpus)
            if len(listed) < n:
                raise UsageError(f"{NUMA_CPUS_ENV}={_spaced(listed)!r} lists {len(listed)} CPUs but {n} threads need "
                                 f"{n}; accepted: at least {n} CPUs from {format_cpu_list(self.allowed_cpus)}")
            return listed[:n]
        order = self._preferred_order()
        if n > len(order):
            raise UsageError(f"{n} threads need {n} CPUs but only {len(order)} are available to this process "
                             f"(CPUs {format_cpu_list(self.allowed_cpus)}); accepted: 1..{len(order)}")
        return order[:n]

    def disjoint_cpu_sets(self, instances: int, threads_per_instance: int,
                          numa_cpus: Sequence[int] | None = None) -> tuple[tuple[int, ...], ...]:
        """`instances` disjoint CPU sets of `threads_per_instance` CPUs, laid out as one would by hand:

        * no two instances share a physical core. When every thread gets a core of its own, an instance takes
          `threads_per_instance` cores; when the threads need SMT siblings, each instance takes an equal share
          of the whole cores, its threads one per core first, then on the siblings;
        * an instance stays within one NUMA node: the first node (in `core_cpus` order) that still has the
          cores it needs, else the next free cores (an instance larger than a node spans whole nodes).

        Only where whole cores cannot go round (3 instances x 5 threads on 8 cores x 2 threads) do instances
        share cores: then the sets are runs of `pick_cpus`' order. With `numa_cpus`, the user's order is split
        in runs.
        """
        if instances < 1 or threads_per_instance < 1:
            raise UsageError(f"instances={instances}, threads per instance={threads_per_instance} is invalid; "
                             "accepted: whole numbers >= 1")
        total = instances * threads_per_instance
        shape = f"{instances} instances x {threads_per_instance} threads need {total} CPUs"
        if numa_cpus is not None:
            listed = self._check_numa_cpus(numa_cpus)
            if len(listed) < total:
                raise UsageError(f"{shape} but {NUMA_CPUS_ENV}={_spaced(listed)!r} lists only {len(listed)}; "
                                 f"accepted: at least {total} CPUs from {format_cpu_list(self.allowed_cpus)}")
            return tuple(listed[i * threads_per_instance:(i + 1) * threads_per_instance] for i in range(instances))
        order = self._preferred_order()
        if total > len(order):
            raise UsageError(f"{shape} but only {len(order)} are available to this process "
                             f"(CPUs {format_cpu_list(self.allowed_cpus)}); accepted: instances x threads <= "
                             f"{len(order)}")
        cores = self.core_cpus
        if total <= len(cores):
            sets = self._core_shares(instances, threads_per_instance, threads_per_instance, [c[:1] for c in cores])
        else:
            sets = self._core_shares(instances, threads_per_instance, len(cores) // instances, list(cores))
        if sets is not None:
            return sets
        return tuple(order[i * threads_per_instance:(i + 1) * threads_per_instance] for i in range(instances))

    def _core_shares(self, instances: int, threads: int, cores_each: int,
                     usable: list[tuple[int, ...]]) -> tuple[tuple[int, ...], ...] | None:
        """`cores_each` whole cores per instance (of `usable`, each core's CPUs an instance may use), placed in
        one NUMA node where one has them free; None when they do not go round or hold too few CPUs."""
        if cores_each < 1:
            return None
        free = list(range(len(usable)))
        sets = []
        for _ in range(instances):
            by_node: dict[int, list[int]] = {}
            for i in free:
                by_node.setdefault(self._node(usable[i][0]), []).append(i)
            chosen = next((idx[:cores_each] for idx in by_node.values() if len(idx) >= cores_each), free[:cores_each])
            groups = [usable[i] for i in chosen]
            cpus = [g[k] for k in range(max((len(g) for g in groups), default=0)) for g in groups if k < len(g)]
            if len(chosen) < cores_each or len(cpus) < threads:
                return None
            sets.append(tuple(sorted(cpus[:threads])))
            taken = set(chosen)
            free = [i for i in free if i not in taken]
        return tuple(sets)

    def instance_layouts(self) -> list[tuple[int, int]]:
        """The (instances, threads per instance) layouts worth trying on the physical cores (`--instances
        auto`), fewest instances first: one thread per core and every core used, instance sizes halving from the
        whole machine and from a NUMA node (192 cores: 192, 96, 48, ..., 3, seven layouts rather than the 14
        divisors), each kept when its instances lie within one node or span whole nodes."""
        cores = self.physical_cores
        node_cores = {node: {self._core(c) for c in cpus} for node, cpus in self.node_cpus.items()}
        sizes: set[int] = set()
        for top in (cores, min(len(v) for v in node_cores.values())):
            while top >= 1:
                sizes.add(top)
                if top % 2:
                    break
                top //= 2
        layouts = {(1, cores)}
        for size in sizes:
            if cores % size:
                continue
            sets = self.disjoint_cpu_sets(cores // size, size)
            if all(len(self.nodes_of(s)) == 1
                   or {self._core(c) for c in s} == set().union(*(node_cores[n] for n in self.nodes_of(s)))
                   for s in sets):
                layouts.add((cores // size, size))
        return sorted(layouts)

    def spare_cpus(self, used: Iterable[int]) -> tuple[int, ...]:
        """The allowed CPUs of the physical cores none of whose CPUs is in `used`: where a driver's own threads
        (LoadGen's issuing and feeder threads) run without taking time from the instances (an SMT sibling of an
        instance's CPU shares its core, so it is not spare)."""
        busy = {self._core(c) for c in used}
        return tuple(c for c in self.allowed_cpus if self._core(c) not in busy)

    def nodes_of(self, cpus: Iterable[int]) -> tuple[int, ...]:
        """NUMA nodes the given CPUs belong to, to record where a run's memory is likely to live."""
        return tuple(sorted({self._node(c) for c in cpus}))

    def default_thread_counts(self) -> list[int]:
        """Powers of two up to the physical cores available, plus that maximum: a scaling sweep that ends at the
        count a default run uses."""
        top = self.physical_cores
        counts = [1 << k for k in range(top.bit_length()) if 1 << k < top]
        return [*counts, top]


def _read(path: Path) -> str | None:
    try:
        return path.read_text().strip()
    except OSError:
        return None


def _spaced(cpus: Iterable[int]) -> str:
    return " ".join(str(c) for c in cpus)


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


def format_cpu_list(cpus: Iterable[int]) -> str:
    """The kernel's compact form, '0-3,8', so messages about big machines stay on one line."""
    runs: list[list[int]] = []
    for cpu in sorted(set(cpus)):
        if runs and cpu == runs[-1][1] + 1:
            runs[-1][1] = cpu
        else:
            runs.append([cpu, cpu])
    return ",".join(str(lo) if lo == hi else f"{lo}-{hi}" for lo, hi in runs) or "none"


_NUMA_ITEM = re.compile(r"(\d+)(?:-(\d+))?")


def parse_numa_cpus(text: str) -> tuple[int, ...]:
    """Parse AIO_NUMA_CPUS ('0 1 2', '0,1,2' or '0-3', 0-based) keeping the user's order, which decides which CPUs
    the first threads get."""
    accepted = "accepted: 0-based CPU numbers separated by spaces or commas, ranges like 0-3, each CPU once"
    items = [item for item in re.split(r"[\s,]+", text.strip()) if item]
    if not items:
        raise UsageError(f"{NUMA_CPUS_ENV}={text!r} lists no CPUs; {accepted}")
    cpus: list[int] = []
    for item in items:
        match = _NUMA_ITEM.fullmatch(item)
        if not match or (match[2] is not None and int(match[2]) < int(match[1])):
            raise UsageError(f"{NUMA_CPUS_ENV}={text!r} has {item!r}; {accepted}")
        lo = int(match[1])
        hi = int(match[2]) if match[2] is not None else lo
        for cpu in range(lo, hi + 1):
            if cpu in cpus:
                raise UsageError(f"{NUMA_CPUS_ENV}={text!r} lists CPU {cpu} twice; {accepted}")
            cpus.append(cpu)
    return tuple(cpus)


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
    node_dirs = sorted((sysfs / "node").glob("node[0-9]*")) if (sysfs / "node").is_dir() else []
    nodes = sorted(int(p.name[4:]) for p in node_dirs)
    wanted = set(allowed)
    node_of = {}
    for path in node_dirs:
        cpulist = _read(path / "cpulist")
        for cpu in parse_cpu_list(cpulist) if cpulist else ():
            if cpu in wanted:
                node_of[cpu] = int(path.name[4:])
    return Topology(tuple(allowed), core_of, tuple(nodes) or (0,), cgroup_cpu_limit(cgroup_root), node_of)


def from_lscpu(text: str, allowed: Iterable[int] | None = None, cgroup_limit: float | None = None) -> Topology:
    """Build a topology from `lscpu -p=CPU,Core,Socket,Node` output (the machine's own view, handy where sysfs is
    hidden). `allowed=None` means every listed CPU; an empty Socket or Node column (no NUMA info) counts as 0.

    lscpu numbers cores across the whole machine while sysfs numbers them per socket, so `core_of` ids can differ
    between the two readers; the grouping into cores is the same.
    """
    columns = ["cpu", "core", "socket", "node"]
    rows: dict[int, dict[str, str]] = {}
    for line in text.splitlines():
        line = line.strip()
        if line.startswith("#"):
            header = [name.strip().lower() for name in line.lstrip("#").split(",")]
            if "cpu" in header and all(re.fullmatch(r"\w+", name) for name in header):
                columns = header
            continue
        if not line:
            continue
        values = [v.strip() for v in line.split(",")]
        row = dict(zip(columns, values))
        if len(values) != len(columns) or not row["cpu"].isdigit():
            raise UsageError(f"lscpu line {line!r} does not match columns {','.join(columns)}; "
                             "accepted: output of lscpu -p=CPU,Core,Socket,Node")
        rows[int(row["cpu"])] = row

    def number(row: dict[str, str], key: str, default: int) -> int:
        value = row.get(key, "")
        return int(value) if value.isdigit() else default

    cpus = tuple(sorted(rows)) if allowed is None else tuple(sorted(set(allowed)))
    core_of = {}
    node_of = {}
    for cpu in cpus:
        row = rows.get(cpu, {})
        core_of[cpu] = (number(row, "socket", 0), number(row, "core", cpu))
        node_of[cpu] = number(row, "node", 0)
    nodes = sorted({number(row, "node", 0) for row in rows.values()})
    return Topology(cpus, core_of, tuple(nodes) or (0,), cgroup_limit, node_of)


def numa_cpus_from_env(environ=None) -> tuple[int, ...] | None:
    """The cores `AIO_NUMA_CPUS` chooses, or None when it is not set."""
    environ = os.environ if environ is None else environ
    text = environ.get(NUMA_CPUS_ENV, "").strip()
    return parse_numa_cpus(text) if text else None
