"""Multi-instance layouts, numactl lines and `--instances auto` on the servers the product compares, from canned
`lscpu -p=CPU,Core,Socket,Node` (and /sys) of each: what a person would write by hand for each machine.

Linux numbers the CPUs of an x86 server with SMT socket by socket for the first thread of each core, then the
second threads in the same order (CPU c and c + cores are siblings); arm64 servers have one thread per core.
"""

import shutil

import pytest
from test_topology import make_cgroup, make_sysfs, shape

from aio_examples.machine.binding import plan
from aio_examples.machine.topology import Topology, format_cpu_list, from_lscpu, read_topology

HEADER = ("# The following is the parsable format, which can be fed to other\n"
          "# programs. Each different item in every column has an unique ID\n"
          "# starting usually from zero.\n"
          "# CPU,Core,Socket,Node\n")


def lscpu(rows) -> str:
    """lscpu's parsable output for (cpu, core, socket, node) rows."""
    return HEADER + "".join(f"{cpu},{core},{socket},{node}\n" for cpu, core, socket, node in rows)


# AWS Graviton3 (c7g.16xlarge): 64 Neoverse V1 cores, one thread each, one node
GRAVITON3 = lscpu((c, c, 0, 0) for c in range(64))
# AWS Graviton4 (r8g.24xlarge): 96 Neoverse V2 cores, one node; the 2-socket metal: 192 cores, a node per socket
GRAVITON4 = lscpu((c, c, 0, 0) for c in range(96))
GRAVITON4_METAL = lscpu((c, c, c // 96, c // 96) for c in range(192))
# Ampere Altra Max M128: 128 Neoverse N1 cores; NUMA modes monolithic (one node) and quadrant (4 x 32 cores)
ALTRA_MAX = lscpu((c, c, 0, 0) for c in range(128))
ALTRA_MAX_QUADRANT = lscpu((c, c, 0, c // 32) for c in range(128))
# AmpereOne A192: 192 cores, one node
AMPEREONE = lscpu((c, c, 0, 0) for c in range(192))
# 2-socket Xeon, 56 cores x 2 threads per socket, a node per socket: siblings c and c + 112
XEON = lscpu((c, c % 112, c % 112 // 56, c % 112 // 56) for c in range(224))
# 2-socket EPYC, 64 cores x 2 threads per socket in NPS4: 4 nodes of 16 cores per socket; siblings c and c + 128
EPYC_NPS4 = lscpu((c, c % 128, c % 128 // 64, c % 128 // 16) for c in range(256))

MACHINES = {name: from_lscpu(text) for name, text in {
    "graviton3": GRAVITON3, "graviton4": GRAVITON4, "graviton4_metal": GRAVITON4_METAL, "altra_max": ALTRA_MAX,
    "altra_max_quadrant": ALTRA_MAX_QUADRANT, "ampereone": AMPEREONE, "xeon": XEON, "epyc_nps4": EPYC_NPS4,
}.items()}


def layout(topo: Topology, instances: int, threads: int) -> list[tuple[str, str]]:
    """Each instance's CPUs and the nodes its memory binds to, written as numactl takes them."""
    return [(format_cpu_list(s), format_cpu_list(topo.nodes_of(s)))
            for s in topo.disjoint_cpu_sets(instances, threads)]


def runs(start: int, size: int, count: int, node_of=lambda lo: 0) -> list[tuple[str, str]]:
    """`count` consecutive blocks of `size` CPUs from `start`, each bound to the node `node_of` its first CPU."""
    return [(f"{lo}-{lo + size - 1}", str(node_of(lo))) for lo in range(start, start + size * count, size)]


def test_the_machines_are_what_they_claim():
    counts = {name: (t.physical_cores, t.logical_cpus, len(t.sockets), len(t.numa_nodes))
              for name, t in MACHINES.items()}
    assert counts == {"graviton3": (64, 64, 1, 1), "graviton4": (96, 96, 1, 1), "graviton4_metal": (192, 192, 2, 2),
                      "altra_max": (128, 128, 1, 1), "altra_max_quadrant": (128, 128, 1, 4),
                      "ampereone": (192, 192, 1, 1), "xeon": (112, 224, 2, 2), "epyc_nps4": (128, 256, 2, 8)}
    assert MACHINES["xeon"].siblings(3) == (3, 115) and MACHINES["epyc_nps4"].siblings(70) == (70, 198)
    assert MACHINES["epyc_nps4"].node_cpus[5] == tuple(range(80, 96)) + tuple(range(208, 224))


# Graviton: one thread per core, one node

def test_graviton3():
    g3 = MACHINES["graviton3"]
    assert layout(g3, 4, 16) == [("0-15", "0"), ("16-31", "0"), ("32-47", "0"), ("48-63", "0")]
    assert layout(g3, 1, 64) == [("0-63", "0")]
    assert g3.disjoint_cpu_sets(64, 1) == tuple((c,) for c in range(64))
    two = g3.disjoint_cpu_sets(2, 16)                     # LoadGen's threads go to the cores left over
    assert layout(g3, 2, 16) == runs(0, 16, 2) and g3.spare_cpus(c for s in two for c in s) == tuple(range(32, 64))


def test_graviton4():
    assert layout(MACHINES["graviton4"], 6, 16) == runs(0, 16, 6)
    metal = MACHINES["graviton4_metal"]
    assert layout(metal, 2, 96) == [("0-95", "0"), ("96-191", "1")]
    assert layout(metal, 4, 48) == [("0-47", "0"), ("48-95", "0"), ("96-143", "1"), ("144-191", "1")]
    assert layout(metal, 1, 192) == [("0-191", "0-1")]
    # 3 x 64: two fit in a node each; the third has 32 cores left in each node and takes both halves
    assert layout(metal, 3, 64) == [("0-63", "0"), ("96-159", "1"), ("64-95,160-191", "0-1")]


# Altra Max: 128 cores, one node or four

def test_altra_max_monolithic():
    assert layout(MACHINES["altra_max"], 8, 16) == runs(0, 16, 8)
    assert layout(MACHINES["altra_max"], 2, 64) == [("0-63", "0"), ("64-127", "0")]


def test_altra_max_quadrant():
    quad = MACHINES["altra_max_quadrant"]
    assert layout(quad, 4, 32) == [("0-31", "0"), ("32-63", "1"), ("64-95", "2"), ("96-127", "3")]
    assert layout(quad, 8, 16) == runs(0, 16, 8, lambda lo: lo // 32)
    assert layout(quad, 2, 64) == [("0-63", "0-1"), ("64-127", "2-3")]        # whole quadrants
    # 3 x 24: one per quadrant, not 0-23, 24-47 (quadrants 0 and 1), 48-71 (1 and 2)
    assert layout(quad, 3, 24) == [("0-23", "0"), ("32-55", "1"), ("64-87", "2")]


def test_ampereone():
    assert layout(MACHINES["ampereone"], 12, 16) == runs(0, 16, 12)
    assert layout(MACHINES["ampereone"], 192, 1) == [(str(c), "0") for c in range(192)]


# x86 with SMT and several nodes

def test_two_socket_xeon_with_smt():
    xeon = MACHINES["xeon"]
    assert layout(xeon, 2, 56) == [("0-55", "0"), ("56-111", "1")]
    assert layout(xeon, 4, 28) == [("0-27", "0"), ("28-55", "0"), ("56-83", "1"), ("84-111", "1")]
    # every hardware thread: a socket each with its siblings, never a sibling of the other instance's cores
    assert layout(xeon, 2, 112) == [("0-55,112-167", "0"), ("56-111,168-223", "1")]
    assert layout(xeon, 4, 56) == [("0-27,112-139", "0"), ("28-55,140-167", "0"),
                                   ("56-83,168-195", "1"), ("84-111,196-223", "1")]
    # 2 x 60 needs siblings: each instance keeps its socket's 56 cores and adds 4 of their siblings
    assert layout(xeon, 2, 60) == [("0-55,112-115", "0"), ("56-111,168-171", "1")]
    assert layout(xeon, 1, 8) == [("0-7", "0")]


def test_epyc_with_four_nodes_per_socket():
    epyc = MACHINES["epyc_nps4"]
    # 8 x 8: each instance within one node (two per node), memory bound to that node
    assert layout(epyc, 8, 8) == runs(0, 8, 8, lambda lo: lo // 16)
    assert layout(epyc, 8, 16) == runs(0, 16, 8, lambda lo: lo // 16)          # a node each, both sockets
    assert layout(epyc, 2, 64) == [("0-63", "0-3"), ("64-127", "4-7")]         # a socket each
    assert layout(epyc, 16, 16)[:3] == [("0-7,128-135", "0"), ("8-15,136-143", "0"), ("16-23,144-151", "1")]
    assert layout(epyc, 16, 16)[-1] == ("120-127,248-255", "7")


@pytest.mark.skipif(shutil.which("numactl") is None, reason="numactl is not installed: binding falls back")
@pytest.mark.parametrize("machine, instances, threads, index, line", [
    ("graviton3", 4, 16, 1, "numactl --physcpubind=16-31 --membind=0"),
    ("graviton4_metal", 2, 96, 1, "numactl --physcpubind=96-191 --membind=1"),
    ("altra_max_quadrant", 8, 16, 5, "numactl --physcpubind=80-95 --membind=2"),
    ("ampereone", 12, 16, 11, "numactl --physcpubind=176-191 --membind=0"),
    ("xeon", 2, 112, 0, "numactl --physcpubind=0-55,112-167 --membind=0"),
    ("epyc_nps4", 8, 8, 7, "numactl --physcpubind=56-63 --membind=3"),
    ("epyc_nps4", 1, 128, 0, "numactl --physcpubind=0-127 --membind=0-7"),
])
def test_numactl_lines(machine, instances, threads, index, line):
    topo = MACHINES[machine]
    cores = topo.disjoint_cpu_sets(instances, threads)[index]
    assert " ".join(plan(topo, cores, {}).prefix()) == line
    assert " ".join(plan(topo, cores, {"AIO_MEM_BIND": "0"}).prefix()) == line.rsplit(" ", 1)[0]


# --instances auto

@pytest.mark.parametrize("machine, layouts", [
    ("graviton3", [(1, 64), (2, 32), (4, 16), (8, 8), (16, 4), (32, 2), (64, 1)]),
    ("graviton4", [(1, 96), (2, 48), (4, 24), (8, 12), (16, 6), (32, 3)]),
    ("graviton4_metal", [(1, 192), (2, 96), (4, 48), (8, 24), (16, 12), (32, 6), (64, 3)]),
    ("altra_max", [(1, 128), (2, 64), (4, 32), (8, 16), (16, 8), (32, 4), (64, 2), (128, 1)]),
    ("altra_max_quadrant", [(1, 128), (2, 64), (4, 32), (8, 16), (16, 8), (32, 4), (64, 2), (128, 1)]),
    ("ampereone", [(1, 192), (2, 96), (4, 48), (8, 24), (16, 12), (32, 6), (64, 3)]),
    ("xeon", [(1, 112), (2, 56), (4, 28), (8, 14), (16, 7)]),
    ("epyc_nps4", [(1, 128), (2, 64), (4, 32), (8, 16), (16, 8), (32, 4), (64, 2), (128, 1)]),
])
def test_instances_auto_halves_the_machine(machine, layouts):
    topo = MACHINES[machine]
    assert topo.instance_layouts() == layouts
    for instances, threads in layouts:          # one thread per core, every core used, no node split
        sets = topo.disjoint_cpu_sets(instances, threads)
        assert sorted(c for s in sets for c in s) == sorted(topo.primary_cpus())
        for s in sets:
            nodes = topo.nodes_of(s)
            assert len(nodes) == 1 or set(s) == {c for c in topo.primary_cpus() if topo.nodes_of([c])[0] in nodes}


def test_instances_auto_leaves_out_layouts_across_nodes():
    # 3 nodes of 16 cores: 2 x 24 would split a node between two instances, 4 x 12 and 8 x 6 too
    three = from_lscpu(lscpu((c, c, 0, c // 16) for c in range(48)))
    assert three.instance_layouts() == [(1, 48), (3, 16), (6, 8), (12, 4), (24, 2), (48, 1)]
    # a 2-core machine like this one's: every layout, as before
    assert from_lscpu(lscpu((c, c, 0, 0) for c in range(2))).instance_layouts() == [(1, 2), (2, 1)]


# the /sys reader sees the same machines

def _sysfs_of(topo: Topology, root):
    """The canned /sys/devices/system of a machine: sysfs numbers cores within each socket."""
    first_core = {s: min(core for cpu, (sock, core) in topo.core_of.items() if sock == s) for s in topo.sockets}
    cores = {cpu: (sock, core - first_core[sock]) for cpu, (sock, core) in topo.core_of.items()}
    nodes = {node: format_cpu_list(cpus) for node, cpus in topo.node_cpus.items()}
    return make_sysfs(root, cores, nodes)


@pytest.mark.parametrize("machine", ["graviton4_metal", "altra_max_quadrant", "xeon", "epyc_nps4"])
def test_the_sysfs_reader_agrees(tmp_path, machine):
    topo = MACHINES[machine]
    sysfs = read_topology(topo.allowed_cpus, _sysfs_of(topo, tmp_path / "sys"), make_cgroup(tmp_path / "cg"))
    assert shape(sysfs) == shape(topo)
    assert sysfs.instance_layouts() == topo.instance_layouts()
    for instances, threads in [(8, 8), (2, topo.logical_cpus // 2), (4, topo.physical_cores // 4)]:
        assert sysfs.disjoint_cpu_sets(instances, threads) == topo.disjoint_cpu_sets(instances, threads)
