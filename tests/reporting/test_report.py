"""Reports: the summary arithmetic on fixed records, and a real report from a real small sweep."""

import math
import re

import pandas as pd
import pytest
from conftest import run_cli

from aio_examples.core import records as res
from aio_examples.reporting.report import (
    COLUMNS,
    build_report,
    geomean_speedups,
    pareto_front,
    suite_frame,
    summary_frame,
)

BOX = {"hostname": "box", "allocator": "default", "cpu_model": "Test CPU", "arch": "x86_64", "logical_cpus": 2}
BOX_ID = res.machine_fingerprint(BOX)


def record(model, backend, median, status="ok", precision="fp32", threads=2, flops=None, **extra):
    extra.setdefault("input_shape", {"batch_size": 1})
    r = res.Result(model=model, task="image-classification", backend=backend, precision=precision, batch_size=1,
                   threads=threads, status=status,
                   reason=None if status == "ok" else "why not",
                   latency_ms={"median": median, "p90": median * 1.1, "p99": median * 1.2} if status == "ok" else None,
                   throughput={"value": 1000 / median, "unit": "images/s"} if status == "ok" else None,
                   env=dict(BOX), **extra)
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
    assert setting == {"batch_size": 1, "threads": 2, "machine": BOX_ID, "host": "box"}
    assert table.loc["geomean", ("aio", "fp32")] == pytest.approx(math.sqrt(6.0))


def test_percent_of_peak_uses_flops_per_unit_and_the_peak_at_the_same_precision_and_threads():
    df = summary_frame([record("a", "eager", 100.0, flops=4e9), record("a", "aio", 50.0, flops=4e9)],
                       peaks={BOX_ID: {"fp32": {"2": 200.0}}})
    row = df[df.backend == "aio"].iloc[0]
    assert row.achieved_gflops == pytest.approx(80.0)          # 4 GFLOP per image x 20 images/s
    assert row.peak_pct == pytest.approx(40.0)


def test_the_latest_record_of_a_configuration_wins():
    old = record("a", "eager", 100.0)
    new = record("a", "eager", 90.0)
    new["timestamp"] = "9999-01-01T00:00:00+00:00"
    df = summary_frame([new, old], peaks={})
    assert list(df.median_ms) == [90.0]


def test_records_differing_only_in_input_shape_or_sequence_length_are_rows_of_their_own():
    rows = [record("a", "eager", 100.0, input_shape={"batch_size": 1, "input_size": 64}),
            record("a", "aio", 25.0, input_shape={"batch_size": 1, "input_size": 64}),
            record("a", "eager", 300.0, input_shape={"batch_size": 1, "input_size": 96}),
            record("a", "aio", 100.0, input_shape={"batch_size": 1, "input_size": 96}),
            record("n", "eager", 8.0, input_shape={"batch_size": 1, "seq_len": 128}),
            record("n", "eager", 40.0, input_shape={"batch_size": 1, "seq_len": 384}),
            record("n", "aio", 20.0, input_shape={"batch_size": 1, "seq_len": 384})]
    df = summary_frame(rows, peaks={})
    speed = {(r.model, r.backend, r.shape): r.speedup_vs_eager_fp32 for r in df.itertuples()}
    assert len(df) == 7
    assert speed[("a", "aio", "input_size=64")] == pytest.approx(4.0)
    assert speed[("a", "aio", "input_size=96")] == pytest.approx(3.0)
    assert speed[("n", "aio", "seq_len=384")] == pytest.approx(2.0)
    table, _ = suite_frame(df)
    assert table.loc["a input_size=96", ("aio", "fp32")] == pytest.approx(3.0)


def test_a_speedup_comes_from_the_eager_fp32_measured_in_the_same_process():
    # One process measured eager and aio side by side (the runner gave aio its speedup, 2.0x); a later
    # process measured eager alone on a slower moment. The later eager row is shown, but aio keeps the
    # speedup of its own process, not 120/50.
    same = record("a", "aio", 50.0, speedup_vs_eager_fp32=2.0, run_id="p1")
    earlier_eager = record("a", "eager", 100.0, run_id="p1")
    later_eager = record("a", "eager", 120.0, run_id="p2")
    later_eager["timestamp"] = "9999-01-01T00:00:00+00:00"
    alone = record("b", "aio", 50.0, run_id="p3")           # no eager beside it: the eager record of b's setting
    b_eager = record("b", "eager", 75.0, run_id="p4")
    df = summary_frame([earlier_eager, same, later_eager, alone, b_eager], peaks={})
    speed = {(r.model, r.backend): r.speedup_vs_eager_fp32 for r in df.itertuples()}
    assert speed[("a", "aio")] == pytest.approx(2.0) and speed[("b", "aio")] == pytest.approx(1.5)
    assert list(df[df.model == "a"].median_ms) == [50.0, 120.0]


def test_configurations_measured_under_contention_are_marked_and_left_out_of_the_suite_view():
    busy = {"busy_elsewhere_cores": 0.9, "threshold_cores": 0.25}
    quiet = {"busy_elsewhere_cores": 0.02, "threshold_cores": 0.25}
    rows = [record("a", "eager", 100.0, contention=quiet), record("a", "aio", 10.0, contention=busy),
            record("b", "eager", 30.0, contention=quiet), record("b", "aio", 20.0, contention=quiet)]
    df = summary_frame(rows, peaks={})
    assert list(df.sort_values(["model", "backend"]).contended) == [True, False, False, False]
    table, _ = suite_frame(df)
    assert pd.isna(table.loc["a", ("aio", "fp32")]) and table.loc["geomean", ("aio", "fp32")] == pytest.approx(1.5)
    assert geomean_speedups(df)[("aio", "fp32")] == pytest.approx(1.5)
    with_busy, _ = suite_frame(df, include_contended=True)
    assert with_busy.loc["a", ("aio", "fp32")] == pytest.approx(10.0)
    assert geomean_speedups(df, include_contended=True)[("aio", "fp32")] == pytest.approx(math.sqrt(15.0))


def test_a_report_from_a_real_sweep_has_every_section_and_embedded_plots(small_sweep, tmp_path):
    out_sweep, _ = small_sweep
    # Contention has its own tests: this one is about the sections, whatever else the machine runs meanwhile.
    written = build_report([out_sweep], tmp_path / "report", include_contended=True)
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
    assert missing.returncode == 2 and "neither a results.jsonl file nor a folder holding one" in missing.stderr
    bad = tmp_path / "results.jsonl"
    bad.write_text(res.Result(model="a", task="t", backend="eager", precision="fp32", batch_size=1, threads=1,
                              input_shape={}).to_json() + "\nnot json\n")
    broken = run_cli(["-m", "aio_examples", "report", str(bad)])
    assert broken.returncode == 2 and f"{bad}:2" in broken.stderr


@pytest.mark.slow       # a long end-to-end run: the second tier keeps the default one under 15 minutes
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


# ---------------------------------------------------------------- accuracy

def scored(model, backend, precision, median, top_1, top_5, status="ok"):
    """A record that scored ImageNet: eager fp32's metrics 71.5 / 90.5 are the reference on the same samples."""
    r = record(model, backend, median, status=status, precision=precision, dataset="imagenet")
    r["accuracy"] = {"metrics": {"top_1": top_1, "top_5": top_5}, "samples": 1000,
                     "dataset": {"kind": "imagenet", "path": "/data/imagenet/val", "digest": "3fa1c0"},
                     "predictions": None, "reference": {"top_1": 0.715, "top_5": 0.905},
                     "delta_vs_eager_fp32": {"top_1": round(top_1 - 0.715, 6), "top_5": round(top_5 - 0.905, 6)}}
    return r


def write_records(folder, rows):
    folder.mkdir()
    for row in rows:
        res.append(folder, res.Result.from_dict(row))
    return folder


def html_rows(table: str) -> list[dict]:
    """The rows of a pandas HTML table as {header: cell text}."""
    rows = [re.findall(r"<t[hd][^>]*>(.*?)</t[hd]>", tr, re.DOTALL)
            for tr in re.findall(r"<tr[^>]*>(.*?)</tr>", table, re.DOTALL)]
    return [dict(zip(rows[0], (c.strip() for c in row), strict=True)) for row in rows[1:]]


def test_the_pareto_front_keeps_the_points_nothing_beats_on_both_speed_and_accuracy():
    points = [(1.0, 71.5), (2.4, 71.2), (2.0, 70.0), (3.0, 60.0), (2.4, 71.2), (2.4, 70.9), (0.8, 71.5)]
    # (2.0, 70.0) and (2.4, 70.9) have a faster and more accurate point; (0.8, 71.5) one as accurate and faster;
    # two equal points dominate neither.
    assert pareto_front(points) == [0, 1, 3, 4]
    assert pareto_front([]) == [] and pareto_front([(1.0, 0.5)]) == [0]


def test_a_report_of_scored_records_has_accuracy_columns_table_and_chart(tmp_path):
    rows = [scored("resnet", "eager", "fp32", 10.0, 0.715, 0.905),
            scored("resnet", "openvino", "int8", 10.0 / 2.4, 0.712, 0.903),
            scored("resnet", "onnxruntime", "fp32", 8.0, 0.715, 0.905),
            scored("resnet", "aio", "bf16", 5.0, 0.709, 0.9),               # slower than int8 and less accurate
            scored("resnet", "inductor", "int8", 2.0, 0.64, 0.85, status="fail_accuracy"),
            record("other", "eager", 20.0)]                                 # synthetic inputs: no metrics
    written = build_report([write_records(tmp_path / "run", rows)], tmp_path / "report")
    csv = pd.read_csv(written["csv"]).set_index(["model", "backend"])
    assert list(csv.columns[list(csv.columns).index("speedup_vs_eager_fp32") + 1:][:5]) == \
        ["top_1", "top_1_vs_eager_fp32", "top_5", "top_5_vs_eager_fp32", "accuracy_samples"]
    int8 = csv.loc[("resnet", "openvino")]
    assert (int8.top_1, int8.top_1_vs_eager_fp32, int8.top_5) == (71.2, -0.3, 90.3)
    assert int8.speedup_vs_eager_fp32 == pytest.approx(2.4) and pd.isna(csv.loc[("other", "eager")].top_1)
    page = written["html"].read_text()
    table = page.split("id='accuracy'>Accuracy and speed</h2>")[1].split("<h2")[0]
    assert {row["model"] for row in html_rows(table)} == {"resnet"}             # "other" scored nothing
    cells = {row["backend"]: row for row in html_rows(table)}
    assert cells["openvino"]["top_1"] == "71.2" and cells["openvino"]["top_1 vs eager fp32 (pt)"] == "-0.3"
    assert cells["openvino"]["speedup_vs_eager_fp32"] == "2.40x" and cells["openvino"]["samples"] == "1000"
    # onnxruntime fp32 is as accurate as eager and faster: eager is off the front; fail_accuracy never on it.
    assert {b: row["Pareto front"] for b, row in cells.items()} == {"openvino": "yes", "aio": "", "onnxruntime": "yes",
                                                                    "eager": "", "inductor": ""}
    assert cells["inductor"]["status"] == "fail_accuracy" and cells["inductor"]["speedup_vs_eager_fp32"] == ""
    assert list(cells) == ["openvino", "aio", "onnxruntime", "eager", "inductor"]     # fastest first
    chart = tmp_path / "report" / "plots" / "resnet-accuracy.png"
    assert chart.stat().st_size > 1000 and 'alt="resnet: top_1 vs speedup"' in page
    md = (tmp_path / "report" / "summary.md").read_text()
    assert "| 71.2 " in md and "| -0.3 " in md and "| +0.0 " in md                 # one decimal, signed changes


def test_without_scored_records_the_report_has_no_accuracy_columns_section_or_chart(tmp_path):
    assert list(summary_frame(FIXED, peaks={}).columns) == COLUMNS
    written = build_report([write_records(tmp_path / "run", FIXED)], tmp_path / "report")
    assert list(pd.read_csv(written["csv"]).columns) == COLUMNS
    assert "id='accuracy'" not in written["html"].read_text()
    assert not list((tmp_path / "report" / "plots").glob("*accuracy*"))
