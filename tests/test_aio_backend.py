"""The optimized backend as run.py uses it: strategies, the cached tuning decision, AIO_PROCESS_MODE."""

import json
from pathlib import Path

import torch
from conftest import ROOT, run_cli

from aio_examples import benchmark


class Mlp(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.q, self.k, self.v = (torch.nn.Linear(32, 32) for _ in range(3))

    def forward(self, x):
        return self.q(x) * self.k(x) + self.v(x)


def test_tuning_picks_a_strategy_once_and_reuses_the_cached_decision(tmp_path):
    torch.manual_seed(0)
    model = Mlp().eval()
    inputs = (torch.randn(4, 32),)
    first = benchmark(model, example_inputs=inputs, backend="aio", threads=1, num_runs=3)
    assert first.status == "ok", first.reason
    tuning = first.backend_info["tuning"]
    assert not tuning["cached"] and first.strategy in ("compiled", "onnxruntime", "openvino")
    assert first.strategy == tuning["strategy"] and tuning["strategy"] in tuning["medians_ms"]
    assert json.loads(Path(tuning["file"]).read_text())["strategy"] == first.strategy
    again = benchmark(model, example_inputs=inputs, backend="aio", threads=1, num_runs=3)
    assert again.status == "ok" and again.backend_info["tuning"]["cached"] and again.strategy == first.strategy
    assert again.check["passed"]


def test_process_mode_0_falls_back_to_eager_and_says_so(tmp_path):
    r = run_cli(["run.py", "-p", "fp32", "-t", "1", "--num-runs", "2", "--input-size", "32",
                 "--output", str(tmp_path), "--json"], cwd=ROOT / "classification" / "squeezenet",
                env={"AIO_PROCESS_MODE": "0"})
    assert r.returncode == 0, r.stderr
    assert "AIO_PROCESS_MODE=0" in r.stderr and "eager" in r.stderr
    records = [json.loads(line) for line in (tmp_path / "results.jsonl").read_text().splitlines()]
    assert [rec["backend"] for rec in records] == ["eager"]


def test_invalid_aio_variables_are_one_line_errors_before_any_work(tmp_path):
    for var, value in (("AIO_PROCESS_MODE", "2"), ("AIO_MERGE_LINEAR", "yes"),
                       ("AIO_IMPLICIT_FP16_TRANSFORM_FILTER", "(")):
        r = run_cli(["-m", "aio_examples", "run", "squeezenet", "--output", str(tmp_path)], env={var: value})
        assert r.returncode == 2, (var, r.stderr)
        assert var in r.stderr and "accepted" in r.stderr and len(r.stderr.strip().splitlines()) == 1, r.stderr
