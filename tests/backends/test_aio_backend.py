"""The optimized backend as run.py uses it: strategies, the cached tuning decision, AIO_PROCESS_MODE."""

import contextlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from conftest import ROOT, run_cli

from aio_examples import benchmark
from aio_examples.backends.aio import choose, compiled
from aio_examples.machine.contention import CONTENDED_CORES
from aio_examples.measurement import timing


class Mlp(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.q, self.k, self.v = (torch.nn.Linear(32, 32) for _ in range(3))

    def forward(self, x):
        return self.q(x) * self.k(x) + self.v(x)


def test_tuning_picks_a_strategy_once_and_reuses_the_cached_decision(tmp_path, monkeypatch):
    monkeypatch.setattr(timing, "TUNING_CONTENDED_CORES", float("inf"))   # whatever else the machine runs now
    torch.manual_seed(0)
    model = Mlp().eval()
    inputs = (torch.randn(4, 32),)
    first = benchmark(model, example_inputs=inputs, backend="aio", threads=1, num_runs=3)
    assert first.status == "ok", first.reason
    tuning = first.backend_info["tuning"]
    decided = tuning["strategy"]
    assert not tuning["cached"] and decided in ("compiled", "onnxruntime", "openvino")
    assert decided in tuning["medians_ms"]
    assert json.loads(Path(tuning["file"]).read_text())["strategy"] == decided
    assert "switch" not in json.loads(Path(tuning["file"]).read_text())        # what one run did is not the decision
    # the finalists (within FINALIST_MARGIN of the fastest) stay prepared, and the run switches among them
    medians = tuning["medians_ms"]
    finalists = set(choose.finalists(min(medians, key=medians.get), medians))
    switch = tuning.get("switch")
    assert (switch["engines"][0], set(switch["engines"])) == (decided, finalists) if len(finalists) > 1 \
        else switch is None, tuning
    assert ran(first) == ({n for n, k in switch["passes"].items() if k} if switch else {decided}), first.strategy
    monkeypatch.setenv("AIO_RACE_CLOSE", "0")       # the cached decision as it is (the race: below)
    again = benchmark(model, example_inputs=inputs, backend="aio", threads=1, num_runs=3)
    assert again.status == "ok" and again.backend_info["tuning"]["cached"] and again.strategy == decided
    assert again.check["passed"]


def ran(r) -> set[str]:
    """The engines a record's strategy names: `onnxruntime 97%+openvino 3%` when it switched among them."""
    return {part.rsplit(" ", 1)[0] if part.endswith("%") else part for part in r.strategy.split("+")}


@pytest.mark.slow      # prepares and races every engine twice: 20 s
def test_a_cached_decision_races_the_engines_close_to_it_again_in_the_process_that_runs_it(monkeypatch):
    """Engines within RACE_MARGIN in the decision's timing are timed again where they run, and the faster here
    is run; engines far behind, or AIO_RACE_CLOSE=0, leave the decision's strategy alone, untimed."""
    monkeypatch.setattr(timing, "TUNING_CONTENDED_CORES", float("inf"))
    torch.manual_seed(6)
    model = Mlp().eval()
    inputs = (torch.randn(6, 32),)
    first = benchmark(model, example_inputs=inputs, backend="aio", threads=1, num_runs=3).backend_info["tuning"]
    assert "race" not in first                       # tuned in this very process: nothing to race
    decision_file = Path(first["file"])
    decision = json.loads(decision_file.read_text())
    slowest = max(first["medians_ms"], key=first["medians_ms"].get)

    def rerun(medians: dict, **env) -> tuple:
        decision_file.write_text(json.dumps({**decision, "strategy": slowest, "medians_ms": medians}))
        for var, value in env.items():
            monkeypatch.setenv(var, value)
        r = benchmark(model, example_inputs=inputs, backend="aio", threads=1, num_runs=3)
        assert r.status == "ok" and r.check["passed"], (r.reason, r.check)
        return r, r.backend_info["tuning"]

    # every engine as close as can be: all raced here, the fastest of this race run (when its lead is clear of
    # noise in quiet rounds) and named in the record
    r, tuning = rerun({s: 1.0 for s in first["medians_ms"]})
    race = tuning["race"]
    assert race["decision"] == slowest and set(race["medians_ms"]) == set(first["medians_ms"]), race
    fastest = min(race["medians_ms"], key=race["medians_ms"].get)
    won = race["quiet"] and race["clear"]
    assert race["chosen"] == (fastest if won else slowest) == tuning["strategy"], race
    assert tuning["cached"] and json.loads(decision_file.read_text())["strategy"] == slowest   # the cache as it was
    # every engine raced stays prepared, and the pass switches among them: the passes counted are the record's,
    # and its strategy names the engines that ran, most passes first, with their shares
    switch = tuning["switch"]
    assert ran(r) == {n for n, k in switch["passes"].items() if k}, (r.strategy, switch)
    if len(ran(r)) > 1:
        shares = [float(part.rsplit(" ", 1)[1].strip("<%")) for part in r.strategy.split("+")]
        assert shares == sorted(shares, reverse=True) and 95 <= sum(shares) <= 105, r.strategy
    others = sorted((s for s in race["medians_ms"] if s != race["chosen"]), key=race["medians_ms"].get)
    assert switch["engines"] == [race["chosen"], *others] and switch["leader"] in switch["engines"], race
    assert sum(switch["passes"].values()) >= r.latency_ms["n"] and set(switch["precision_modes"]) == set(others) | {
        race["chosen"]}, switch
    assert r.precision_mode.split("+")[0] == switch["precision_modes"][race["chosen"]]
    r, tuning = rerun({s: 1.0 for s in first["medians_ms"]}, AIO_SWITCH="0")
    assert "switch" not in tuning and r.strategy == tuning["race"]["chosen"]
    assert "+" not in r.precision_mode
    monkeypatch.delenv("AIO_SWITCH")
    # the others far behind: the decision's strategy alone, as cached
    r, tuning = rerun({s: 1.0 if s == slowest else 2.0 for s in first["medians_ms"]})
    assert "race" not in tuning and r.strategy == slowest
    r, tuning = rerun({s: 1.0 for s in first["medians_ms"]}, AIO_RACE_CLOSE="0")
    assert "race" not in tuning and r.strategy == slowest


@contextlib.contextmanager
def busy(script: str = "while True: pass"):
    """`script` (a busy loop by default) running pinned to each CPU this process may use, while inside."""
    procs = [subprocess.Popen(["taskset", "-c", str(c), sys.executable, "-c", script])
             for c in os.sched_getaffinity(0)]
    try:
        yield
    finally:
        for p in procs:
            p.kill()


def quick_tuning(monkeypatch):
    """Tuning that gives up on a busy machine within seconds (its rounds and waits as run.py has them, shorter)."""
    monkeypatch.setattr(timing, "QUIET_WAIT_S", 1.0)
    monkeypatch.setattr(timing, "TUNING_TIMEOUT_S", 1.0)


def test_tuning_on_a_machine_busy_throughout_is_provisional_and_not_cached(monkeypatch):
    quick_tuning(monkeypatch)
    torch.manual_seed(1)
    model = Mlp().eval()
    inputs = (torch.randn(3, 32),)
    with busy():
        r = benchmark(model, example_inputs=inputs, backend="aio", threads=1, num_runs=3)
    assert r.status == "ok", r.reason
    tuning = r.backend_info["tuning"]
    assert not tuning["quiet"] and tuning["busy_elsewhere_cores"] > tuning["round_limit_cores"]
    assert all(dropped > 0 for kept, dropped in tuning["rounds_kept_dropped"].values())
    assert "provisional" in tuning and "fastest under contention" in tuning["provisional"]
    assert not Path(tuning["file"]).exists()


# The slow tier: two tunings, one under load; the busy machine's own rule stays in the default tier
# (test_tuning_on_a_machine_busy_throughout_...)
@pytest.mark.slow
def test_a_busy_machine_keeps_the_decision_taken_before_under_other_library_versions(monkeypatch):
    """The decision of a quiet run whose key differs only in library versions (an upgrade since) wins over
    timings taken while other processes held every core."""
    torch.manual_seed(4)
    model = Mlp().eval()
    inputs = (torch.randn(5, 32),)
    monkeypatch.setattr(timing, "TUNING_CONTENDED_CORES", float("inf"))
    first = benchmark(model, example_inputs=inputs, backend="aio", threads=1, num_runs=3).backend_info["tuning"]
    folder = Path(first["file"]).parent
    key = json.loads((folder / "key.json").read_text())
    older = folder.with_name(folder.name[:-4] + "0ld0")       # the same model's folder under an older torch
    older.mkdir()
    (older / "key.json").write_text(json.dumps({**key, "versions": {**key["versions"], "torch": "2.12.0"}}))
    # the prior names the strategy this run is least likely to pick on its own
    slowest = max(first["medians_ms"], key=first["medians_ms"].get)
    (older / "decision.json").write_text(json.dumps({"strategy": slowest}))
    Path(first["file"]).unlink()
    monkeypatch.setattr(timing, "TUNING_CONTENDED_CORES", CONTENDED_CORES)
    quick_tuning(monkeypatch)
    with busy():
        r = benchmark(model, example_inputs=inputs, backend="aio", threads=1, num_runs=3)
    tuning = r.backend_info["tuning"]
    assert tuning["strategy"] == slowest and tuning["prior_decision"] == str(older / "decision.json")
    assert "other versions" in tuning["provisional"] and not Path(tuning["file"]).exists()
    # timings this busy say little: every engine prepared stays in, the run starting on the prior's
    assert tuning["switch"]["engines"][0] == slowest and set(tuning["switch"]["engines"]) == set(first["medians_ms"])


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
                       ("AIO_IMPLICIT_FP16_TRANSFORM_FILTER", "("), ("AIO_TUNE_KNOBS", "yes"),
                       ("AIO_KNOB_BUDGET_S", "-5"), ("AIO_RACE_CLOSE", "yes"),
                       ("AIO_SWITCH", "2"), ("AIO_HUGE_PAGES", "on")):
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
    prepared = compiled.prepare(Step().eval(), inputs, "fp32", 1, ctx)
    with torch.no_grad():
        assert prepared.fn(*prepared.inputs).shape == (4, 32)
    assert prepared.fn.new_cache(3).shape == (3,)
    assert prepared.info["passes"]["merge_linear"]["linears_merged"] == 3    # checked after the first call


def _checked_tuning(monkeypatch, check, name) -> dict:
    """aio's tuning of an Mlp at fp32 on one thread with this output `check`: the prepared candidate's info."""
    from aio_examples.backends import BACKENDS, PrepareContext
    from aio_examples.measurement.timing import time_passes

    monkeypatch.setattr(timing, "TUNING_CONTENDED_CORES", float("inf"))
    torch.manual_seed(3)
    inputs = (torch.randn(2, 32),)
    ctx = PrepareContext(model_name=name, task="custom", family="nlp", shape={}, batch_size=2, weights_id=name,
                         time_passes=time_passes, check=check)
    return BACKENDS["aio"].prepare(Mlp().eval(), inputs, "fp32", 1, ctx).info


def test_tuning_keeps_no_strategy_whose_outputs_fail_the_check(monkeypatch):
    """A strategy whose outputs fail the check is refused with the check's reason (when every one fails, the fastest
    is kept and the decision says so, its record then failing the check itself: the test after this one)."""
    # a quick fp32 tuning leaves the compiled graph to the runtimes (settings.QUICK_LEFT_TO_RUNTIMES)
    info = _checked_tuning(monkeypatch, None, "quick-fp32")
    assert info["tuning"]["refused"]["compiled"].startswith("left out of a quick fp32 tuning")
    monkeypatch.setenv("AIO_TUNE", "thorough")         # which tries every strategy
    # the compiled strategy's output is a torch tensor, the runtimes' are numpy arrays: refuse the first
    info = _checked_tuning(monkeypatch, lambda out, precision: "wrong" if isinstance(out, torch.Tensor) else None,
                           "checked-one")
    assert info["strategy"] in ("onnxruntime", "openvino")
    assert info["tuning"]["refused"]["compiled"] == "outputs fail the output check: wrong"


# The slow tier: a thorough tuning of its own; refusing the strategies that fail stays in the default tier (above)
@pytest.mark.slow
def test_a_tuning_whose_every_strategy_fails_the_check_keeps_the_fastest_and_says_so(monkeypatch):
    monkeypatch.setenv("AIO_TUNE", "thorough")
    info = _checked_tuning(monkeypatch, lambda out, precision: "wrong", "checked-all")
    assert info["strategy"] in info["tuning"]["medians_ms"] and "every strategy" in info["tuning"]["output_check"]


# Busy 0.8 s of every 2.5 s on every CPU at once (phases on the wall clock, so the CPUs' bursts line up and leave
# common quiet windows whatever each process's start-up time): some tuning rounds are taken whole, others left alone.
BURSTS = ("import time\nwhile True:\n    phase = time.time() % 2.5\n    if phase >= 0.8:\n"
          "        time.sleep(2.5 - phase)\n")


@pytest.mark.slow
def test_bursts_of_other_work_during_tuning_do_not_change_its_choice(tmp_path, monkeypatch):
    torch.manual_seed(5)
    model = Mlp().eval()
    inputs = (torch.randn(4, 32),)
    monkeypatch.setenv("AIO_CACHE_DIR", str(tmp_path / "quiet"))
    quiet = benchmark(model, example_inputs=inputs, backend="aio", threads=2, num_runs=3)
    assert quiet.backend_info["tuning"]["clear"], quiet.backend_info["tuning"]
    monkeypatch.setenv("AIO_CACHE_DIR", str(tmp_path / "busy"))
    with busy(BURSTS):
        during = benchmark(model, example_inputs=inputs, backend="aio", threads=2, num_runs=3)
    tuning = during.backend_info["tuning"]
    assert sum(dropped for _, dropped in tuning["rounds_kept_dropped"].values()) > 0, tuning   # the bursts were seen
    assert tuning["strategy"] == quiet.backend_info["tuning"]["strategy"], (quiet.backend_info["tuning"], tuning)
    assert tuning["quiet"] and not tuning["cached"] and Path(tuning["file"]).exists()


def test_a_choice_left_without_rivals_says_why(tmp_path, caplog):
    import logging

    from aio_examples.backends.aio.choose import choose as _choose

    refused = {"openvino": "not tried: about 3.0 GiB more memory needed"}
    with caplog.at_level(logging.INFO, logger="aio_examples"):
        best, tuning = _choose({"onnxruntime": (None, lambda: None)}, refused, None, 2, tmp_path / "d.json",
                               {"model": "m", "precision": "fp32"}, save=False)
    assert best == "onnxruntime" and tuning["refused"] == refused
    said = [r.getMessage() for r in caplog.records if "tuning chose" in r.getMessage()]
    why = "openvino: not tried: about 3.0 GiB more memory needed"
    assert said == [f"aio tuning chose onnxruntime (the only strategy prepared; {why})"]


def test_aio_torch_runs_aios_own_compiled_path_and_nothing_else(monkeypatch):
    """aio_torch is what torch.compile(backend="aio") gives a user: its one strategy, whatever engines are
    installed; an ONNX file, which only the runtimes run, is refused in one line."""
    from aio_examples.backends import get_backend
    from aio_examples.core.errors import UnsupportedError

    monkeypatch.setattr(timing, "TUNING_CONTENDED_CORES", float("inf"))
    torch._dynamo.reset()       # graphs other tests compiled for this class at other batch sizes
    torch.manual_seed(0)
    model = Mlp().eval()
    inputs = (torch.randn(4, 32),)
    r = benchmark(model, example_inputs=inputs, backend="aio_torch", threads=1, num_runs=3)
    assert r.status == "ok" and r.strategy == "compiled", (r.reason, r.strategy)
    assert r.backend_info["tuning"]["strategy"] == "compiled" and not r.backend_info["tuning"]["refused"]
    assert r.backend_info["passes"]["merge_linear"]["linears_merged"] == 3 and r.check["passed"]
    onnx_file = torch.nn.Linear(2, 2)
    onnx_file.torch_graph, onnx_file.path = False, "model.onnx"     # a user's ONNX file, as the backends see it
    with pytest.raises(UnsupportedError, match="aio_torch compiles torch modules"):
        get_backend("aio_torch").prepare(onnx_file, inputs, "fp32", 1, None)
