"""The scenario seam: the runner drives configurations through whatever scenario it is handed."""

import functools

from aio_examples.machine.threads import ThreadChoice
from aio_examples.measurement import timing
from aio_examples.measurement.runner import RunRequest, run
from aio_examples.measurement.scenarios import SCENARIOS, Scenario
from aio_examples.models import get_model


class OnePass(Scenario):
    """A scenario made here, as a new one would be: warm up, then exactly one measured pass each."""

    name = "one-pass"
    key = "one-pass"

    def params(self):
        return {"passes": 1}

    def measure(self, measurements, on_error, probe, timeout_s):
        for m in measurements:
            timing.guarded(m, m.warm_up, on_error)
            timing.guarded(m, functools.partial(m.run_for, 0.0, stop_rule=False), on_error)
            m.stop_reason = "one-pass"

    def annotate(self, result, measurement, task_size):
        result.metrics["one_pass_units"] = task_size


def request(**kw):
    spec = get_model("squeezenet")
    return RunRequest(spec, ["eager", "torchscript"], "fp32", 1, ThreadChoice(1, "--threads"), {"input_size": 32},
                      rule=timing.StopRule(timeout_s=0.5), **kw)


def test_a_new_scenario_drives_the_run_and_says_so_in_every_record(tmp_path):
    results = run(request(scenario=OnePass()), tmp_path)
    assert [r.status for r in results] == ["ok", "ok"]
    for r in results:
        assert r.scenario == {"name": "one-pass", "key": "one-pass", "passes": 1}
        assert r.key().scenario == "one-pass" and len(r.samples_ms) == 1 and r.stop_reason == "one-pass"
        assert r.metrics["one_pass_units"] == 1


def test_the_default_scenario_is_interleaved_latency_rounds(tmp_path):
    [eager, script] = run(request(), tmp_path)
    assert eager.scenario == {"name": "latency", "key": "latency"} and len(eager.samples_ms) > 1
    assert eager.key().ignoring(["backend"]) == script.key().ignoring(["backend"])


def test_the_registry_names_every_scenario_by_its_own_name():
    assert set(SCENARIOS) == {"latency", "generation", "turns", "window", "serve"}
    assert all(name == cls.name and cls.key for name, cls in SCENARIOS.items())
