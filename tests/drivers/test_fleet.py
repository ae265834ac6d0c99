"""Sweeps across a real Ray cluster on this machine: a head node with both CPUs and two nodes restricted to one
CPU (another machine kind, with another fingerprint), spread over, a node killed mid-point, Ctrl-C, resumes."""

import collections
import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest
from conftest import ROOT, run_cli

from aio_examples.core.errors import UsageError
from aio_examples.drivers import fleet
from aio_examples.drivers.fleet import NodeSelector, _check_environments, _share_of, check_address
from aio_examples.machine.environment import capture
from aio_examples.machine.topology import read_topology

SWEEP = ["-m", "aio_examples", "sweep", "resnet_18", "--input-size", "32", "--backends", "eager",
         "--timeout", "1", "--point-timeout", "300"]


def records(out: Path) -> list[dict]:
    return [json.loads(line) for line in (out / "results.jsonl").read_text().splitlines()]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# --- without a cluster (default tier) ---------------------------------------------------------------------------

def test_an_address_where_no_cluster_answers_fails_in_one_line_within_seconds(tmp_path):
    port = free_port()
    start = time.monotonic()
    proc = run_cli([*SWEEP, "--threads", "1", "--cluster", f"ray://127.0.0.1:{port}", "--output", str(tmp_path / "o")])
    assert proc.returncode == 2
    assert proc.stderr.strip().count("\n") == 0 and f"127.0.0.1:{port}" in proc.stderr and "no Ray cluster" in proc.stderr
    assert time.monotonic() - start < 60          # the process start and imports; the check itself takes seconds
    assert not (tmp_path / "o" / "results.jsonl").exists()
    with pytest.raises(UsageError, match="accepted"):
        check_address("no-port-here")


def test_cluster_flags_without_a_cluster_are_refused(tmp_path):
    proc = run_cli([*SWEEP, "--threads", "1", "--nodes", "machine=c7g", "--output", str(tmp_path / "o")])
    assert proc.returncode == 2 and "--cluster" in proc.stderr


def test_node_selectors_match_labels_or_custom_resources():
    node = {"Labels": {"machine": "c7g", "ray.io/node-id": "x"}, "Resources": {"CPU": 4.0, "graviton": 1.0}}
    assert NodeSelector.parse("machine=c7g").matches(node)
    assert NodeSelector.parse("machine=m7i,graviton").matches(node)
    assert not NodeSelector.parse("machine=m7i").matches(node)
    assert not NodeSelector.parse("epyc").matches(node)
    assert NodeSelector.parse(None).matches(node)
    for bad in ("", "a==b", "=c7g", "machine=c7g,"):
        with pytest.raises(UsageError, match="--nodes"):
            NodeSelector.parse(bad)


def test_points_per_node_split_a_node_into_disjoint_whole_cores():
    topo = read_topology()
    cores = len({topo.core_of[c] for c in topo.allowed_cpus})
    shares = [_share_of(topo, i, cores) for i in range(cores)]
    assert all(shares) and sorted(c for s in shares for c in s) == sorted(topo.allowed_cpus)
    assert not _share_of(topo, cores, cores + 1)           # more sets than cores: the last one is empty


def test_a_node_with_other_library_versions_or_without_numactl_is_refused():
    env = capture()
    node = {"node_id": "abc", "address": "10.0.0.2", "cpus": [0], "numactl": "/usr/bin/numactl", "env": env}

    class Runner:
        facts = node

    _check_environments([Runner])                           # the same as the driver: accepted
    Runner.facts = {**node, "env": {**env, "versions": {**env["versions"], "torch": "2.0.0"}}}
    with pytest.raises(UsageError, match=r"10\.0\.0\.2 .*torch 2\.0\.0 where the driver has"):
        _check_environments([Runner])
    Runner.facts = {**node, "numactl": None}
    with pytest.raises(UsageError, match="lacks numactl"):
        _check_environments([Runner])


class _SessionsFailing:
    """Ray's `init` and `shutdown` as a client meets a cluster whose server fails to start the first `fails`
    sessions (its reason at the end of the server's traceback)."""

    def __init__(self, fails: int):
        self.fails, self.inits, self.shutdowns = fails, 0, 0

    def init(self, **_):
        self.inits += 1
        if self.inits <= self.fails:
            raise ConnectionAbortedError("Initialization failure from server:\nTraceback (most recent call last):\n"
                                         "  File \"proxier.py\", line 770\nRuntimeError: Starting Ray client server "
                                         "failed.")

    def shutdown(self):
        self.shutdowns += 1


def test_a_session_the_cluster_fails_to_start_is_tried_again_then_refused_with_its_reason(monkeypatch):
    monkeypatch.setattr(fleet, "CONNECT_RETRY_PAUSES_S", (0.0, 0.0))
    ray = _SessionsFailing(2)
    fleet._connect(ray, "ray://10.0.0.9:10001")
    assert (ray.inits, ray.shutdowns) == (3, 2)
    ray = _SessionsFailing(3)
    with pytest.raises(UsageError) as refused:
        fleet._connect(ray, "ray://10.0.0.9:10001")
    assert ray.inits == 3
    assert str(refused.value) == ("--cluster 'ray://10.0.0.9:10001': Ray could not connect (Initialization failure "
                                  "from server: RuntimeError: Starting Ray client server failed.)")


# --- a real cluster (slow tier) ---------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def cluster():
    """A head with this machine's CPUs and two nodes started on one CPU (their processes inherit that affinity):
    two machine kinds, the second with two nodes."""
    from ray.cluster_utils import Cluster

    client_port = free_port()
    c = Cluster(initialize_head=True, head_node_args={"num_cpus": 2, "ray_client_server_port": client_port,
                                                      "include_dashboard": False, "labels": {"machine": "big"}})
    every = os.sched_getaffinity(0)
    os.sched_setaffinity(0, {max(every)})
    try:
        small = [c.add_node(num_cpus=1, labels={"machine": "small"}) for _ in range(2)]
    finally:
        os.sched_setaffinity(0, every)
    c.wait_for_nodes()
    yield c, small, f"ray://127.0.0.1:{client_port}"
    c.shutdown()


def _points_of(rows) -> collections.Counter:
    return collections.Counter((r["point_id"], r["env"].get("machine_cpus")) for r in rows)


def _node_runs(node) -> list[psutil.Process]:
    """The point processes under one Ray node: descendants of its raylet (its workers, their points)."""
    try:
        under = psutil.Process(node.all_processes["raylet"][0].process.pid).children(recursive=True)
    except psutil.Error:
        return []
    found = []
    for p in under:
        try:
            cmd = p.cmdline()
        except psutil.Error:
            continue
        if "aio_examples" in cmd and "run" in cmd:
            found.append(p)
    return found


@pytest.mark.slow
def test_a_fleet_sweep_runs_every_point_on_each_machine_kind_and_survives_a_lost_node(cluster, tmp_path):
    c, small, client = cluster
    out = tmp_path / "fleet"
    argv = [sys.executable, *SWEEP, "--threads", "1,2", "--batch-sizes", "1,2,3,4", "--cluster", client,
            "--output", str(out)]
    proc = subprocess.Popen(argv, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline, busy = time.monotonic() + 300, []
    while not busy and time.monotonic() < deadline and proc.poll() is None:
        busy = [n for n in small if _node_runs(n)]          # Ray picks which small node starts first
        time.sleep(0.2)
    if not busy:                        # say why: the sweep ended (how), or it ran on and no point started there
        ended = proc.poll() is not None
        proc.kill()                     # a no-op once it has ended; its output is read either way
        stdout, stderr = proc.communicate(timeout=60)
        pytest.fail(f"no small node ever ran a point; sweep {'ended rc=' + str(proc.returncode) if ended else 'ran on'}"
                    f"\nstdout: {stdout[-3000:]}\nstderr: {stderr[-3000:]}")
    lost, survivor = busy[0], next(n for n in small if n is not busy[0])
    c.remove_node(lost, allow_graceful=False)          # mid-point
    stdout, stderr = proc.communicate(timeout=900)
    assert proc.returncode == 0, stderr[-3000:]
    rows = records(out)
    kinds = {r["env"].get("machine_cpus") for r in rows}
    assert kinds == {1, 2} and len({(r["env"]["cpu_model"], r["env"].get("machine_cpus")) for r in rows}) == 2
    fingerprints = {c_: set() for c_ in kinds}
    from aio_examples.core.records import Result

    for r in rows:
        fingerprints[r["env"]["machine_cpus"]].add(Result.from_dict(r).machine)
    assert all(len(f) == 1 for f in fingerprints.values()) and fingerprints[1] != fingerprints[2]
    # every point once on each kind: 8 points (4 batches x 2 thread counts); t2 does not fit the 1-CPU kind
    counts = _points_of(rows)
    assert len(counts) == 16 and set(counts.values()) == {1}, counts
    small_rows = [r for r in rows if r["env"]["machine_cpus"] == 1]
    assert {r["status"] for r in small_rows if r["threads"] == 2} == {"unsupported"}
    assert {r["status"] for r in small_rows if r["threads"] == 1} == {"ok"}
    assert {r["status"] for r in rows if r["env"]["machine_cpus"] == 2} == {"ok"}
    assert "retried on another node" in stdout, stdout
    assert {r["env"]["node"]["labels"].get("machine") for r in small_rows} == {"small"}
    assert {r["env"].get("machine_type") for r in small_rows if r["status"] == "ok"} == {"small"}
    # spread over both small nodes: the lost one ran a point (seen above) and may have finished others before it
    # was killed; the survivor took the rest, the lost point among them
    ids = {n.node_id[:12] for n in small}
    assert survivor.node_id[:12] in {r["env"]["node"]["node_id"] for r in small_rows} <= ids
    # the rerun resumes: nothing left to run, nothing measured twice
    again = run_cli([*SWEEP, "--threads", "1,2", "--batch-sizes", "1,2,3,4", "--cluster", client, "--output", str(out),
                     "--quiet"], timeout=600)
    assert again.returncode == 0 and "0 point(s) run" in again.stdout and "16 already done" in again.stdout, again.stdout
    assert len(records(out)) == len(rows)

    # only the nodes of one kind; a label no node has
    sel = tmp_path / "small"
    only = run_cli([*SWEEP, "--threads", "1", "--cluster", client, "--nodes", "machine=small", "--output", str(sel)])
    assert only.returncode == 0, only.stderr[-2000:]
    assert {r["env"]["machine_cpus"] for r in records(sel)} == {1}
    bad = run_cli([*SWEEP, "--threads", "1", "--cluster", client, "--nodes", "machine=huge", "--output", str(sel)])
    assert bad.returncode == 2 and "machine=huge" in bad.stderr and "machine=small" in bad.stderr


@pytest.mark.slow
def test_ctrl_c_on_a_fleet_sweep_stops_its_points_and_the_rerun_completes(cluster, tmp_path):
    client = cluster[2]
    out = tmp_path / "fleet"
    argv = [sys.executable, *SWEEP, "--threads", "1", "--batch-sizes", "1,2,3,4,5,6", "--timeout", "3",
            "--cluster", client, "--output", str(out)]
    proc = subprocess.Popen(argv, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 300
    while not (out / "results.jsonl").exists() and time.monotonic() < deadline:
        time.sleep(0.2)
    time.sleep(1.0)
    proc.send_signal(signal.SIGINT)
    stdout, stderr = proc.communicate(timeout=120)
    assert proc.returncode != 0 and "interrupted" in stdout + stderr
    time.sleep(3)
    left = [p for p in psutil.process_iter(["cmdline"]) if "aio_examples" in (p.info["cmdline"] or [])
            and "aio-fleet-" in " ".join(p.info["cmdline"] or [])]
    assert not left, [p.info["cmdline"] for p in left]
    first = len(records(out))
    assert 0 < first < 12
    again = run_cli([*argv[1:-4], "--timeout", "1", "--cluster", client, "--output", str(out), "--quiet"], timeout=900)
    assert again.returncode == 0, again.stderr[-2000:]
    counts = _points_of(records(out))
    assert len(counts) == 12 and set(counts.values()) == {1}


def test_a_folder_of_several_machines_resumes_each_machine_by_its_own_records(tmp_path):
    from aio_examples.core import records as res
    from aio_examples.core.records import Result, machine_fingerprint
    from aio_examples.drivers.sweep import finished_points

    env = capture()
    other = {**env, "machine_cpus": 1, "logical_cpus": 2}
    mine, theirs = (Result("resnet_18", "image-classification", "eager", "fp32", 1, 1, {}, point_id=p, env=e)
                    for p, e in (("a", env), ("b", other)))
    lost = Result("resnet_18", "image-classification", "eager", "fp32", 1, 2, {}, point_id="c", env=env,
                  status="failed", stop_reason="node_lost")
    for r in (mine, theirs, lost):
        res.append(tmp_path, r)
    assert machine_fingerprint(env) != machine_fingerprint(other)
    assert finished_points(tmp_path, machine_fingerprint(env)) == {"a"}
    assert finished_points(tmp_path, machine_fingerprint(other)) == {"b"}
    assert finished_points(tmp_path) == {"a", "b"}


@pytest.mark.slow
def test_a_session_the_real_cluster_refused_leaves_the_client_able_to_connect_again(cluster):
    import ray

    with pytest.raises(ConnectionAbortedError) as refused:     # a package the cluster never had: refused server-side
        ray.init(address=cluster[2], runtime_env={"py_modules": ["gcs://_ray_pkg_0123456789abcdef.zip"]},
                 logging_level="ERROR")
    assert "Failed to download" in fleet._reason(refused.value)
    ray.shutdown()
    try:
        fleet._connect(ray, cluster[2])
        assert ray.is_initialized() and any(n["Alive"] for n in ray.nodes())   # (a node may have been killed)
    finally:
        ray.shutdown()


@pytest.mark.slow
def test_points_per_node_run_side_by_side_on_disjoint_cores(cluster, tmp_path):
    out = tmp_path / "shared"
    proc = run_cli([*SWEEP, "--threads", "1,2", "--batch-sizes", "1,2", "--timeout", "3", "--cluster", cluster[2],
                    "--nodes", "machine=big", "--points-per-node", "2", "--output", str(out)])
    assert proc.returncode == 0, proc.stderr[-2000:]
    rows = records(out)
    assert {r["env"]["machine_type"] for r in rows} == {"big"} and len(rows) == 4
    ok = [r for r in rows if r["status"] == "ok"]
    assert {r["threads"] for r in ok} == {1} and len(ok) == 2     # a share of one core cannot take 2 threads
    assert {r["status"] for r in rows if r["threads"] == 2} == {"unsupported"}
    assert {tuple(r["binding"]["cores"]) for r in ok} == {(0,), (1,)}      # one point on each core
    assert len({r["env"]["node"]["node_id"] for r in rows}) == 1


@pytest.mark.slow
def test_cluster_local_starts_a_cluster_on_this_machine(tmp_path):
    proc = run_cli([*SWEEP, "--threads", "1", "--cluster", "local", "--output", str(tmp_path / "o")])
    assert proc.returncode == 0, proc.stderr[-2000:]
    (row,) = records(tmp_path / "o")
    assert row["status"] == "ok" and row["env"]["node"]["node_id"]
