"""aio's knob stage: each setting of the chosen strategy timed against the ones kept, kept only when it wins."""

import json
from pathlib import Path

import pytest
import torch
from conftest import handicap

from aio_examples import benchmark
from aio_examples.backends.aio import backend, settings
from aio_examples.backends.base import PrepareContext
from aio_examples.backends.openvino import OpenVinoBackend
from aio_examples.core.errors import UnsupportedError
from aio_examples.measurement import runner, timing


class Mlp(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.a, self.b = torch.nn.Linear(32, 64), torch.nn.Linear(64, 8)

    def forward(self, x):
        return self.b(torch.relu(self.a(x)))


@pytest.fixture
def knobs_on(monkeypatch, tmp_path):
    monkeypatch.setenv("AIO_TUNE_KNOBS", "1")
    monkeypatch.setenv("AIO_TUNE", "thorough")         # the stages after the choice: thorough tuning's
    monkeypatch.setenv("AIO_CACHE_DIR", str(tmp_path))        # no decision of another test is reused
    monkeypatch.setattr(timing, "TUNING_CONTENDED_CORES", float("inf"))     # whatever else the machine runs now
    monkeypatch.setattr(timing, "TUNING_ROUND_S", 0.2)    # shorter rounds: a 2 ms handicap on a tiny MLP is clear


def run(seed: int, batch: int = 4, precision: str = "fp32"):
    torch.manual_seed(seed)
    return benchmark(Mlp().eval(), example_inputs=(torch.randn(batch, 32),), backend="aio", threads=1, num_runs=3,
                     precision=precision)


@pytest.mark.slow       # the default tier stays under 15 minutes
def test_each_knob_of_the_chosen_strategy_is_timed_and_kept_only_where_it_wins(knobs_on, monkeypatch):
    monkeypatch.setattr(settings, "STRATEGIES", ("onnxruntime",))
    r = run(0)
    assert r.status == "ok", r.reason
    tuning = r.backend_info["tuning"]
    trials = tuning["knob_trials"]
    assert list(trials) == [name for name, _ in settings.KNOBS["onnxruntime"]]
    for name, trial in trials.items():
        assert trial["ms"]["without"] > 0 and trial["ms"]["with"] > 0, trial
        wins = trial["quiet"] and trial["clear"] and trial["gain"] >= settings.KNOB_MIN_GAIN
        if wins:        # a first win stands only if it wins again against a fresh instance of the kept settings
            again = trial["again"]
            wins = "not_tried" in again or again["kept"]
        assert trial["kept"] == wins, (name, trial)
    assert tuning["knobs"] == {n: t["value"] for n, t in trials.items() if t["kept"]}
    session = r.backend_info["session"]        # what the session read back: the knobs kept, and only those
    assert (session["graph_optimization_level"] == "ORT_ENABLE_EXTENDED") == ("graph_optimization" in tuning["knobs"])
    assert (session["allow_spinning"] == "0") == ("allow_spinning" in tuning["knobs"])
    assert (session["dynamic_block_base"] == "4") == ("dynamic_block_base" in tuning["knobs"])
    assert 0 < tuning["knob_tuning_s"] <= tuning["tuning_s"]


def test_a_quick_tuning_tries_only_its_quick_knobs_on_its_choice(knobs_on, monkeypatch):
    """The default tuning tries io_binding alone (a win here: the settings kept so far are handicapped), and says
    it was quick; the knobs it left out are not in its trials."""
    monkeypatch.setenv("AIO_TUNE", "quick")
    monkeypatch.setattr(settings, "STRATEGIES", ("onnxruntime", "openvino"))
    handicap(monkeypatch)
    r = run(3)
    tuning = r.backend_info["tuning"]
    assert r.status == "ok" and tuning["mode"] == "quick", r.reason
    assert list(tuning["knob_trials"]) == list(settings.QUICK_KNOBS)
    assert tuning["knobs"] == {"io_binding": True} and r.strategy.split(" ")[0] == tuning["strategy"]
    assert json.loads(Path(tuning["file"]).read_text())["mode"] == "quick"


@pytest.mark.slow      # tunes, then runs again from the cache: 20 s
def test_a_knob_that_wins_is_kept_applied_and_reused_from_the_cache(knobs_on, monkeypatch):
    """With the defaults handicapped every knob trial wins: the first knob kept is applied to the next trial and
    to the run, and the decision cached with it is reused as it is."""
    monkeypatch.setattr(settings, "STRATEGIES", ("onnxruntime",))
    real = handicap(monkeypatch)
    first = run(1)
    tuning = first.backend_info["tuning"]
    assert tuning["knobs"] == dict(settings.KNOBS["onnxruntime"]), tuning["knob_trials"]
    assert all(t["again"]["kept"] for t in tuning["knob_trials"].values())     # and again, on a fresh instance
    assert first.backend_info["session"]["allow_spinning"] == "0"
    assert first.backend_info["session"]["graph_optimization_level"] == "ORT_ENABLE_EXTENDED"
    assert first.backend_info["session"]["dynamic_block_base"] == "4"
    assert first.check["passed"]
    saved = json.loads(Path(tuning["file"]).read_text())
    assert saved["knobs"] == tuning["knobs"] and saved["strategy"] == "onnxruntime"
    monkeypatch.setattr(runner, "time_passes", real)
    again = run(1)
    assert again.backend_info["tuning"]["cached"] and again.backend_info["tuning"]["knobs"] == tuning["knobs"]
    assert again.backend_info["session"]["allow_spinning"] == "0" and again.check["passed"]


# The slow tier: a knob tuning confirmed in a fresh instance; the quick knobs' own test stays in the default tier
@pytest.mark.slow
def test_a_win_that_a_fresh_instance_does_not_confirm_is_not_kept(knobs_on, monkeypatch):
    """Each knob wins its first trial (the kept settings handicapped), then loses against a fresh instance of the
    kept settings (the knob's instance handicapped): nothing is kept, and the record says why. Two knobs are
    enough to show it (a trial and a fresh instance each)."""
    monkeypatch.setattr(settings, "STRATEGIES", ("onnxruntime",))
    monkeypatch.setitem(settings.KNOBS, "onnxruntime", settings.KNOBS["onnxruntime"][:2])
    seen = set()

    def first_won_then_lost(passes):
        if "kept" not in passes:
            return None
        (name,) = set(passes) - {"kept"}
        slow = "kept" if name not in seen else name
        seen.add(name)
        return slow

    handicap(monkeypatch, first_won_then_lost)
    tuning = run(6).backend_info["tuning"]
    trials = tuning["knob_trials"]
    assert tuning["knobs"] == {}, trials
    for trial in trials.values():
        assert trial["gain"] > 0.5 and not trial["kept"], trial                      # the first trial's win ...
        assert trial["again"]["gain"] < 0 and not trial["again"]["kept"], trial      # ... that did not hold


@pytest.mark.slow       # the default tier stays under 15 minutes
def test_knob_stage_off_tries_no_knob_and_keys_its_decision_apart(knobs_on, monkeypatch):
    monkeypatch.setattr(settings, "STRATEGIES", ("onnxruntime",))
    on = run(2).backend_info["tuning"]
    monkeypatch.setenv("AIO_TUNE_KNOBS", "0")
    off = run(2).backend_info["tuning"]
    assert "knob_trials" in on and "knob_trials" not in off
    assert not off["cached"] and off["file"] != on["file"]       # a decision without knobs is not the same one


def test_a_spent_budget_leaves_the_remaining_knobs_untried_and_says_so(knobs_on, monkeypatch):
    monkeypatch.setattr(settings, "STRATEGIES", ("openvino",))
    monkeypatch.setenv("AIO_KNOB_BUDGET_S", "0.5")
    trials = run(3).backend_info["tuning"]["knob_trials"]
    assert "ms" in trials["cpu_pinning"]          # the budget is checked before each trial: spent after the first
    assert "budget" in trials["denormals_optimization"]["not_tried"], trials
    assert "applies at int8" in trials["int8_mixed_bf16"]["not_tried"]      # what cannot apply says why instead


@pytest.mark.slow       # the default tier stays under 15 minutes
def test_a_knob_that_cannot_apply_is_refused_before_a_copy_is_made_for_it(knobs_on, monkeypatch):
    """At fp32 int8_mixed_bf16 cannot apply: it says why, and no copy of the model is made for its trial (one
    copy per timed trial and per fresh instance against it, none more)."""
    monkeypatch.setattr(settings, "STRATEGIES", ("openvino",))
    copies, real_copy = [], backend.AioBackend._copy
    monkeypatch.setattr(backend.AioBackend, "_copy",
                        lambda self, strategy, model, precision: copies.append(strategy)
                        or real_copy(self, strategy, model, precision))
    trials = run(7).backend_info["tuning"]["knob_trials"]
    assert trials["int8_mixed_bf16"]["not_tried"].startswith("int8_mixed_bf16 applies at int8"), trials
    timed = sum(("ms" in t) + ("ms" in t.get("again", {})) for t in trials.values())
    assert timed >= 2 and len(copies) == timed, (copies, trials)


@pytest.mark.slow          # NNCF quantizes for each trial: 20 s
def test_openvino_at_int8_may_run_the_rest_in_bf16_and_says_so(knobs_on, monkeypatch):
    """int8_mixed_bf16, on a CPU with native bf16: once kept, the record's precision_mode and the precision
    OpenVINO read back say so, and the output check (int8's tolerance) still passes. At fp32 it is refused."""
    import openvino as ov

    monkeypatch.setattr(settings, "STRATEGIES", ("openvino",))
    handicap(monkeypatch, lambda passes: "kept" if "int8_mixed_bf16" in passes else None)   # others as they are
    r = run(5, batch=16, precision="int8")           # at batch 4 OpenVINO runs these tiny GEMMs in fp32
    assert r.status == "ok" and r.check["passed"], r.reason
    trial = r.backend_info["tuning"]["knob_trials"]["int8_mixed_bf16"]
    if "BF16" in ov.Core().get_property("CPU", "OPTIMIZATION_CAPABILITIES"):
        assert trial["kept"] and r.backend_info["tuning"]["knobs"]["int8_mixed_bf16"] is True, trial
        assert r.precision_mode == "int8-nncf-ptq-mixed-bf16"
        assert r.backend_info["precision_hint_read_back"] == "bf16" and r.backend_info["rest_precision"] == "bf16"
        assert int(r.backend_info["int8_layers"].split()[0]) > 0       # the GEMMs still run int8
    else:
        assert "lacks" in trial["not_tried"] and r.precision_mode == "int8-nncf-ptq"
    ctx = PrepareContext(model_name="mlp", task="custom", family="custom", shape={}, batch_size=4,
                         weights_id="w", knobs={"int8_mixed_bf16": True})
    with pytest.raises(UnsupportedError, match="applies at int8 .* not at fp32"):
        OpenVinoBackend().prepare(Mlp().eval(), (torch.randn(4, 32),), "fp32", 1, ctx)


@pytest.mark.slow
def test_the_compiled_strategys_knobs_compile_and_keep_the_outputs_right(knobs_on, monkeypatch):
    """cpp_wrapper and max_autotune (inductor's C++ GEMM templates) really compiled; the layout knob refused for
    a model without convolutions."""
    monkeypatch.setattr(settings, "STRATEGIES", ("compiled",))
    r = run(4)
    assert r.status == "ok" and r.check["passed"], r.reason
    trials = r.backend_info["tuning"]["knob_trials"]
    assert "ms" in trials["cpp_wrapper"] and "ms" in trials["max_autotune"], trials
    assert "no Conv2d" in trials["channels_last"]["not_tried"]
    inductor = r.backend_info["passes"]["inductor"]
    assert inductor["cpp_wrapper"] == ("cpp_wrapper" in r.backend_info["tuning"]["knobs"])
