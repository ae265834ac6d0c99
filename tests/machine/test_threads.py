from pathlib import Path

import pytest

from aio_examples.core.errors import UsageError
from aio_examples.machine.threads import resolve_threads
from aio_examples.machine.topology import Topology, parse_cpu_list, read_topology


def make_sysfs(root: Path, cpus: dict[int, tuple[int, int]], nodes=(0,)) -> Path:
    """A canned /sys/devices/system: cpu -> (package, core)."""
    for cpu, (pkg, core) in cpus.items():
        topo = root / "cpu" / f"cpu{cpu}" / "topology"
        topo.mkdir(parents=True)
        (topo / "physical_package_id").write_text(f"{pkg}\n")
        (topo / "core_id").write_text(f"{core}\n")
    for node in nodes:
        (root / "node" / f"node{node}").mkdir(parents=True)
    return root


def two_socket_smt(tmp_path) -> Topology:
    # 2 sockets x 4 cores x 2 SMT threads: cpu c and c+8 are siblings.
    cpus = {c: (c // 4 % 2, c % 4) for c in range(16)}
    return read_topology(tuple(range(16)), make_sysfs(tmp_path / "sys", cpus, nodes=(0, 1)), tmp_path / "cg")


def test_parse_cpu_list():
    assert parse_cpu_list("0-3,8,10-11") == (0, 1, 2, 3, 8, 10, 11)
    assert parse_cpu_list("5") == (5,)


def test_two_socket_smt_counts_physical_cores(tmp_path):
    topo = two_socket_smt(tmp_path)
    assert topo.physical_cores == 8
    assert topo.logical_cpus == 16
    assert topo.numa_nodes == (0, 1)


def test_affinity_restricted_to_siblings_counts_one_core(tmp_path):
    cpus = {c: (0, c % 4) for c in range(8)}
    topo = read_topology((1, 5), make_sysfs(tmp_path / "sys", cpus), tmp_path / "cg")
    assert topo.physical_cores == 1 and topo.logical_cpus == 2


@pytest.mark.parametrize("cpu_max, cores", [("150000 100000", 1), ("200000 100000", 2), ("max 100000", 4)])
def test_cgroup_quota_caps_cores(tmp_path, cpu_max, cores):
    cg = tmp_path / "cg"
    cg.mkdir()
    (cg / "cpu.max").write_text(cpu_max + "\n")
    topo = read_topology((0, 1, 2, 3), make_sysfs(tmp_path / "sys", {c: (0, c) for c in range(4)}), cg)
    assert topo.physical_cores == cores


def test_this_machine_is_readable():
    topo = read_topology()
    assert 1 <= topo.physical_cores <= topo.logical_cpus


def small(cores=4) -> Topology:
    return Topology(tuple(range(cores)), {c: (0, c) for c in range(cores)}, (0,), None)


@pytest.mark.parametrize("cli, env, expected, source", [
    (None, {}, 4, "physical cores"),
    ("2", {"AIO_NUM_THREADS": "3"}, 2, "--threads"),
    (None, {"AIO_NUM_THREADS": "3"}, 3, "AIO_NUM_THREADS"),
    (None, {"OMP_NUM_THREADS": "1"}, 1, "OMP_NUM_THREADS"),
    (None, {"AIO_NUM_THREADS": "2", "OMP_NUM_THREADS": "2"}, 2, "AIO_NUM_THREADS"),
    ("1", {"AIO_NUM_THREADS": "2", "OMP_NUM_THREADS": "3"}, 1, "--threads"),
])
def test_thread_precedence(cli, env, expected, source):
    choice = resolve_threads(cli, env, small())
    assert (choice.threads, choice.source) == (expected, source)


@pytest.mark.parametrize("cli, env, words", [
    (None, {"AIO_NUM_THREADS": "abc"}, "AIO_NUM_THREADS='abc'"),
    (None, {"AIO_NUM_THREADS": "0"}, "AIO_NUM_THREADS='0'"),
    (None, {"OMP_NUM_THREADS": "-2"}, "OMP_NUM_THREADS='-2'"),
    ("0", {}, "--threads='0'"),
    (None, {"AIO_NUM_THREADS": "2", "OMP_NUM_THREADS": "3"}, "contradicts"),
    ("9", {}, "more than the 4 CPUs"),
])
def test_invalid_threads_are_one_line_usage_errors(cli, env, words):
    with pytest.raises(UsageError) as err:
        resolve_threads(cli, env, small())
    assert words in str(err.value) and "\n" not in str(err.value)


def test_oversubscription_needs_the_flag():
    assert resolve_threads("9", {}, small(), allow_oversubscribe=True).threads == 9
