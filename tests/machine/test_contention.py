"""Contention: what other processes take of a run's cores is measured and recorded, and warned of above a
threshold. Real runs pinned to one CPU, with and without a busy loop pinned beside them."""

import json
import os
import subprocess
import sys

import pandas as pd
import pytest
from conftest import run_cli

from aio_examples.machine import contention
from aio_examples.machine.contention import CONTENDED_CORES, Snapshot

CPU = min(os.sched_getaffinity(0))      # CPU 0 unless this test itself is kept off it
# Pins itself to that CPU and spins there; ends by itself should the test never get to kill it.
BUSY_LOOP = (f"import os, time\nos.sched_setaffinity(0, {{{CPU}}})\nend = time.monotonic() + 300\n"
             "while time.monotonic() < end: pass")


def _run_pinned(tmp_path, name, backends="eager"):
    out = tmp_path / name
    proc = run_cli(["-m", "aio_examples", "run", "resnet_18", "--backend", backends, "-t", "1", "--input-size", "64",
                    "--timeout", "3", "--json", "--output", str(out)], cpus={CPU})
    assert proc.returncode == 0, proc.stderr[-2000:]
    records = [json.loads(line) for line in (out / "results.jsonl").read_text().splitlines()]
    assert [r["status"] for r in records] == ["ok"] * len(records), [r["reason"] for r in records]
    return records[0], proc.stderr


def _contention_warnings(record):
    return [w for w in record["warnings"] if "other processes kept" in w]


@pytest.mark.slow       # the default tier stays under 15 minutes
def test_a_busy_loop_on_the_runs_core_is_measured_and_warned_of_and_a_quiet_run_reads_less(tmp_path):
    quiet, _ = _run_pinned(tmp_path, "quiet")
    loop = subprocess.Popen([sys.executable, "-c", BUSY_LOOP])
    try:
        busy, stderr = _run_pinned(tmp_path, "busy", backends="eager,torchscript")
    finally:
        loop.kill()
        loop.wait()
    figure = busy["contention"]["busy_elsewhere_cores"]
    assert busy["contention"]["threshold_cores"] == CONTENDED_CORES
    assert figure > CONTENDED_CORES
    [warning] = _contention_warnings(busy)
    assert f"{figure:.2f}" in warning and "not representative" in warning
    assert warning in stderr
    # The machine is shared: other work may land on that CPU during the quiet run too, so only relate the two.
    assert quiet["contention"]["busy_elsewhere_cores"] < figure
    if quiet["contention"]["busy_elsewhere_cores"] <= CONTENDED_CORES:
        assert not _contention_warnings(quiet)
    # The report marks the contended configurations and leaves them out of the suite view unless asked.
    report = run_cli(["-m", "aio_examples", "report", str(tmp_path / "busy"), "--output", str(tmp_path / "report")])
    assert report.returncode == 0, report.stderr[-2000:]
    summary = pd.read_csv(tmp_path / "report" / "summary.csv")
    assert list(summary.contended) == [True, True] and (summary.contention > CONTENDED_CORES).all()
    page = (tmp_path / "report" / "report.html").read_text()
    assert "measured while other processes held its cores" in page
    kept = run_cli(["-m", "aio_examples", "report", str(tmp_path / "busy"), "--output", str(tmp_path / "kept"),
                    "--include-contended"])
    assert kept.returncode == 0, kept.stderr[-2000:]
    assert "torchscript fp32" in (tmp_path / "kept" / "report.html").read_text().split("id='models'")[0]


def test_busy_elsewhere_is_busy_time_of_our_cores_minus_our_own_per_wall_second():
    assert contention.busy_elsewhere(Snapshot(100.0, 10.0, 0.0), Snapshot(104.0, 12.0, 2.0)) == 1.0
    assert contention.busy_elsewhere(Snapshot(100.0, 10.0, 0.0), Snapshot(101.0, 11.0, 2.0)) == 0.0
    assert contention.busy_elsewhere(Snapshot(100.0, 10.0, 0.0), Snapshot(100.5, 11.0, 2.0)) == 0.0  # ticks
    assert contention.busy_elsewhere(Snapshot(100.0, 10.0, 5.0), Snapshot(100.0, 10.0, 5.0)) == 0.0


def test_a_snapshot_counts_only_the_cores_asked_for():
    one, every = contention.snapshot({CPU}), contention.snapshot()
    assert 0 < one.busy_s <= every.busy_s and one.own_s > 0


def test_load_on_the_spare_cores_of_a_runs_affinity_set_leaves_it_alone():
    from types import SimpleNamespace

    from aio_examples.core.records import Result
    from aio_examples.measurement.runner import _contention

    def judged(threads, busy):
        r = Result(model="m", task="t", backend="eager", precision="fp32", batch_size=1, threads=threads,
                   input_shape={}, binding={"affinity": [0, 1]})
        _contention(SimpleNamespace(contention=busy), r)
        return r.contention, r.warnings

    one_thread, warnings = judged(1, 0.9)           # one busy process on the other core of two
    assert one_thread == {"busy_elsewhere_cores": 0.9, "spare_cores": 1, "threshold_cores": 1 + CONTENDED_CORES,
                          "contended": False} and warnings == []
    two_threads, warnings = judged(2, 0.9)
    assert two_threads["contended"] and two_threads["spare_cores"] == 0 and "0.90 of this run's cores" in warnings[0]
    assert judged(1, 1.5)[0]["contended"] and "(1 spare)" in judged(1, 1.5)[1][0]
