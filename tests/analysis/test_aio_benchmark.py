"""benchmarks/aio_vs_baselines.py's verdicts, from records written where the benchmark reads them."""

import json
import os
import subprocess
import sys

from conftest import ROOT

SCRIPT = ROOT / "benchmarks" / "aio_vs_baselines.py"


def _record(backend, median, precision="fp32", spread=0.01):
    return {"backend": backend, "precision": precision, "status": "ok", "strategy": "openvino" if backend == "aio"
            else None, "backend_info": {}, "latency_ms": {"median": median, "ci_low": median * (1 - spread),
                                                           "ci_high": median * (1 + spread)}}


def _write(out, name, records):
    folder = out / name
    folder.mkdir(parents=True)
    (folder / "results.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))


def _render(out, model="m", env=None):
    done = subprocess.run([sys.executable, str(SCRIPT), "--models", model, "--precisions", "fp32",
                           "--output", str(out), "--render-only"], check=False, capture_output=True, text=True,
                          timeout=60, env=env)
    return done.returncode, done.stdout


def test_a_row_whose_two_orders_disagree_is_unstable_not_a_pass(tmp_path):
    # aio/best 1.40 with aio last, 1.00 with aio first: half the spread (0.20) would call 1.18 noise.
    _write(tmp_path, "m-fp32-aio-first", [_record("aio", 10.0), _record("openvino", 10.0)])
    _write(tmp_path, "m-fp32-aio-last", [_record("aio", 14.0), _record("openvino", 10.0)])
    code, out = _render(tmp_path)
    assert code == 1
    assert "UNSTABLE (the orders disagree: 1.000, 1.400)" in out
    assert "geometric mean" not in out.split("with the UNSTABLE rows")[0]
    assert "with the UNSTABLE rows, over 1 rows: 0.845x" in out
    assert "0 PASS, 0 FAIL, 1 UNSTABLE of 1 rows" in out


def test_a_measurement_again_replaces_an_unstable_one(tmp_path):
    _write(tmp_path, "m-fp32-aio-first", [_record("aio", 10.0), _record("openvino", 10.0)])
    _write(tmp_path, "m-fp32-aio-last", [_record("aio", 14.0), _record("openvino", 10.0)])
    _write(tmp_path, "m-fp32-aio-first-again1", [_record("aio", 9.0), _record("openvino", 10.0)])
    _write(tmp_path, "m-fp32-aio-last-again1", [_record("aio", 9.5), _record("openvino", 10.0)])
    code, out = _render(tmp_path)
    assert code == 0, out
    assert "| 0.925 (0.900, 0.950) | PASS |" in out
    assert "1 PASS, 0 FAIL, 0 UNSTABLE of 1 rows" in out
    assert "geometric mean over 1 rows: 1.081x" in out


def test_a_row_still_unstable_after_its_last_retry_is_not_announced_as_measured_again(tmp_path):
    for again in ("", "-again1"):
        _write(tmp_path, f"m-fp32-aio-first{again}", [_record("aio", 10.0), _record("openvino", 10.0)])
        _write(tmp_path, f"m-fp32-aio-last{again}", [_record("aio", 14.0), _record("openvino", 10.0)])
    # records beyond --retries (1) are not read
    _write(tmp_path, "m-fp32-aio-first-again2", [_record("aio", 9.0), _record("openvino", 10.0)])
    _write(tmp_path, "m-fp32-aio-last-again2", [_record("aio", 9.0), _record("openvino", 10.0)])
    code, out = _render(tmp_path)
    assert code == 1
    assert out.count("measuring again") == 1
    assert "UNSTABLE (the orders disagree: 1.000, 1.400)" in out.split("measuring again")[1]


def test_orders_that_agree_keep_the_noise_rule(tmp_path):
    # 3% slower in one order, 1% faster in the other: 1% slower overall, within half the spread (2%).
    _write(tmp_path, "m-fp32-aio-first", [_record("aio", 10.3, spread=0.001), _record("openvino", 10.0, spread=0.001)])
    _write(tmp_path, "m-fp32-aio-last", [_record("aio", 9.9, spread=0.001), _record("openvino", 10.0, spread=0.001)])
    assert "PASS (within noise)" in _render(tmp_path)[1]
    # 5% slower in both orders with tight intervals: a FAIL.
    _write(tmp_path, "n-fp32-aio-first", [_record("aio", 10.5, spread=0.001), _record("openvino", 10.0, spread=0.001)])
    _write(tmp_path, "n-fp32-aio-last", [_record("aio", 10.6, spread=0.001), _record("openvino", 10.0, spread=0.001)])
    code, out = _render(tmp_path, "n")
    assert code == 1 and "| FAIL |" in out


def test_each_row_says_how_close_the_best_baseline_is_to_the_machines_peak(tmp_path, monkeypatch):
    """2 GFLOP a pass in 10 ms is 200 GFLOP/s: half a cached fp32 peak of 400 at 2 threads; no peak, no share."""
    from aio_examples.core.paths import write_json_atomic
    from aio_examples.machine import peak

    monkeypatch.setenv("AIO_CACHE_DIR", str(tmp_path / "cache"))
    flops = {"metrics": {"flops_per_pass": 2e9}}
    for order in ("first", "last"):
        _write(tmp_path, f"m-fp32-aio-{order}", [{**_record("aio", 9.9), **flops}, {**_record("openvino", 10.0), **flops}])
    env = dict(os.environ)
    assert "| openvino 10.00 ms | - | 0.990" in _render(tmp_path, env=env)[1]
    write_json_atomic(peak.cache_path(), {"fingerprint": peak.fingerprint(),
                                          "peaks": {"fp32": {"2": {"gflops": 400.0, "engine": "torch"}}}})
    assert "| openvino 10.00 ms | 50% | 0.990" in _render(tmp_path, env=env)[1]


def test_the_kept_column_names_the_knobs_and_the_stages_that_won_and_no_stage_that_lost(tmp_path):
    aio = _record("aio", 9.0)
    aio["backend_info"] = {"tuning": {"knobs": {"io_binding": True}, "rows": {"kept": True},
                                      "split": {"kept": False}}}
    _write(tmp_path, "m-fp32-aio-first", [aio, _record("openvino", 10.0)])
    _write(tmp_path, "m-fp32-aio-last", [aio, _record("openvino", 10.0)])
    row = next(line for line in _render(tmp_path)[1].splitlines() if line.startswith("| m |"))
    assert "io_binding=True, rows |" in row and "split" not in row


def test_orders_that_disagree_but_both_find_aio_faster_are_a_pass_that_says_so(tmp_path):
    # 0.85 and 0.95: which is faster is sure in both processes, by how much is not
    _write(tmp_path, "m-fp32-aio-first", [_record("aio", 8.5), _record("openvino", 10.0)])
    _write(tmp_path, "m-fp32-aio-last", [_record("aio", 9.5), _record("openvino", 10.0)])
    code, out = _render(tmp_path)
    assert code == 0, out
    assert "PASS (faster in both orders, which disagree: 0.850, 0.950)" in out and "measuring again" not in out
    assert "1 PASS, 0 FAIL, 0 UNSTABLE of 1 rows" in out and "geometric mean over 1 rows: 1.113x" in out


def test_the_strategy_column_gives_each_engines_share_of_the_passes_when_aio_switched(tmp_path):
    aio = {**_record("aio", 9.0), "strategy": "openvino 75%+onnxruntime 25%"}     # as the runner writes it
    _write(tmp_path, "m-fp32-aio-first", [aio, _record("openvino", 10.0)])
    _write(tmp_path, "m-fp32-aio-last", [_record("aio", 9.0), _record("openvino", 10.0)])
    row = next(line for line in _render(tmp_path)[1].splitlines() if line.startswith("| m |"))
    assert "(openvino 75%+onnxruntime 25%/openvino)" in row, row
