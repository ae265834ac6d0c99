"""The optimized backend as run.py uses it: strategies, the cached tuning decision, AIO_PROCESS_MODE."""

import json
import subprocess
import sys
from pathlib import Path

import torch
from conftest import ROOT, run_cli

from aio_examples import benchmark
from aio_examples.backends import aio


class Mlp(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.q, self.k, self.v = (torch.nn.Linear(32, 32) for _ in range(3))

    def forward(self, x):
        return self.q(x) * self.k(x) + self.v(x)


def test_tuning_picks_a_strategy_once_and_reuses_the_cached_decision(tmp_path, monkeypatch):
    monkeypatch.setattr(aio, "BUSY_LIMIT_CORES", float("inf"))      # whatever else the machine runs now
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


def test_a_decision_tuned_while_another_process_holds_a_core_is_used_but_not_cached(tmp_path):
    torch.manual_seed(1)
    model = Mlp().eval()
    inputs = (torch.randn(3, 32),)
    hog = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        r = benchmark(model, example_inputs=inputs, backend="aio", threads=1, num_runs=3)
    finally:
        hog.kill()
    assert r.status == "ok", r.reason
    tuning = r.backend_info["tuning"]
    assert tuning["busy_elsewhere_cores"] > aio.BUSY_LIMIT_CORES and "not_saved" in tuning
    assert not Path(tuning["file"]).exists()


def test_prepared_outside_the_runner_it_takes_the_first_strategy_untuned_and_caches_nothing():
    """No timing function handed in (a user calling prepare): no timing of its own, and it says so."""
    from aio_examples.backends import BACKENDS, PrepareContext
    from aio_examples.core.paths import cache_dir

    torch.manual_seed(2)
    ctx = PrepareContext(model_name="untuned", task="custom", family="nlp", shape={}, batch_size=2, weights_id="-")
    inputs = (torch.randn(2, 32),)
    prepared = BACKENDS["aio"].prepare(Mlp().eval(), inputs, "fp32", 1, ctx)
    assert prepared.info["strategy"] == "compiled"
    assert prepared.info["tuning"]["not_tuned"] == "no timing function handed in"
    assert not list(cache_dir("tuning").glob("untuned-*/decision.json"))
    with torch.no_grad():
        assert prepared.fn(*prepared.inputs).shape == (2, 32)


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


def test_the_compiled_strategy_keeps_the_modules_other_methods():
    """A generation step's pass calls `step.new_cache(...)` on what the backend prepared, as on any
    torch.compile result."""
    from aio_examples.backends import PrepareContext

    class Step(Mlp):
        def new_cache(self, n):
            return torch.zeros(n)

    ctx = PrepareContext(model_name="step", task="custom", family="nlp", shape={}, batch_size=4, weights_id="-")
    inputs = (torch.randn(4, 32),)
    prepared = aio._compiled(Step().eval(), inputs, "fp32", 1, ctx)
    with torch.no_grad():
        assert prepared.fn(*prepared.inputs).shape == (4, 32)
    assert prepared.fn.new_cache(3).shape == (3,)
    assert prepared.info["passes"]["merge_linear"]["linears_merged"] == 3    # checked after the first call


def test_tuning_keeps_no_strategy_whose_outputs_fail_the_check(monkeypatch):
    """A strategy whose outputs fail the check is refused with the check's reason; when every one fails, the
    fastest is kept and the decision says so (its record then fails the check itself)."""
    from aio_examples.backends import BACKENDS, PrepareContext
    from aio_examples.measurement.timing import time_passes

    monkeypatch.setattr(aio, "BUSY_LIMIT_CORES", float("inf"))
    torch.manual_seed(3)
    inputs = (torch.randn(2, 32),)

    def tuned(check, name):
        ctx = PrepareContext(model_name=name, task="custom", family="nlp", shape={}, batch_size=2, weights_id=name,
                             time_passes=time_passes, check=check)
        return BACKENDS["aio"].prepare(Mlp().eval(), inputs, "fp32", 1, ctx).info

    # the compiled strategy's output is a torch tensor, the runtimes' are numpy arrays: refuse the first
    info = tuned(lambda out, precision: "wrong" if isinstance(out, torch.Tensor) else None, "checked-one")
    assert info["strategy"] in ("onnxruntime", "openvino")
    assert info["tuning"]["refused"]["compiled"] == "outputs fail the output check: wrong"
    info = tuned(lambda out, precision: "wrong", "checked-all")
    assert info["strategy"] in info["tuning"]["medians_ms"] and "every strategy" in info["tuning"]["output_check"]
