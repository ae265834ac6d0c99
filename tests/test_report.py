"""Reports: the summary arithmetic on fixed records, and a real report from a real small sweep."""

import math

import pandas as pd
import pytest
from conftest import run_cli

from aio_examples.core import records as res
from aio_examples.reporting.report import build_report, geomean_speedups, suite_frame, summary_frame


def record(model, backend, median, status="ok", precision="fp32", threads=2, flops=None, **extra):
    r = res.Result(model=model, task="image-classification", backend=backend, precision=precision, batch_size=1,
                   threads=threads, input_shape={"batch_size": 1}, status=status,
                   reason=None if status == "ok" else "why not",
                   latency_ms={"median": median, "p90": median * 1.1, "p99": median * 1.2} if status == "ok" else None,
                   throughput={"value": 1000 / median, "unit": "images/s"} if status == "ok" else None,
                   env={"hostname": "box", "allocator": "default"}, **extra)
    if flops:
        r.metrics = {"flops_per_pass": flops, "units_per_pass": 1}
    return r.to_dict()


FIXED = [
    record("a", "eager", 100.0), record("a", "aio", 25.0), record("a", "onnxruntime", 50.0),
    record("b", "eager", 30.0), record("b", "aio", 20.0), record("b", "onnxruntime", 60.0, status="failed"),
    record("c", "eager", 10.0), record("c", "aio", 2.0, status="fail_accuracy"),
]


def test_speedups_and_geomean_match_a_hand_computation():
    df = summary_frame(FIXED, peaks={})
    speed = {(r.model, r.backend): r.speedup_vs_eager_fp32 for r in df.itertuples()}
    assert speed[("a", "aio")] == pytest.approx(4.0) and speed[("b", "aio")] == pytest.approx(1.5)
    assert pd.isna(speed[("c", "aio")]) and pd.isna(speed[("b", "onnxruntime")])    # not ok: never a speedup
    geo = geomean_speedups(df)
    assert geo[("aio", "fp32")] == pytest.approx(math.sqrt(4.0 * 1.5))              # c's fail_accuracy left out
    assert geo[("onnxruntime", "fp32")] == pytest.approx(2.0)
    assert geo[("eager", "fp32")] == pytest.approx(1.0)
    table, setting = suite_frame(df)
    assert setting == {"batch_size": 1, "threads": 2, "machine": "box"}
    assert table.loc["geomean", ("aio", "fp32")] == pytest.approx(math.sqrt(6.0))


def test_percent_of_peak_uses_flops_per_unit_and_the_peak_at_the_same_precision_and_threads():
    df = summary_frame([record("a", "eager", 100.0, flops=4e9), record("a", "aio", 50.0, flops=4e9)],
                       peaks={"box": {"fp32": {"2": 200.0}}})
    row = df[df.backend == "aio"].iloc[0]
    assert row.achieved_gflops == pytest.approx(80.0)          # 4 GFLOP per image x 20 images/s
    assert row.peak_pct == pytest.approx(40.0)


def test_the_latest_record_of_a_configuration_wins():
    old = record("a", "eager", 100.0)
    new = record("a", "eager", 90.0)
    new["timestamp"] = "9999-01-01T00:00:00+00:00"
    df = summary_frame([new, old], peaks={})
    assert list(df.median_ms) == [90.0]


def test_a_report_from_a_real_sweep_has_every_section_and_embedded_plots(small_sweep, tmp_path):
    out_sweep, _ = small_sweep
    written = build_report([out_sweep], tmp_path / "report")
    page = written["html"].read_text()
    for section in ("id='environment'", "id='suite'", "id='models'", "id='not-ok'", "id='peak'"):
        assert section in page
    assert page.count("data:image/png;base64,") >= 2           # the suite view and latency vs threads
    assert (tmp_path / "report" / "plots" / "squeezenet-threads.png").stat().st_size > 1000
    csv = pd.read_csv(written["csv"])
    assert len(csv) == 4 and set(csv.status) == {"ok"}
    assert (csv[csv.backend == "eager"].speedup_vs_eager_fp32 == 1.0).all()


def test_report_command_names_a_bad_input(tmp_path):
    missing = run_cli(["-m", "aio_examples", "report", str(tmp_path / "nothing")])
    assert missing.returncode == 2 and "holds no results.jsonl" in missing.stderr
    bad = tmp_path / "results.jsonl"
    bad.write_text('{"model": "a"}\nnot json\n')
    broken = run_cli(["-m", "aio_examples", "report", str(bad)])
    assert broken.returncode == 2 and f"{bad}:2" in broken.stderr


def test_peak_is_measured_per_precision_and_threads_and_gives_every_counted_record_a_share(small_sweep, tmp_path):
    proc = run_cli(["-m", "aio_examples", "peak", "--precisions", "fp32", "--threads", "1,2"])
    assert proc.returncode == 0, proc.stderr[-2000:]
    from aio_examples.machine import peak

    table = peak.cached()["peaks"]["fp32"]
    assert set(table) == {"1", "2"} and all(e["gflops"] > 0 and e["engine"] in e["engines"] for e in table.values())
    bad = run_cli(["-m", "aio_examples", "peak", "--precisions", "int4"])
    assert bad.returncode == 2 and "'int4'" in bad.stderr and "accepted: fp32, bf16" in bad.stderr
    out_sweep, _ = small_sweep
    df = pd.read_csv(build_report([out_sweep], tmp_path / "report")["csv"])
    assert df.peak_pct.notna().all() and ((df.peak_pct > 0) & (df.peak_pct < 100)).all()
    assert "peak_pct" in (tmp_path / "report" / "report.html").read_text()
