"""MLPerf LoadGen driving real instance processes: every scenario, the verdict, the peak search, an instance
killed mid-run, and the inputs refused before anything starts."""

import json
import os
import threading
import time

import pytest
from conftest import run_cli

from aio_examples.core.records import records_in
from aio_examples.drivers.loadgen import (
    QUICK_MIN_MISSES,
    QUICK_MISSES,
    ServingSettings,
    Session,
    absorbable_misses,
    early_stopping_queries,
    find_peak,
    parse_detail,
    verdict,
)

pytest.importorskip("mlperf_loadgen")

MODEL = "resnet_18"
SHAPE = {"input_size": 32}
SHORT = {"duration_s": 1.0}


def session(tmp_path, instances=1, batch_size=1):
    return Session(MODEL, "eager", "fp32", batch_size, instances, 1, tmp_path, SHAPE)


# The slow tier: three LoadGen tests through the Python session; the CLI's Server run keeps LoadGen in the default
# tier
@pytest.mark.slow
def test_every_scenario_runs_under_loadgen_and_keeps_its_logs(tmp_path):
    with session(tmp_path, batch_size=2) as s:
        offline = s.run(ServingSettings("Offline", **SHORT))
        multi = s.run(ServingSettings("MultiStream", min_queries=20, **SHORT))
        server = s.run(ServingSettings("Server", target_qps=0.5 * offline["samples_per_s"], latency_ms=1000,
                                       min_queries=20, **SHORT))
    assert offline["validity"] == "VALID" and offline["samples_per_s"] > 0, offline["reasons"]
    # 20 queries cannot confirm a p99: LoadGen's early stopping says so, in plain words
    assert multi["validity"] == "INVALID" and any("early stopping" in r for r in multi["reasons"])
    assert server["queries"] >= 20 and server["latency_ms"]["p99"] > 0
    records = records_in(tmp_path)
    assert [r.scenario["scenario"] for r in records] == ["Offline", "MultiStream", "Server"]
    for r in records:
        assert r.status == "ok" and r.precision_mode == "native" and r.instances == 1
        assert r.scenario["key"].startswith(f"loadgen-{r.scenario['scenario'].lower()}")
        for name in ("mlperf_log_summary.txt", "mlperf_log_detail.txt", "mlperf_log_accuracy.json"):
            assert (tmp_path / r.instance["loadgen_logs"] / name).exists()
        # each pass the instance ran was a batch LoadGen's samples filled: never more samples than passes x b
        assert r.metrics["loadgen"]["passes"] >= 1
    offline_rec = records[0]
    assert offline_rec.throughput == {"value": offline["samples_per_s"], "unit": "samples/s"}
    assert records[2].scenario["target_qps"] == pytest.approx(0.5 * offline["samples_per_s"])
    assert records[2].scenario["key"] == f"loadgen-server-{records[2].scenario['target_qps']:g}qps"


def test_single_stream_verdict_from_loadgens_own_log(tmp_path):
    with session(tmp_path) as s:
        result = s.run(ServingSettings("SingleStream", min_queries=70, **SHORT))
    [r] = records_in(tmp_path)
    logs = tmp_path / r.instance["loadgen_logs"]
    detail = parse_detail(logs / "mlperf_log_detail.txt")
    assert verdict("SingleStream", detail) == result
    assert result["validity"] == ("VALID" if detail["result_validity"] == "VALID" else "INVALID")
    assert result["latency_ms"]["p50"] <= result["latency_ms"]["p90"] <= result["latency_ms"]["p99"]
    assert r.latency_ms["p90"] == result["latency_ms"]["p90"]
    summary = (logs / "mlperf_log_summary.txt").read_text()
    assert f"Result is : {result['validity']}" in summary


def test_invalid_reasons_in_plain_words():
    log = {"result_validity": "INVALID", "result_min_duration_met": True, "result_min_queries_met": False,
           "result_perf_constraints_met": False, "early_stopping_met": True}
    out = verdict("Server", log)
    assert out["validity"] == "INVALID"
    assert out["reasons"] == ["fewer queries completed than the minimum query count",
                              "the latency bound was not met at the target percentile"]


@pytest.mark.slow       # a long end-to-end run: the second tier keeps the default one under 15 minutes
def test_peak_search_brackets_the_highest_valid_rate(tmp_path):
    with session(tmp_path) as s:
        peak = find_peak(s, latency_ms=50, duration_s=1.0, min_queries=50, max_runs=4)
    runs = peak["runs"]
    assert 1 <= len(runs) <= 4 and runs[0]["target_qps"] == pytest.approx(peak["offline_qps"], rel=1e-3)
    valid = [r["target_qps"] for r in runs if r["validity"] == "VALID"]
    invalid = [r["target_qps"] for r in runs if r["validity"] == "INVALID"]
    # the peak is the highest VALID rate tried, and below every INVALID one
    assert peak["peak_qps"] == (max(valid) if valid else None)
    if valid and invalid:
        assert max(valid) < min(invalid)
    # a rate above the Offline one is tried only after every rate before it was VALID
    assert all(r["target_qps"] <= peak["offline_qps"] * 1.001 or all(x["validity"] == "VALID" for x in runs[:i])
               for i, r in enumerate(runs))
    records = records_in(tmp_path)
    # a rate judged INVALID by a few slow queries is tried again: every try is a record of its own
    tries = [len(r["tries"]) for r in runs]
    assert all(1 <= n <= 2 for n in tries) and all(
        n == 1 or r["tries"][0]["overlatency_queries"] <= 0.05 * r["tries"][0]["queries"] for r, n in zip(runs, tries))
    assert records[0].scenario["scenario"] == "Offline" and len(records) == sum(tries) + 2
    summary = records[-1]
    assert summary.scenario["key"] == "loadgen-server-peak" and summary.metrics["loadgen"]["runs"] == runs


@pytest.mark.slow       # three quick Server tests of 662 queries or more: the second tier
def test_a_valid_top_rate_sends_the_search_above_the_offline_rate(tmp_path):
    # a 10 s bound no queue of a few seconds can break: every rate is VALID, the Offline one included, so
    # the search steps above it by twice the tolerance each time instead of stopping at a noisy Offline figure
    with session(tmp_path) as s:
        peak = find_peak(s, latency_ms=10_000, duration_s=1.0, max_runs=3)
    runs = peak["runs"]
    assert [r["validity"] for r in runs] == ["VALID"] * 3, [r["reasons"] for r in runs]
    offline = peak["offline_qps"]
    assert [r["target_qps"] for r in runs] == pytest.approx([offline, offline * 1.1, offline * 1.21], rel=1e-3)
    assert peak["peak_qps"] == runs[-1]["target_qps"] and peak["bracket_qps"] == [peak["peak_qps"], None]


def test_an_instance_killed_mid_run_fails_the_run_without_hanging(tmp_path):
    with session(tmp_path, instances=2) as s:
        victim = s.members[1].child.proc
        threading.Timer(1.0, victim.kill).start()
        start = time.monotonic()
        result = s.run(ServingSettings("Server", target_qps=20, latency_ms=1000, duration_s=3.0, min_queries=10))
        took = time.monotonic() - start
    assert result is None and "instance 1" in s.failure
    assert took < 60                  # LoadGen ended: its queries were completed unrun after the death
    [r] = records_in(tmp_path)
    assert r.status == "failed" and "instance 1" in r.reason


@pytest.mark.parametrize(("args", "message"), [
    (["--scenario", "Server", "--target-qps", "0"], "--target-qps 0.0 is invalid"),
    (["--scenario", "Server", "--target-qps", "-3"], "--target-qps -3.0 is invalid"),
    (["--scenario", "Sever", "--target-qps", "3"], "--scenario 'Sever' does not exist"),
    (["--scenario", "Server"], "needs --target-qps"),
    (["--scenario", "Offline", "--instances", "64", "--threads-per-instance", "4"], "64 instances x 4 threads"),
    (["--scenario", "SingleStream", "-b", "4"], "does not fit SingleStream"),
    (["--scenario", "Offline", "--find-peak"], "--find-peak searches Server rates"),
])
def test_bad_input_is_one_line_and_exit_2(tmp_path, args, message):
    proc = run_cli(["-m", "aio_examples", "loadgen", MODEL, "--output", str(tmp_path), *args], timeout=120)
    assert proc.returncode == 2, proc.stderr
    lines = [x for x in proc.stderr.splitlines() if x.strip() and "Failed to load" not in x]
    assert len(lines) == 1 and message in lines[0], proc.stderr
    assert not (tmp_path / "loadgen").exists()


def test_generators_are_refused_before_starting(tmp_path):
    proc = run_cli(["-m", "aio_examples", "loadgen", "llama_3_2_1b", "--scenario", "MultiStream",
                    "--output", str(tmp_path)], timeout=120)
    assert proc.returncode == 2 and "generates text" in proc.stderr


# The slow tier: a whole command that measures a pass to refuse the bound; loadgen's other bad input stays in the
# default tier
@pytest.mark.slow
def test_a_latency_bound_below_one_pass_is_refused_before_loadgen_runs(tmp_path):
    proc = run_cli(["-m", "aio_examples", "loadgen", MODEL, "--input-size", "64", "--scenario", "Server",
                    "--target-qps", "5", "--latency-ms", "0.001", "--backend", "eager", "--output", str(tmp_path)],
                   timeout=300)
    assert proc.returncode == 2 and "can never be met" in proc.stderr, proc.stderr
    assert not list((tmp_path / "loadgen").glob("*/*/mlperf_log_detail.txt"))        # LoadGen never started


def test_cli_runs_server_and_prints_the_verdict(tmp_path):
    proc = run_cli(["-m", "aio_examples", "loadgen", MODEL, "--input-size", "32", "--scenario", "Server",
                    "--target-qps", "20", "--latency-ms", "500", "--duration", "1", "--min-queries", "20",
                    "--backend", "eager", "--instances", "2", "--threads-per-instance", "1",
                    "--output", str(tmp_path)], timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert "Server resnet_18 eager/fp32 b1 2x1: 20 queries/s offered" in proc.stdout
    [r] = [json.loads(x) for x in (tmp_path / "results.jsonl").read_text().splitlines()]
    assert r["instances"] == 2 and len(r["instance"]["layout"]) == 2
    assert len({c for x in r["instance"]["layout"] for c in x["cores"]}) == 2       # disjoint cores
    assert r["metrics"]["loadgen"]["validity"] in ("VALID", "INVALID")


def test_report_draws_the_knee_and_lists_the_peak(tmp_path):
    from aio_examples.reporting.report import build_report

    with session(tmp_path) as s:
        find_peak(s, latency_ms=50, duration_s=1.0, min_queries=50, max_runs=2)
    written = build_report([tmp_path], tmp_path / "report")
    page = written["html"].read_text()
    assert "Serving (MLPerf LoadGen)" in page and "Peak Server rate under the latency bound" in page
    knee = tmp_path / "report" / "plots" / "resnet_18-serving-knee.png"
    assert knee.exists() and knee.stat().st_size > 1000
    assert page.count("INVALID") + page.count("VALID") >= 3          # each Server test with its verdict
    assert "multi-instance scaling" not in page.lower() or "instances.png" not in page


@pytest.mark.slow      # two sweeps of their own: the second tier, like the other sweep tests
def test_a_sweep_runs_loadgen_tests_as_points_and_resumes(tmp_path):
    toml = tmp_path / "serving.toml"
    toml.write_text(f'''models = ["{MODEL}"]
backends = ["eager"]
threads = [1]
shape = {{input_size = 32}}
output = "{tmp_path / 'out'}"
[serving]
scenarios = ["Offline", "Server"]
target_qps = [20]
latency_ms = 500
duration = 1
min_queries = 20
''')
    proc = run_cli(["-m", "aio_examples", "sweep", "--config", str(toml), "--quiet"], timeout=600)
    assert proc.returncode == 0, proc.stderr
    records = records_in(tmp_path / "out")
    assert [r.scenario["key"] for r in records] == ["loadgen-offline", "loadgen-server-20qps"]
    assert all(r.status == "ok" and r.point_id for r in records)
    again = run_cli(["-m", "aio_examples", "sweep", "--config", str(toml), "--quiet"], timeout=600)
    assert again.returncode == 0 and "2 already done" in again.stdout + again.stderr
    assert len(records_in(tmp_path / "out")) == 2


@pytest.mark.parametrize(("serving", "message"), [
    ('scenarios = ["Server"]', "no serving.target_qps"),
    ('scenarios = ["Ofline"]', "--scenario 'Ofline' does not exist"),
    ('target_qps = [0]', "serving.target_qps [0] is invalid"),
    ('speed = 3', "serving key 'speed' is unknown"),
])
def test_a_sweeps_serving_table_is_checked_before_anything_runs(tmp_path, serving, message):
    toml = tmp_path / "bad.toml"
    toml.write_text(f'models = ["{MODEL}"]\noutput = "{tmp_path / "out"}"\n[serving]\n{serving}\n')
    proc = run_cli(["-m", "aio_examples", "sweep", "--config", str(toml), "--quiet"], timeout=120)
    assert proc.returncode == 2 and message in proc.stderr, proc.stderr
    assert not (tmp_path / "out" / "results.jsonl").exists()


@pytest.mark.slow      # a peak search per layout: the second tier
def test_instances_auto_searches_the_peak_of_every_layout(tmp_path):
    from aio_examples.machine.topology import read_topology

    expected = read_topology().instance_layouts()        # the layouts themselves: tests/machine/test_server_layouts
    proc = run_cli(["-m", "aio_examples", "loadgen", MODEL, "--input-size", "32", "--scenario", "Server",
                    "--find-peak", "--latency-ms", "50", "--instances", "auto", "--duration", "1",
                    "--min-queries", "50", "--backend", "eager", "--output", str(tmp_path)], timeout=900)
    peaks = [r for r in records_in(tmp_path) if r.scenario["key"] == "loadgen-server-peak"]
    layouts = {(r.instances, r.threads) for r in peaks}
    assert layouts == set(expected), proc.stdout + proc.stderr
    found = [r for r in peaks if r.status == "ok"]
    assert proc.returncode == (0 if found else 1), proc.stderr
    if len(layouts) > 1 and found:
        best = max(found, key=lambda r: r.throughput["value"])
        assert f"best layout: {best.instances} instance(s) x {best.threads} thread(s)" in proc.stdout


@pytest.mark.slow       # a long end-to-end run: the second tier keeps the default one under 15 minutes
def test_cli_prints_an_offline_result(tmp_path):
    proc = run_cli(["-m", "aio_examples", "loadgen", MODEL, "--input-size", "32", "--scenario", "Offline",
                    "--duration", "1", "--backend", "eager", "--threads-per-instance", "1", "--output", str(tmp_path)],
                   timeout=300)
    assert proc.returncode == 0, proc.stderr
    [r] = records_in(tmp_path)
    assert f"Offline resnet_18 eager/fp32 b1 1x1: {r.throughput['value']:.2f} samples/s: VALID" in proc.stdout


TINY_LLAMA = ["num_hidden_layers=1", "hidden_size=128", "intermediate_size=256", "num_attention_heads=4",
              "num_key_value_heads=2", "head_dim=32", "vocab_size=512"]


@pytest.mark.slow       # a long end-to-end run: the second tier keeps the default one under 15 minutes
def test_a_text_generator_is_judged_on_its_token_latencies(tmp_path):
    with Session("llama_3_2_1b", "eager", "fp32", 1, 1, 1, tmp_path, {"seq_len": 16, "new_tokens": 8},
                 config=TINY_LLAMA) as s:
        result = s.run(ServingSettings("Server", target_qps=5, ttft_ms=2000, tpot_ms=200, duration_s=1.0,
                                       min_queries=20))
    # the first token is reported as it comes out, well before the query's last one
    assert result["ttft_ms"]["p50"] < result["latency_ms"]["p50"]
    assert 0 < result["tpot_ms"]["p50"] < result["latency_ms"]["p50"] and result["tokens_per_s"] > 0
    [r] = records_in(tmp_path)
    assert r.scenario["ttft_ms"] == 2000 and r.scenario["tpot_ms"] == 200 and "latency_ms" not in r.scenario
    assert r.metrics["loadgen"]["queries"] >= 20


def test_quick_settings_and_loadgens_own_mlperf_settings():
    import mlperf_loadgen as lg

    from aio_examples.drivers.loadgen import test_settings

    quick = test_settings(lg, ServingSettings("Server", target_qps=40, latency_ms=100), "resnet_50_v1", 20.0, 2, 1)
    # room for QUICK_MISSES slow queries: 1307 queries, 33 s at 40/s, within the 60 s budget
    assert (quick.min_duration_ms, quick.min_query_count) == (10_000, early_stopping_queries(QUICK_MISSES, 0.99))
    slow = test_settings(lg, ServingSettings("Server", target_qps=5, latency_ms=1000), "resnet_50_v1", 20.0, 2, 1)
    assert slow.min_query_count == early_stopping_queries(QUICK_MIN_MISSES, 0.99)        # 60 s hold 300 only
    multi = test_settings(lg, ServingSettings("MultiStream"), "resnet_50_v1", 15.0, 2, 1)    # 4 passes a query
    assert multi.min_query_count == early_stopping_queries(2, 0.99)       # 838 x 60 ms fit in 60 s, 1001 do not
    assert quick.server_target_qps == 40 and quick.server_target_latency_ns == 100_000_000
    assert quick.offline_expected_qps == pytest.approx(150.0)            # 1.5 x 2 instances x 1 sample / 20 ms
    official = test_settings(lg, ServingSettings("Offline", official=True), "resnet_50_v1", 20.0, 2, 1)
    assert official.min_duration_ms == 600_000                              # MLPerf's ten minutes
    assert official.performance_sample_count_override == 1024              # its resnet50 entry
    assert official.schedule_rng_seed != 0                                  # its fixed seeds


def _server_with_slow_queries(tmp_path, queries: int, slow: set) -> dict:
    """A real LoadGen Server test of `queries` queries at 200/s against an in-process SUT that answers at once,
    except the queries numbered in `slow`, which take 400 ms against a 200 ms bound."""
    import mlperf_loadgen as lg

    issued = []

    def issue(samples):
        for s in samples:
            threading.Thread(target=answer, args=(s, len(issued) in slow)).start()
            issued.append(s)

    def answer(s, late):
        time.sleep(0.4 if late else 0.0)
        lg.QuerySamplesComplete([lg.QuerySampleResponse(s.id, 0, 0)])

    tmp_path.mkdir()
    ts = lg.TestSettings()
    ts.scenario, ts.mode = lg.TestScenario.Server, lg.TestMode.PerformanceOnly
    ts.server_target_qps, ts.server_target_latency_ns = 200, 200_000_000
    ts.min_duration_ms, ts.min_query_count = 100, queries
    log = lg.LogSettings()
    log.log_output.outdir, log.log_output.copy_summary_to_stdout = str(tmp_path), False
    sut, qsl = lg.ConstructSUT(issue, lambda: None), lg.ConstructQSL(64, 64, lambda x: None, lambda x: None)
    lg.StartTestWithLogSettings(sut, qsl, ts, log)
    lg.DestroyQSL(qsl)
    lg.DestroySUT(sut)
    return verdict("Server", parse_detail(tmp_path / "mlperf_log_detail.txt"))


def test_query_counts_follow_loadgens_own_early_stopping_rule():
    # LoadGen's p99 figures: 459 queries without a miss, 662 with one, 838 with two
    assert [early_stopping_queries(k, 0.99) for k in range(3)] == [459, 662, 838]
    assert absorbable_misses(837, 0.99) == 1 and absorbable_misses(838, 0.99) == 2
    assert absorbable_misses(458, 0.99) is None


# The slow tier: two real LoadGen Server tests of 838 queries; the rule's figures stay in the default tier (above)
@pytest.mark.slow
def test_the_real_loadgen_agrees_with_the_early_stopping_query_counts(tmp_path):
    # two slow queries in exactly that many pass, one query fewer does not
    need = early_stopping_queries(2, 0.99)
    enough = _server_with_slow_queries(tmp_path / "a", need, {50, 400})
    assert enough["overlatency_queries"] == 2 and enough["validity"] == "VALID", enough
    assert enough["absorbable_misses"] >= 2
    short = _server_with_slow_queries(tmp_path / "b", need - 1, {50, 400})
    assert short["validity"] == "INVALID" and "at least 1 more" in short["early_stopping"], short


SLOW_MODULE = """
import os, time
import torch


class SlowSometimes(torch.nn.Module):
    \"\"\"A small linear layer whose 300th and 600th forward in any instance take longer than the bound: the
    first process to claim each of those turns sleeps, so each is one slow query.\"\"\"

    def __init__(self, folder):
        super().__init__()
        self.linear, self.folder, self.calls = torch.nn.Linear(16, 16), folder, 0

    def forward(self, x):
        self.calls += 1
        if self.calls in (300, 600):
            try:
                os.close(os.open(os.path.join(self.folder, f"slow-{self.calls}"), os.O_CREAT | os.O_EXCL))
                time.sleep(0.13)
            except FileExistsError:
                pass
        return self.linear(x)
"""


@pytest.mark.slow       # a 1307-query Server test through two instance processes: about half a minute
def test_a_quick_server_run_absorbs_a_slow_query_or_two(tmp_path, monkeypatch):
    import sys

    import torch

    (tmp_path / "slowmod.py").write_text(SLOW_MODULE)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setenv("PYTHONPATH", str(tmp_path) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    import slowmod

    torch.save(slowmod.SlowSometimes(str(tmp_path)), tmp_path / "slow.pt")
    sys.modules.pop("slowmod")
    out = tmp_path / "out"
    with Session(str(tmp_path / "slow.pt"), "eager", "fp32", 1, 2, 1, out,
                 run_flags={"input_shape": "x=1x16"}) as s:
        result = s.run(ServingSettings("Server", target_qps=100, latency_ms=100, duration_s=1.0))
    assert (tmp_path / "slow-300").exists() and (tmp_path / "slow-600").exists()     # both slow turns ran
    assert result["overlatency_queries"] >= 2 and result["validity"] == "VALID", result
    assert result["absorbable_misses"] == QUICK_MISSES
    [r] = records_in(out)
    assert r.metrics["loadgen"]["overlatency_queries"] == result["overlatency_queries"]
    # two instances on this machine's cores: where LoadGen's threads ran is in the record
    threads = r.instance["loadgen_threads"]
    assert threads["cpus"] and set(threads["cpus"]) <= set(os.sched_getaffinity(0))


def test_loadgens_threads_run_on_a_spare_core_when_the_layout_leaves_one(tmp_path):
    from aio_examples.machine.topology import read_topology

    topology = read_topology()
    if topology.physical_cores < 2:
        pytest.skip("one core: no layout leaves one spare")
    with session(tmp_path) as s:
        s.run(ServingSettings("SingleStream", min_queries=70, **SHORT))
        spare = s.loadgen_cpus
        used = s.cpu_sets[0]
    [r] = records_in(tmp_path)
    threads = r.instance["loadgen_threads"]
    assert spare and threads["spare_cores"] and threads["cpus"] == sorted(spare)      # read back in the threads
    assert not set(threads["cpus"]) & set(used)
