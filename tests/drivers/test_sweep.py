"""Sweeps through real processes, real numactl and real faults: a point that hangs, one that kills
itself, a driver killed mid-sweep and then resumed, Ctrl-C. Nothing finished may be lost or repeated."""

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest
from conftest import ROOT, SMALL_SWEEP, run_cli

from aio_examples.core.errors import UsageError
from aio_examples.drivers.sweep import SweepConfig
from aio_examples.machine import allocators
from aio_examples.machine.binding import Binding, plan, probe
from aio_examples.machine.topology import from_lscpu, read_topology

needs_numactl = pytest.mark.skipif(shutil.which("numactl") is None, reason="numactl is not installed")
SMALL = ["squeezenet", "--input-size", "32", "--timeout", "0.5", "--point-timeout", "120", "--quiet"]

# Each child looks at its own command line: the one matching FAULT_MATCH does FAULT (test-only, never shipped).
FAULTS = """\
import os, signal, time
_match = os.environ.get("FAULT_MATCH")
if _match:
    _argv = open("/proc/self/cmdline", "rb").read().split(b"\\0")
    if b"run" in _argv and all(m.encode() in _argv for m in _match.split()):
        if os.environ["FAULT"] == "hang":
            time.sleep(3600)
        os.kill(os.getpid(), signal.SIGKILL)
"""


def records(out: Path) -> list[dict]:
    return [json.loads(line) for line in (out / "results.jsonl").read_text().splitlines()]


def sweep(out, *extra, env=None, timeout=600):
    return run_cli(["-m", "aio_examples", "sweep", *SMALL, "--output", str(out), *extra], env=env, timeout=timeout)


def fault_env(tmp_path, match: str, kind: str) -> dict:
    folder = tmp_path / "faults"
    folder.mkdir(exist_ok=True)
    (folder / "sitecustomize.py").write_text(FAULTS)
    # AIO_FORKSERVER=0: the fault reads its process's command line as the interpreter starts, which a fork from
    # the server (started once, with its own command line) does not do
    return {"PYTHONPATH": f"{folder}:{os.environ.get('PYTHONPATH', '')}", "FAULT_MATCH": match, "FAULT": kind,
            "AIO_FORKSERVER": "0"}


@needs_numactl
def test_a_small_sweep_binds_each_point_to_its_cores_and_resumes_without_duplicates(small_sweep):
    out, proc = small_sweep
    first = records(out)
    assert len(first) == 4 and len({r["point_id"] for r in first}) == 4
    assert {(r["backend"], r["threads"]) for r in first} == {(b, t) for b in ("eager", "torchscript") for t in (1, 2)}
    topo = read_topology()
    for r in first:
        assert r["status"] == "ok", r["reason"]
        b = r["binding"]
        assert b["method"] == "numactl" and b["cores"] == list(topo.pick_cpus(r["threads"]))
        assert b["affinity"] == b["cores"] and b["threads_in_effect"] == r["threads"]
        assert b["membind"] == list(topo.nodes_of(b["cores"]))
        env_vars = r["env"]["env_vars"]
        assert env_vars["OMP_NUM_THREADS"] == env_vars["AIO_NUM_THREADS"] == str(r["threads"])
        assert env_vars["AIO_NUMA_CPUS"] == " ".join(map(str, b["cores"])) and env_vars["OPENBLAS_NUM_THREADS"] == "1"
    assert "4 point(s) run (4 ok)" in proc.stdout and "preparing" in proc.stdout
    again = run_cli(["-m", "aio_examples", "sweep", *SMALL_SWEEP, "--output", str(out)])
    assert again.returncode == 0 and "0 point(s) run" in again.stdout and "4 already done" in again.stdout
    assert records(out) == first


@pytest.mark.slow      # several sweeps of their own: the second tier
def test_a_hanging_point_and_a_point_that_kills_itself_get_records_and_the_sweep_goes_on(tmp_path):
    out = tmp_path / "sweep"
    hang = sweep(out, "--backends", "torchscript,eager", "--threads", "1", "--point-timeout", "20",
                 env=fault_env(tmp_path, "torchscript", "hang"))
    assert hang.returncode == 0, hang.stderr[-2000:]
    killed = sweep(out, "--backends", "inductor", "--threads", "1", env=fault_env(tmp_path, "inductor", "kill"))
    assert killed.returncode == 0, killed.stderr[-2000:]
    by_backend = {r["backend"]: r for r in records(out)}
    assert by_backend["torchscript"]["status"] == "timeout" and "timed out after 20 s" in by_backend["torchscript"][
        "reason"]
    assert by_backend["inductor"]["status"] == "crashed" and "SIGKILL" in by_backend["inductor"]["reason"]
    assert by_backend["eager"]["status"] == "ok"        # the point after the hang still ran
    assert all(r["point_id"] for r in by_backend.values())


@pytest.mark.slow      # several sweeps of their own: the second tier
def test_a_driver_killed_mid_sweep_loses_nothing_and_the_rerun_finishes_without_duplicates(tmp_path):
    out = tmp_path / "sweep"
    args = [sys.executable, "-m", "aio_examples", "sweep", *SMALL, "--output", str(out), "--backends",
            "eager,torchscript,inductor", "--threads", "1"]
    driver = subprocess.Popen(args, cwd=ROOT, start_new_session=True, stdout=subprocess.DEVNULL,
                              stderr=subprocess.DEVNULL)
    path = out / "results.jsonl"
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline and not (path.exists() and path.read_text().count("\n") >= 1):
        time.sleep(0.2)
    driver.kill()                       # SIGKILL to the driver alone: its current point must die with it
    driver.wait()
    time.sleep(1)
    orphans = [p for p in psutil.process_iter(["cmdline"]) if str(out) in " ".join(p.info["cmdline"] or [])]
    assert not orphans, [p.info["cmdline"] for p in orphans]
    before = records(out)               # every line is a whole record
    assert 1 <= len(before) < 3
    rerun = sweep(out, "--backends", "eager,torchscript,inductor", "--threads", "1")
    assert rerun.returncode == 0, rerun.stderr[-2000:]
    after = records(out)
    ids = [r["point_id"] for r in after]
    assert len(ids) == len(set(ids)) == 3 and after[:len(before)] == before


# The slow tier: a sweep interrupted as a whole command; run.py's Ctrl-C test stays in the default tier
@pytest.mark.slow
def test_ctrl_c_stops_cleanly_saying_what_is_done(tmp_path):
    out = tmp_path / "sweep"
    args = [sys.executable, "-m", "aio_examples", "sweep", *SMALL, "--output", str(out), "--backends",
            "eager,torchscript", "--threads", "1"]
    driver = subprocess.Popen(args, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    path = out / "results.jsonl"
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline and not path.exists():
        time.sleep(0.2)
    driver.send_signal(signal.SIGINT)
    stdout, stderr = driver.communicate(timeout=120)
    assert driver.returncode == 130, stderr
    assert "sweep interrupted" in stdout and "rerun the same command to resume" in stdout
    assert len(records(out)) == 1          # the point in progress was stopped, not half-written


@pytest.mark.slow      # several sweeps of their own: the second tier
def test_openvino_under_a_preloaded_allocator_is_unsupported_with_why(tmp_path):
    if allocators.library("tcmalloc") is None:
        pytest.skip("tcmalloc is not installed")
    out = tmp_path / "sweep"
    proc = sweep(out, "--backends", "openvino,eager", "--threads", "1", "--allocators", "tcmalloc,hugetlb")
    assert proc.returncode == 0, proc.stderr[-2000:]
    got = {(r["backend"], r["env"]["allocator"]): r for r in records(out)}
    assert set(got) == {(b, a) for b in ("openvino", "eager") for a in ("tcmalloc", "hugetlb")}
    refused = got[("openvino", "tcmalloc")]
    assert refused["status"] == "unsupported" and "LD_PRELOADed tcmalloc" in refused["reason"]
    assert got[("eager", "tcmalloc")]["status"] == "ok"
    assert "libtcmalloc" in got[("eager", "tcmalloc")]["env"]["env_vars"]["LD_PRELOAD"]
    assert got[("openvino", "hugetlb")]["status"] == "ok"
    assert "glibc.malloc.hugetlb=1" in got[("openvino", "hugetlb")]["env"]["env_vars"]["GLIBC_TUNABLES"]


@pytest.mark.slow       # a long end-to-end run: the second tier keeps the default one under 15 minutes
@needs_numactl
def test_two_instances_on_disjoint_cores_sum_their_throughput(tmp_path):
    proc = run_cli(["-m", "aio_examples", "throughput", "squeezenet", "--instances", "2", "--threads-per-instance",
                    "1", "-b", "2", "--backend", "eager", "--input-size", "32", "--timeout", "2",
                    "--output", str(tmp_path)])
    assert proc.returncode == 0, proc.stderr[-2000:]
    rs = records(tmp_path)
    instances = sorted(rs[:-1], key=lambda r: r["instance"]["index"])     # written as each one finishes
    agg = rs[-1]
    assert [r["instance"]["index"] for r in instances] == [0, 1] and agg["instance"]["aggregate"]
    cores = [set(r["binding"]["cores"]) for r in instances]
    assert not cores[0] & cores[1] and all(r["binding"]["affinity"] == sorted(c) for r, c in zip(instances, cores))
    assert agg["instances"] == 2 and agg["threads"] == 1 and agg["status"] == "ok"
    per = [e["throughput"] for e in agg["instance"]["layout"]]
    assert agg["throughput"]["value"] == pytest.approx(sum(per)) and min(per) > 0
    busy = [e["contention"] for e in agg["instance"]["layout"]]
    assert agg["contention"]["busy_elsewhere_cores"] == pytest.approx(sum(busy), abs=0.011)
    assert agg["throughput"]["value"] > max(r["throughput"]["value"] for r in instances) * 1.2
    assert f"{agg['throughput']['value']:.2f}" in proc.stdout


def test_aggregate_sums_the_work_of_the_window_all_instances_ran():
    from aio_examples.drivers.instances import aggregate

    ms = 1_000_000
    fast = {"window_start_ns": 0, "pass_ends_ns": [i * 10 * ms for i in range(1, 102)], "task_size": 1}   # to 1010 ms
    slow = {"window_start_ns": 0, "pass_ends_ns": [i * 50 * ms for i in range(1, 22)], "task_size": 4}    # to 1050 ms
    agg = aggregate([fast, slow])
    assert agg["window_s"] == pytest.approx(1.01)            # the window ends when the first instance stops
    assert agg["per_instance"][0] == pytest.approx(101 / 1.01) and agg["per_instance"][1] == pytest.approx(80 / 1.01)
    assert agg["throughput"] == pytest.approx(181 / 1.01)    # a sum, not an average


def test_binding_switches_and_fallbacks(monkeypatch):
    topo = from_lscpu("# CPU,Core,Socket,Node\n0,0,0,0\n1,1,0,0\n")
    assert plan(topo, (0,), {"AIO_CPU_BIND": "0"}).method == "none"
    if shutil.which("numactl"):
        assert plan(topo, (1,), {}).prefix() == ["numactl", "--physcpubind=1", "--membind=0"]
        assert plan(topo, (1,), {"AIO_MEM_BIND": "0"}).prefix() == ["numactl", "--physcpubind=1"]
    with pytest.raises(UsageError, match="AIO_MEM_BIND='2'"):
        plan(topo, (0,), {"AIO_MEM_BIND": "2"})


@needs_numactl
def test_a_refused_memory_binding_falls_back_to_cores_only_with_a_warning():
    refused = probe(Binding("numactl", (0,), (7,)))           # no NUMA node 7 here: numactl refuses, for real
    assert refused.method == "numactl" and refused.membind is None
    assert "memory binding refused" in refused.warnings[0]
    outside = probe(Binding("numactl", (999,), None))
    assert outside.method == "none" and len(outside.warnings) == 2


def test_sweep_config_files_validate_and_bad_keys_are_named(tmp_path):
    cfg = SweepConfig.from_toml(ROOT / "sweeps" / "quick.toml")
    assert cfg.models and cfg.backends
    bad = tmp_path / "bad.toml"
    bad.write_text('models = ["resnet_18"]\nthreds = [1]\n')
    with pytest.raises(UsageError, match="unknown key 'threds'"):
        SweepConfig.from_toml(bad)
    bad.write_text('models = ["resnet_18"]\nbatch_sizes = [0]\n')
    with pytest.raises(UsageError, match="batch_sizes value 0"):
        SweepConfig.from_toml(bad)
    bad.write_text('models = ["resnet_18"]\nprobe = "yes"\n')
    with pytest.raises(UsageError, match="probe 'yes' is invalid; accepted: true or false"):
        SweepConfig.from_toml(bad)
    bad.write_text('models = ["resnet_18"]\ninterleave = 0\n')
    with pytest.raises(UsageError, match="interleave 0 is invalid; accepted: a whole number from 1 to 64"):
        SweepConfig.from_toml(bad)
    nightly = SweepConfig.from_toml(ROOT / "sweeps" / "nightly.toml")
    assert nightly.probe and nightly.interleave > 1
    over = SweepConfig.from_toml(ROOT / "sweeps" / "quick.toml", {"threads": [1], "output": str(tmp_path)})
    assert over.threads == [1] and over.output == str(tmp_path)


def test_an_instance_that_dies_before_the_start_gives_a_failed_aggregate_with_the_reason(tmp_path):
    proc = run_cli(["-m", "aio_examples", "throughput", "squeezenet", "--instances", "2", "--threads-per-instance",
                    "1", "--backend", "eager", "--input-size", "32", "--timeout", "1", "--output", str(tmp_path)],
                   env=fault_env(tmp_path, "1/2", "kill"))             # instance 1 of 2 kills itself
    assert proc.returncode == 1, proc.stderr[-2000:]
    agg = records(tmp_path)[-1]
    assert agg["status"] == "failed" and agg["instance"]["aggregate"]
    assert "instance 1 ended before the start: killed by SIGKILL" in agg["reason"]


def test_repeats_are_rounds_of_their_own_points():
    one = SweepConfig(["resnet_18"], backends=["eager"], threads=[1, 2])
    two = SweepConfig(["resnet_18"], backends=["eager"], threads=[1, 2], repeats=2)
    first, again = one.points([1]), two.points([1])
    assert [p.point_id for p in again[:2]] == [p.point_id for p in first]     # round 1 keeps its ids
    assert [p.repeat for p in again] == [0, 0, 1, 1] and len({p.point_id for p in again}) == 4
    assert again[2].label.endswith("(repeat 2)")
    for bad in (0, -1, 1.5, True):
        with pytest.raises(UsageError, match="repeats"):
            SweepConfig(["resnet_18"], repeats=bad)


def turn_starts(record: dict) -> list[float]:
    return [started for _, started in record["turns"]]


@pytest.mark.slow       # the default tier stays under 15 minutes
def test_points_taking_turns_interleave_their_rounds_and_one_that_dies_does_not_stop_the_others(tmp_path):
    """interleave = 3: the points' processes are alive together and measure in turns, so each point's turns
    fall between the others'; each turn is followed by the machine's readings (--probe); a point killed
    before it was ready gets its record, the others go on, and a rerun resumes like any sweep."""
    out = tmp_path / "sweep"
    args = ["--backends", "eager,torchscript,onnxruntime", "--threads", "1", "--timeout", "3", "--interleave", "3",
            "--probe"]
    proc = sweep(out, *args, env=fault_env(tmp_path, "torchscript", "kill"))
    assert proc.returncode == 0, proc.stderr[-2000:]
    by_backend = {r["backend"]: r for r in records(out)}
    assert by_backend["torchscript"]["status"] == "crashed" and "SIGKILL" in by_backend["torchscript"]["reason"]
    eager, onnx = by_backend["eager"], by_backend["onnxruntime"]
    for r in (eager, onnx):
        assert r["status"] == "ok" and r["stop_reason"] == "turns" and len(r["turns"]) == 3, r
        assert sum(n for n, _ in r["turns"]) == len(r["samples_ms"])
        rounds = r["probe"]["rounds"]        # [passes, hand-over probe ms, machine reference ms] per turn
        assert [n for n, _, _ in rounds] == [n for n, _ in r["turns"]]
        assert all(probe > 0 and reference > 0 for _, probe, reference in rounds)
        assert "numpy" in r["probe"]["reference"]
    assert min(turn_starts(eager)) < max(turn_starts(onnx)) and min(turn_starts(onnx)) < max(turn_starts(eager))
    again = sweep(out, *args)
    assert again.returncode == 0 and "0 point(s) run" in again.stdout and "3 already done" in again.stdout


@pytest.mark.slow       # a long end-to-end run: the second tier keeps the default one under 15 minutes
def test_a_group_taking_turns_stops_growing_when_memory_is_short(tmp_path, monkeypatch):
    """With no memory to spare for another process, each point runs alone: its turns are all its own."""
    from aio_examples.drivers import sweep as sweep_mod

    monkeypatch.setattr(sweep_mod, "MEMORY_MARGIN", 1 << 60)
    cfg = SweepConfig(["squeezenet"], backends=["eager", "onnxruntime"], threads=[1], shape={"input_size": 32},
                      timeout=2, point_timeout=120, interleave=2, output=str(tmp_path / "sweep"))
    summary = sweep_mod.run_sweep(cfg, quiet=True)
    assert summary.statuses == {"ok": 2}
    first, second = records(tmp_path / "sweep")
    assert max(turn_starts(first)) < min(turn_starts(second))


@pytest.mark.slow      # a sweep of its own stopped midway: the second tier
def test_ctrl_c_while_points_take_turns_keeps_what_each_measured(tmp_path):
    out = tmp_path / "sweep"
    args = [sys.executable, "-m", "aio_examples", "sweep", *SMALL, "--output", str(out), "--backends",
            "eager,onnxruntime", "--threads", "1", "--timeout", "600", "--interleave", "2"]
    driver = subprocess.Popen(args, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline and len(psutil.Process(driver.pid).children(recursive=True)) < 2:
        time.sleep(0.5)
    time.sleep(20)                         # both prepared and warmed up, taking turns
    driver.send_signal(signal.SIGINT)
    stdout, stderr = driver.communicate(timeout=300)
    assert driver.returncode == 130, stderr
    assert "sweep interrupted" in stdout
    kept = records(out)
    assert [r["status"] for r in kept] == ["ok", "ok"], kept
    assert all(1 <= len(r["turns"]) < 600 and r["samples_ms"] for r in kept)
    # Cut short, and said so: a resumed sweep measures both again instead of taking them as done.
    assert all(r["stop_reason"] == "interrupted" and any("interrupted after" in w for w in r["warnings"])
               for r in kept)
    args[args.index("600")] = "2"
    again = subprocess.run(args, cwd=ROOT, capture_output=True, text=True, timeout=600, check=False)
    assert again.returncode == 0, again.stderr[-2000:]
    assert "2 point(s) run (2 ok), 0 already done, of 2" in again.stdout
    assert [r["stop_reason"] for r in records(out)] == ["interrupted", "interrupted", "turns", "turns"]


def test_a_point_is_identified_by_its_configuration_key_and_outputs_of_release_0_1_still_resume(tmp_path):
    from aio_examples.drivers.sweep import Point, run_sweep
    from aio_examples.drivers.worker import record_failure
    from aio_examples.models import get_model

    default, explicit = Point("squeezenet", "eager", "fp32", 1, 1), Point("squeezenet", "eager", "fp32", 1, 1,
                                                                         shape=(("input_size", 224),))
    assert default.key == explicit.key and default.point_id == explicit.point_id      # the same configuration
    assert default.key.shape == "input_size=224" and default.key.task == "image-classification"
    assert Point("squeezenet", "eager", "fp32", 1, 1, repeat=1).point_id != default.point_id
    cfg = SweepConfig(models=["squeezenet"], backends=["eager", "torchscript"], threads=[1], output=str(tmp_path))
    spec = get_model("squeezenet")
    for point in cfg.points([1]):           # records written by release 0.1, under its ids
        record_failure(tmp_path, spec, point.backend, point.precision, 1, 1, spec.shape(), "failed", "old",
                       point_id=point.legacy_point_id)
    summary = run_sweep(cfg, quiet=True)
    assert (summary.total, summary.skipped, summary.statuses) == (2, 2, {})


@pytest.mark.slow       # a long end-to-end run: the second tier keeps the default one under 15 minutes
def test_a_second_sweep_into_a_folder_a_sweep_is_writing_to_is_refused_naming_the_holder(tmp_path):
    out = tmp_path / "sweep"
    first = subprocess.Popen([sys.executable, "-m", "aio_examples", "sweep", *SMALL, "--output", str(out),
                              "--backends", "eager", "--threads", "1", "--timeout", "120"], cwd=ROOT,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and not psutil.Process(first.pid).children(recursive=True):
            time.sleep(0.2)
        second = run_cli(["-m", "aio_examples", "sweep", *SMALL, "--output", str(out), "--backends", "eager",
                          "--threads", "1"])
        assert second.returncode == 2, second.stderr[-1500:]
        [line] = second.stderr.strip().splitlines()
        assert f"is in use by a sweep of squeezenet (pid {first.pid} on" in line
        matrix = run_cli(["-m", "aio_examples", "matrix", "--models", "squeezenet", "--backends", "eager",
                          "--precisions", "fp32", "--output", str(out)])
        assert matrix.returncode == 2 and "is in use by a sweep" in matrix.stderr
    finally:
        first.send_signal(signal.SIGINT)
        first.communicate(timeout=120)
    assert not (out / "results.jsonl").exists() or len(records(out)) <= 1      # nobody measured it twice
    again = run_cli(["-m", "aio_examples", "sweep", *SMALL, "--output", str(out), "--backends", "eager",
                     "--threads", "1", "--timeout", "0.5"])
    assert again.returncode == 0, again.stderr[-1500:]                       # the lock ended with its holder


def test_render_only_on_a_folder_without_records_refuses_instead_of_writing_dashes(tmp_path):
    from aio_examples.drivers.matrix import README_END, README_START

    readme = tmp_path / "backends.md"
    readme.write_text(f"{README_START}\nthe matrix\n{README_END}\n")
    proc = run_cli(["-m", "aio_examples", "matrix", "--render-only", "--output", str(tmp_path / "typo"),
                    "--readme", str(readme)])
    assert proc.returncode == 2 and "holds no matrix records to render" in proc.stderr
    assert "the matrix" in readme.read_text() and not (tmp_path / "typo").exists()


@pytest.mark.slow       # a long end-to-end run: the second tier keeps the default one under 15 minutes
def test_sigterm_stops_a_sweep_like_ctrl_c_and_the_rerun_resumes(tmp_path):
    out = tmp_path / "sweep"
    args = [sys.executable, "-m", "aio_examples", "sweep", *SMALL, "--output", str(out), "--backends",
            "eager,torchscript", "--threads", "1"]
    driver = subprocess.Popen([*args, "--timeout", "3"], cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              text=True)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and not (out / "results.jsonl").exists():
        time.sleep(0.2)                     # the first point is written, the second is measuring
    driver.send_signal(signal.SIGTERM)
    stdout, stderr = driver.communicate(timeout=120)
    assert driver.returncode == 143, stderr[-1500:]
    assert "sweep interrupted" in stdout and "terminated (SIGTERM)" in stderr
    assert [r["backend"] for r in records(out)] == ["eager"]
    again = run_cli([*args[1:], "--timeout", "0.5"])
    assert again.returncode == 0 and "1 point(s) run (1 ok), 1 already done, of 2" in again.stdout, again.stderr
