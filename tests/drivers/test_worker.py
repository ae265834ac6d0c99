"""The worker protocol: what a driver builds is what its process parses, and one failure record for all."""

import argparse
import os

import pytest

from aio_examples.core import records as res
from aio_examples.core.errors import UsageError
from aio_examples.drivers.worker import parse_run_argv, record_failure, run_argv, scenario_of
from aio_examples.measurement.scenarios import TurnsScenario, WindowScenario
from aio_examples.models import get_model


def test_the_argument_list_a_driver_builds_parses_back_to_what_it_asked(tmp_path):
    options = {"backend": "onnxruntime", "precision": "bf16", "batch_size": 4, "threads": "2", "timeout": 2.5,
               "output": str(tmp_path), "point_id": "abc123", "probe": True, "json": True, "instance": "1/2",
               "barrier": str(tmp_path), "group": "g1", "num_runs": 7}
    argv = run_argv("bert_base", {"seq_len": 64}, **options)
    model, args = parse_run_argv(argv)
    assert model == "bert_base" and args.seq_len == 64 and args.input_size is None
    assert {name: getattr(args, name) for name in options} == options
    assert not parse_run_argv(run_argv("resnet_18", {}, probe=False))[1].probe      # False flags are left out
    with pytest.raises(UsageError, match="not a worker's argument list"):
        parse_run_argv(["-m", "aio_examples", "sweep"])


def test_the_flags_choose_the_scenario(tmp_path):
    _, window = parse_run_argv(run_argv("resnet_18", {}, instance="0/2", barrier=tmp_path, group="g"))
    assert isinstance(scenario_of(window), WindowScenario) and scenario_of(window).instances == 2
    _, plain = parse_run_argv(run_argv("resnet_18", {}))
    assert scenario_of(plain) is None          # the runner picks by the task: latency, or generation
    r, w = os.pipe()         # the scenario's pipe ends own them from here (and close them)
    _, turns = parse_run_argv(run_argv("resnet_18", {}, turns=f"{r},{w}"))
    taking_turns = scenario_of(turns)
    assert isinstance(taking_turns, TurnsScenario) and taking_turns.record() == {"name": "turns", "key": "latency",
                                                                                  "round_s": 1.0}
    with pytest.raises(UsageError, match="--instance '3/2' is invalid"):
        scenario_of(argparse.Namespace(instance="3/2", barrier=None, group=None, turns=None))
    _, served = parse_run_argv(run_argv("resnet_18", {}, instance="1/2", serve=str(tmp_path / "sut.sock"), group="g"))
    serving = scenario_of(served)           # an instance of a LoadGen system under test
    assert serving.name == "serve" and serving.instance() == {"index": 1, "of": 2, "group": "g"}


def test_a_point_that_never_wrote_its_record_gets_one_saying_why(tmp_path):
    spec = get_model("squeezenet")
    r = record_failure(tmp_path, spec, "inductor", "fp32", 1, 2, spec.shape(input_size=32), "timeout",
                       "timed out after 5 s and was killed", point_id="p1", allocator="tcmalloc")
    [back] = res.records_in(tmp_path)
    assert back.to_dict() == r.to_dict()
    assert (back.status, back.point_id, back.allocator, back.key().shape) == ("timeout", "p1", "tcmalloc", "input_size=32")
