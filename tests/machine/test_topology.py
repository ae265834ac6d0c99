"""Topology readers and core selection on canned machines: a 2-socket SMT server, a 2-CPU VM, a restricted container."""

import os
import shutil
import subprocess
from pathlib import Path

import pytest

from aio_examples.core.errors import UsageError
from aio_examples.machine.topology import (
    Topology,
    cgroup_cpu_limit,
    format_cpu_list,
    from_lscpu,
    parse_numa_cpus,
    read_topology,
)

# 2 sockets x 4 cores x 2 threads, one NUMA node per socket; CPU c and c+8 are SMT siblings, as Linux numbers them.
# lscpu numbers cores across the machine (0-7); sysfs core_id restarts at 0 on each socket.
SERVER_LSCPU = """\
# The following is the parsable format, which can be fed to other
# programs. Each different item in every column has an unique ID
# starting usually from zero.
# CPU,Core,Socket,Node
0,0,0,0
1,1,0,0
2,2,0,0
3,3,0,0
4,4,1,1
5,5,1,1
6,6,1,1
7,7,1,1
8,0,0,0
9,1,0,0
10,2,0,0
11,3,0,0
12,4,1,1
13,5,1,1
14,6,1,1
15,7,1,1
"""
SERVER_CORES = {0: (0, 0), 1: (0, 1), 2: (0, 2), 3: (0, 3), 4: (1, 0), 5: (1, 1), 6: (1, 2), 7: (1, 3),
                8: (0, 0), 9: (0, 1), 10: (0, 2), 11: (0, 3), 12: (1, 0), 13: (1, 1), 14: (1, 2), 15: (1, 3)}
SERVER_NODES = {0: "0-3,8-11", 1: "4-7,12-15"}

# A 2-vCPU VM without SMT and one node, like the machine these tests were written on.
VM_LSCPU = """\
# The following is the parsable format, which can be fed to other
# programs. Each different item in every column has an unique ID
# starting usually from zero.
# CPU,Core,Socket,Node
0,0,0,0
1,1,0,0
"""
# Same VM where lscpu has no NUMA information.
VM_LSCPU_NO_NODE = """\
# CPU,Core,Socket,Node
0,0,0,
1,1,0,
"""
VM_CORES = {0: (0, 0), 1: (0, 1)}

CONTAINER_CPUS = (2, 3, 10, 11)   # two cores of socket 0 with their siblings


def make_sysfs(root: Path, cores: dict[int, tuple[int, int]], nodes: dict[int, str]) -> Path:
    """A canned /sys/devices/system: cpu -> (package, core_id), node -> cpulist."""
    for cpu, (pkg, core) in cores.items():
        topo = root / "cpu" / f"cpu{cpu}" / "topology"
        topo.mkdir(parents=True)
        (topo / "physical_package_id").write_text(f"{pkg}\n")
        (topo / "core_id").write_text(f"{core}\n")
    for node, cpulist in nodes.items():
        (root / "node" / f"node{node}").mkdir(parents=True)
        (root / "node" / f"node{node}" / "cpulist").write_text(cpulist + "\n")
    return root


def make_cgroup(root: Path, cpu_max: str | None = None) -> Path:
    root.mkdir()
    if cpu_max:
        (root / "cpu.max").write_text(cpu_max + "\n")
    return root


def server_sysfs(tmp_path, allowed=tuple(range(16)), cpu_max=None) -> Topology:
    return read_topology(allowed, make_sysfs(tmp_path / "sys", SERVER_CORES, SERVER_NODES),
                         make_cgroup(tmp_path / "cg", cpu_max))


SERVER = from_lscpu(SERVER_LSCPU)
VM = from_lscpu(VM_LSCPU)
CONTAINER = from_lscpu(SERVER_LSCPU, allowed=CONTAINER_CPUS, cgroup_limit=1.5)


def shape(topo: Topology) -> dict:
    """What both readers must agree on (core ids differ: lscpu numbers them machine-wide, sysfs per socket)."""
    return {"allowed": topo.allowed_cpus, "sockets": topo.sockets, "cores": topo.core_cpus, "nodes": topo.numa_nodes,
            "node_cpus": topo.node_cpus, "quota": topo.cgroup_cpu_limit, "primary": topo.primary_cpus(),
            "physical": topo.physical_cores, "logical": topo.logical_cpus,
            "order": topo.pick_cpus(len(topo.allowed_cpus))}


def is_usage_error(err, *words) -> bool:
    text = str(err.value)
    return "\n" not in text and all(w in text for w in words)


# counts and siblings

def test_server_counts_and_siblings():
    assert SERVER.sockets == (0, 1) and SERVER.numa_nodes == (0, 1)
    assert (SERVER.physical_cores, SERVER.logical_cpus) == (8, 16)
    assert SERVER.node_cpus == {0: (0, 1, 2, 3, 8, 9, 10, 11), 1: (4, 5, 6, 7, 12, 13, 14, 15)}
    assert SERVER.siblings(3) == (3, 11) and SERVER.siblings(12) == (4, 12)
    assert SERVER.core_cpus == ((0, 8), (1, 9), (2, 10), (3, 11), (4, 12), (5, 13), (6, 14), (7, 15))


@pytest.mark.parametrize("text", [VM_LSCPU, VM_LSCPU_NO_NODE])
def test_vm_counts(text):
    vm = from_lscpu(text)
    assert (vm.physical_cores, vm.logical_cpus, vm.sockets, vm.numa_nodes) == (2, 2, (0,), (0,))
    assert vm.node_cpus == {0: (0, 1)} and vm.siblings(1) == (1,)
    assert vm.primary_cpus() == (0, 1)


def test_container_counts_respect_affinity_and_quota():
    assert (CONTAINER.physical_cores, CONTAINER.logical_cpus) == (1, 2)
    assert CONTAINER.sockets == (0,) and CONTAINER.node_cpus == {0: CONTAINER_CPUS}
    assert CONTAINER.numa_nodes == (0, 1)       # the machine's nodes, not only the ones the container may use
    assert CONTAINER.core_cpus == ((2, 10), (3, 11))
    assert CONTAINER.primary_cpus() == (2,)     # floor(1.5) cores
    unlimited = from_lscpu(SERVER_LSCPU, allowed=CONTAINER_CPUS)
    assert unlimited.physical_cores == 2 and unlimited.primary_cpus() == (2, 3)


def test_old_constructor_defaults_to_node_zero():
    topo = Topology((0, 1), {0: (0, 0), 1: (0, 0)}, (0,), None)
    assert topo.nodes_of((0, 1)) == (0,) and topo.node_cpus == {0: (0, 1)} and topo.primary_cpus() == (0,)


# primary_cpus order

def test_primary_cpus_go_by_node_then_socket_then_core():
    # Node 0 holds sockets 1 and 2, node 1 holds socket 0: node order beats socket order, socket order beats
    # core order (socket 2's core 1 comes after socket 1's cores), core order beats cpu numbers (cpu 3 before 2).
    text = "# CPU,Core,Socket,Node\n0,0,0,1\n1,1,0,1\n2,3,1,0\n3,2,1,0\n4,3,1,0\n5,0,0,1\n6,1,2,0\n"
    topo = from_lscpu(text)
    assert topo.primary_cpus() == (3, 2, 6, 0, 1)
    assert topo.siblings(2) == (2, 4) and topo.siblings(0) == (0, 5)
    assert len(topo.primary_cpus()) == topo.physical_cores
    assert SERVER.primary_cpus() == (0, 1, 2, 3, 4, 5, 6, 7)


def test_lscpu_columns_follow_the_header():
    topo = from_lscpu("# CPU,Socket,Node,Core\n0,0,0,0\n1,0,0,0\n2,1,1,1\n")
    assert topo.core_cpus == ((0, 1), (2,)) and topo.node_cpus == {0: (0, 1), 1: (2,)}


def test_garbled_lscpu_is_a_usage_error():
    with pytest.raises(UsageError) as err:
        from_lscpu("# CPU,Core,Socket,Node\n0,0,0\n")
    assert is_usage_error(err, "'0,0,0'", "lscpu -p=CPU,Core,Socket,Node")


# pick_cpus

@pytest.mark.parametrize("n, expected", [
    (1, (0,)),
    (4, (0, 1, 2, 3)),
    (8, (0, 1, 2, 3, 4, 5, 6, 7)),
    (10, (0, 1, 2, 3, 4, 5, 6, 7, 8, 9)),        # physical cores exhausted: siblings next, in core order
    (16, (0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15)),
])
def test_pick_cpus_takes_physical_cores_before_siblings(n, expected):
    assert SERVER.pick_cpus(n) == expected


def test_pick_cpus_with_adjacent_siblings():
    # Some machines number SMT siblings next to each other (0/1, 2/3, ...): numeric order would pick siblings.
    topo = from_lscpu("# CPU,Core,Socket,Node\n0,0,0,0\n1,0,0,0\n2,1,0,0\n3,1,0,0\n4,2,0,0\n5,2,0,0\n")
    assert topo.pick_cpus(3) == (0, 2, 4)
    assert topo.pick_cpus(5) == (0, 2, 4, 1, 3)
    # 4 threads on 3 cores: SMT siblings are needed, so each instance takes a whole core of its own
    assert topo.disjoint_cpu_sets(2, 2) == ((0, 1), (2, 3))


def test_pick_cpus_in_container():
    assert CONTAINER.pick_cpus(1) == (2,)
    assert CONTAINER.pick_cpus(2) == (2, 3)      # the quota limits time, not which CPUs
    assert CONTAINER.pick_cpus(3) == (2, 3, 10)
    with pytest.raises(UsageError) as err:
        CONTAINER.pick_cpus(5)
    assert is_usage_error(err, "only 4", "2-3,10-11", "1..4")


@pytest.mark.parametrize("n", [17, 0])
def test_pick_cpus_out_of_range(n):
    with pytest.raises(UsageError) as err:
        SERVER.pick_cpus(n)
    assert is_usage_error(err, "accepted")


def test_pick_cpus_with_numa_cpus_keeps_the_users_order():
    assert SERVER.pick_cpus(2, parse_numa_cpus("12 13 4")) == (12, 13)
    assert SERVER.pick_cpus(3, [12, 13, 4]) == (12, 13, 4)
    assert CONTAINER.pick_cpus(2, [11, 10]) == (11, 10)


@pytest.mark.parametrize("topo, n, cpus, words", [
    (CONTAINER, 1, [2, 5], ("AIO_NUMA_CPUS", "CPU 5", "2-3,10-11")),    # a listed CPU outside the affinity mask
    (SERVER, 1, [0, 16], ("CPU 16", "0-15")),
    (SERVER, 3, [0, 1], ("AIO_NUMA_CPUS='0 1'", "3 threads", "at least 3")),
    (SERVER, 2, [1, 1], ("CPU 1 twice",)),
])
def test_pick_cpus_rejects_bad_numa_cpus(topo, n, cpus, words):
    with pytest.raises(UsageError) as err:
        topo.pick_cpus(n, cpus)
    assert is_usage_error(err, *words)


# disjoint_cpu_sets

def test_disjoint_sets_2x1_and_2x4_on_server():
    assert SERVER.disjoint_cpu_sets(2, 1) == ((0,), (1,))
    sets = SERVER.disjoint_cpu_sets(2, 4)
    assert sets == ((0, 1, 2, 3), (4, 5, 6, 7))
    assert [SERVER.nodes_of(s) for s in sets] == [(0,), (1,)]
    flat = [c for s in sets for c in s]
    assert len(set(flat)) == len(flat) == 8
    assert len({SERVER.core_of[c] for c in flat}) == 8       # no two CPUs of one core: physical cores first


def test_disjoint_sets_never_share_a_core_between_instances():
    # 3x3 = 9 threads on 8 cores: siblings are needed; each instance takes 2 whole cores (8 // 3) in one node,
    # its threads one per core first, rather than 3,7,8 (two nodes, and 8 on instance 0's core 0)
    assert SERVER.disjoint_cpu_sets(3, 3) == ((0, 1, 8), (2, 3, 10), (4, 5, 12))
    # 2x6: a socket each (4 cores, 6 of their 8 CPUs), not 6-11 (siblings of the first instance's cores)
    assert SERVER.disjoint_cpu_sets(2, 6) == ((0, 1, 2, 3, 8, 9), (4, 5, 6, 7, 12, 13))
    # 3x5: 2 whole cores hold 4 CPUs, too few: only then do instances share cores, in pick_cpus' order
    assert SERVER.disjoint_cpu_sets(3, 5) == ((0, 1, 2, 3, 4), (5, 6, 7, 8, 9), (10, 11, 12, 13, 14))


def test_disjoint_sets_stay_within_a_node_that_has_room():
    # 2 nodes x 4 cores, no SMT: 2x3's second set would be 3,4,5 (both nodes); node 1 has 3 free cores
    eight = from_lscpu("# CPU,Core,Socket,Node\n" + "".join(f"{c},{c},{c // 4},{c // 4}\n" for c in range(8)))
    assert eight.disjoint_cpu_sets(2, 3) == ((0, 1, 2), (4, 5, 6))
    assert eight.disjoint_cpu_sets(1, 6) == ((0, 1, 2, 3, 4, 5),)       # larger than a node: the next free cores


def test_disjoint_sets_with_numa_cpus_and_in_container():
    assert SERVER.disjoint_cpu_sets(2, 2, parse_numa_cpus("8-11")) == ((8, 9), (10, 11))
    assert CONTAINER.disjoint_cpu_sets(2, 2) == ((2, 10), (3, 11))      # a core each, not a sibling of each core


@pytest.mark.parametrize("topo, instances, threads, cpus, words", [
    (SERVER, 2, 9, None, ("18 CPUs", "only 16")),
    (CONTAINER, 3, 2, None, ("6 CPUs", "only 4", "2-3,10-11")),
    (SERVER, 2, 2, [0, 1, 2], ("4 CPUs", "lists only 3")),
    (SERVER, 1, 1, [0, 20], ("CPU 20",)),
])
def test_disjoint_sets_that_do_not_fit(topo, instances, threads, cpus, words):
    with pytest.raises(UsageError) as err:
        topo.disjoint_cpu_sets(instances, threads, cpus)
    assert is_usage_error(err, *words)


def test_nodes_of():
    assert SERVER.nodes_of([12, 0]) == (0, 1)
    assert SERVER.nodes_of([8, 9]) == (0,)
    assert SERVER.nodes_of([]) == ()


# default_thread_counts

@pytest.mark.parametrize("cores, expected", [(1, [1]), (2, [1, 2]), (3, [1, 2, 3]), (6, [1, 2, 4, 6]),
                                             (8, [1, 2, 4, 8]), (12, [1, 2, 4, 8, 12])])
def test_default_thread_counts(cores, expected):
    topo = Topology(tuple(range(cores)), {c: (0, c) for c in range(cores)}, (0,), None)
    assert topo.default_thread_counts() == expected


def test_default_thread_counts_use_physical_cores():
    assert SERVER.default_thread_counts() == [1, 2, 4, 8]
    assert CONTAINER.default_thread_counts() == [1]
    assert VM.default_thread_counts() == [1, 2]


# parse_numa_cpus / format_cpu_list

@pytest.mark.parametrize("text, expected", [
    ("0 1", (0, 1)), ("0,1, 2", (0, 1, 2)), ("0-3", (0, 1, 2, 3)), (" 4 0-1 ", (4, 0, 1)), ("7", (7,)),
])
def test_parse_numa_cpus(text, expected):
    assert parse_numa_cpus(text) == expected


@pytest.mark.parametrize("text", ["", "  ", "a", "1-", "-1", "3-1", "1 1", "0-2 2", "0.5", "0;1"])
def test_parse_numa_cpus_rejects_garbage(text):
    with pytest.raises(UsageError) as err:
        parse_numa_cpus(text)
    assert is_usage_error(err, f"AIO_NUMA_CPUS={text!r}", "accepted")


def test_format_cpu_list():
    assert format_cpu_list([11, 0, 1, 2, 3, 8, 10]) == "0-3,8,10-11"
    assert format_cpu_list([]) == "none"


# the two readers agree

def test_readers_agree_on_server(tmp_path):
    assert shape(server_sysfs(tmp_path)) == shape(SERVER)


def test_readers_agree_on_container(tmp_path):
    sysfs = server_sysfs(tmp_path, CONTAINER_CPUS, "150000 100000")
    assert sysfs.cgroup_cpu_limit == 1.5
    assert shape(sysfs) == shape(CONTAINER)


@pytest.mark.parametrize("text, nodes", [(VM_LSCPU, {0: "0-1"}), (VM_LSCPU_NO_NODE, {})])
def test_readers_agree_on_vm(tmp_path, text, nodes):
    sysfs = read_topology((0, 1), make_sysfs(tmp_path / "sys", VM_CORES, nodes), make_cgroup(tmp_path / "cg"))
    assert shape(sysfs) == shape(from_lscpu(text))


def test_readers_see_a_different_machine_differently(tmp_path):
    """Guards the agreement tests: the comparison does notice a wrong topology."""
    assert shape(server_sysfs(tmp_path)) != shape(from_lscpu(SERVER_LSCPU.replace("12,4,1,1", "12,5,1,1")))


@pytest.mark.skipif(shutil.which("lscpu") is None, reason="lscpu is not installed")
def test_readers_agree_on_this_machine():
    out = subprocess.run(["lscpu", "-p=CPU,Core,Socket,Node"], capture_output=True, text=True, timeout=30,
                         check=True).stdout
    allowed = sorted(os.sched_getaffinity(0))
    lscpu, sysfs = from_lscpu(out, allowed, cgroup_cpu_limit()), read_topology()
    assert lscpu.allowed_cpus == sysfs.allowed_cpus
    assert sorted(lscpu.core_cpus) == sorted(sysfs.core_cpus)
    assert lscpu.node_cpus == sysfs.node_cpus
    assert (lscpu.physical_cores, lscpu.logical_cpus) == (sysfs.physical_cores, sysfs.logical_cpus)


def test_spare_cpus_are_whole_cores_no_instance_touches():
    # SERVER: 8 cores x 2 threads, cpu c and c + 8 siblings; two instances on cores 0-1 and 2-3
    used = (0, 1, 2, 3)
    assert SERVER.spare_cpus(used) == (4, 5, 6, 7, 12, 13, 14, 15)     # siblings 8-11 share the instances' cores
    assert SERVER.spare_cpus(range(16)) == ()
    assert CONTAINER.spare_cpus((2,)) == (3, 11)                         # only the allowed CPUs
    assert VM.spare_cpus((0,)) == (1,)
