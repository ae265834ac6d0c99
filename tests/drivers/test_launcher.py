"""Each configuration in a process of its own (drivers/launcher.py), with real crashes: a module whose forward
sends its own process SIGSEGV at bf16 and calls os.abort() at fp16, run through `run`, `benchmark()` and a sweep.
The caller lives, the crashed configurations get records naming their signal, and the others are measured."""

import json
import os
import sys
import textwrap

import psutil
import pytest
import torch
from conftest import run_cli

from aio_examples import benchmark
from aio_examples.drivers.launcher import Config, configs_of, groups
from aio_examples.models import get_model

CRASHING = textwrap.dedent('''
    import os
    import signal

    import torch


    class CrashAt(torch.nn.Module):
        """A small linear layer that kills its own process when fed bf16 (SIGSEGV) or fp16 (abort)."""

        def __init__(self):
            super().__init__()
            self.linear = torch.nn.Linear(8, 4)

        def forward(self, x):
            if x.dtype == torch.bfloat16:
                os.kill(os.getpid(), signal.SIGSEGV)
            if x.dtype == torch.float16:
                os.abort()
            return self.linear(x)
''')


@pytest.fixture
def crashing(tmp_path, monkeypatch):
    """(the module's class, a .pt file holding one, the environment that can import its class)."""
    folder = tmp_path / "code"
    folder.mkdir()
    (folder / "crashing_module.py").write_text(CRASHING)
    monkeypatch.syspath_prepend(str(folder))
    import crashing_module

    path = tmp_path / "crash.pt"
    torch.save(crashing_module.CrashAt().eval(), path)
    env = {"PYTHONPATH": f"{folder}:{os.environ.get('PYTHONPATH', '')}"}
    yield crashing_module.CrashAt, path, env
    sys.modules.pop("crashing_module", None)


def records(out) -> dict:
    return {r["precision"]: r for r in map(json.loads, (out / "results.jsonl").read_text().splitlines())}


def _check_crashes(by_precision: dict, phase: bool = True) -> None:
    assert by_precision["fp32"]["status"] == "ok", by_precision["fp32"]["reason"]
    for precision, signal_name in (("bf16", "SIGSEGV"), ("fp16", "SIGABRT")):
        r = by_precision[precision]
        assert r["status"] == "crashed" and signal_name in r["reason"], r
        assert r["crash"]["signal"] == signal_name and r["crash"]["returncode"] < 0
        assert isinstance(r["crash"]["stderr_tail"], list)
        assert r["crash"]["phase"] == "preparing" if phase else r["crash"]["phase"] is None    # a sweep's: unknown


def test_run_records_each_crash_and_measures_the_rest(crashing, tmp_path):
    _, path, env = crashing
    out = tmp_path / "run"
    proc = run_cli(["-m", "aio_examples", "run", str(path), "--input-shape", "2x8", "-p", "fp32,bf16,fp16",
                    "--backend", "eager", "-t", "1", "--num-runs", "20", "--output", str(out)], env=env)
    assert proc.returncode == 3, proc.stderr[-2000:]            # measured, but a configuration crashed
    by_precision = records(out)
    _check_crashes(by_precision)
    assert len({r["run_id"] for r in by_precision.values()}) == 1
    assert "crashed" in proc.stdout and "SIGSEGV" in proc.stdout


def test_benchmark_survives_a_module_that_crashes_its_process(crashing, tmp_path):
    module_class, _, _ = crashing
    module = module_class().eval()
    by_precision = {p: benchmark(module, example_inputs=(torch.randn(2, 8),), precision=p, threads=1, num_runs=10,
                                 output=tmp_path).to_dict() for p in ("bf16", "fp16", "fp32")}
    _check_crashes(by_precision)
    assert records(tmp_path).keys() == by_precision.keys()          # each appended to the output too


@pytest.mark.slow       # the same crash isolation as a run's (above), through a sweep
def test_a_sweep_records_each_crash_and_measures_the_rest(crashing, tmp_path):
    _, path, env = crashing
    out = tmp_path / "sweep"
    proc = run_cli(["-m", "aio_examples", "sweep", str(path), "--input-shape", "2x8", "--backends", "eager",
                    "--precisions", "fp32,bf16,fp16", "--threads", "1", "--timeout", "0.5", "--quiet",
                    "--output", str(out)], env=env)
    assert proc.returncode == 0, proc.stderr[-2000:]
    _check_crashes(records(out), phase=False)


@pytest.mark.slow      # four inductor runs, each a process of its own: 40 s, the default tier's longest
def test_benchmark_gives_back_the_memory_of_each_call(tmp_path):
    """Four inductor runs of one model in the calling process: it grows by the first call's libraries at
    most, not by each compiled graph's weights."""
    def call():
        r = benchmark("resnet_18", backend="inductor", input_size=64, threads=1, num_runs=5)
        assert r.status == "ok", r.reason
        return psutil.Process().memory_info().rss

    rss = [call() for _ in range(4)]
    assert rss[3] - rss[1] <= 100 * 2**20, rss


def test_configurations_that_do_not_fit_together_are_measured_in_groups():
    spec = get_model("llama_3_2_1b")
    configs = configs_of(spec, ["eager", "inductor"], ["bf16", "int8"], 1, spec.shape(), reference=True)
    assert [c.label for c in configs] == ["eager/fp32", "eager/bf16", "inductor/bf16", "eager/int8", "inductor/int8"]
    alone = max(c.memory for c in configs)
    assert all(c.memory > spec.weight_bytes() for c in configs)         # each holds the built model at least
    assert groups(configs, sum(c.memory for c in configs)) == [configs]
    parts = groups(configs, 2.5 * alone)
    assert len(parts) > 1 and [c for g in parts for c in g] == configs
    assert all(sum(c.memory for c in g) <= 2.5 * alone for g in parts)
    assert groups([Config("a", "fp32", 10.0), Config("b", "fp32", 10.0)], 5.0) == [[Config("a", "fp32", 10.0)],
                                                                                   [Config("b", "fp32", 10.0)]]
