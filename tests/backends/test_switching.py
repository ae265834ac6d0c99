"""The switching pass: runs whichever engine is fastest now, and follows the lead when it changes."""

import time

import numpy as np
import torch

from aio_examples.backends import Prepared
from aio_examples.backends.switching import MAX_PROBE_EVERY, PROBE_EVERY, RACE_BEHIND_EVERY, SwitchingPass, switching


class Engine:
    """A pass that spins for `ms` (changed while running) and returns its name and input."""

    def __init__(self, name: str, ms: float):
        self.name, self.ms = name, ms

    def __call__(self, x):
        end = time.perf_counter() + self.ms / 1000
        while time.perf_counter() < end:
            pass
        return self.name, x


def run(p: SwitchingPass, passes: int) -> list[str]:
    return [p(("a",), ("b",))[0] for _ in range(passes)]


def test_it_moves_to_the_engine_that_is_faster_now_and_back_when_the_lead_changes():
    slow, fast = Engine("slow", 1.0), Engine("fast", 0.3)
    stats = {}
    p = SwitchingPass(["slow", "fast"], [slow, fast], stats)
    ran = run(p, 200)
    assert ran[-50:].count("fast") >= 45, ran[-50:]          # the leader now, but for a probe of the other
    assert stats["leader"] == "fast" and stats["switches"] >= 1
    slow.ms, fast.ms = 0.3, 1.0                              # the two trade places mid-run
    ran = run(p, 400)
    assert ran[-50:].count("slow") >= 45, ran[-50:]
    assert stats["leader"] == "slow" and stats["switches"] >= 2
    assert sum(stats["passes"].values()) == 600 and stats["engines"] == ["slow", "fast"]
    # what the record's strategy says: the engines that ran, most passes first, with their shares
    most, least = sorted(stats["passes"], key=stats["passes"].get, reverse=True)
    assert p.shares() == f"{most} {100 * stats['passes'][most] / 600:.0f}%+{least} " \
        f"{100 * stats['passes'][least] / 600:.0f}%", (p.shares(), stats)


def test_the_strategy_names_one_engine_alone_when_no_other_ran():
    p = SwitchingPass(["a", "b"], [Engine("a", 0.0), Engine("b", 0.2)], {})
    run(p, PROBE_EVERY - 1)
    assert p.shares() == "a"
    run(p, 1000)
    assert p.shares().startswith("a ") and "+b " in p.shares(), p.shares()


def test_an_engine_clearly_slower_is_probed_less_and_less():
    stats = {}
    p = SwitchingPass(["fast", "slow"], [Engine("fast", 0.1), Engine("slow", 0.6)], stats)
    run(p, 3000)
    assert stats["leader"] == "fast"
    # probed every PROBE_EVERY passes throughout, the slow one would have run 2 passes in 17: about 350
    assert stats["passes"]["slow"] < 3000 * 2 / (PROBE_EVERY + 2) / 3, stats
    assert p._every[1] > PROBE_EVERY and p._every[1] <= MAX_PROBE_EVERY


def test_a_race_just_run_sets_where_it_starts_but_not_where_it_ends():
    """An engine the race found far behind is not probed for RACE_BEHIND_EVERY passes; when the race was misled
    (the engine it put behind is the faster one now), the pass still moves to it."""
    stats = {}
    p = SwitchingPass(["a", "b"], [Engine("a", 0.2), Engine("b", 0.4)], stats, {"a": 0.2, "b": 0.4})
    ran = run(p, 1000)
    assert set(ran[:RACE_BEHIND_EVERY - 1]) == {"a"}
    # and, staying behind, probed at longer and longer intervals from there (64, 64, 128, 256: four probes of two
    # passes in 1000; one more for a probe that noise made look close)
    assert stats["passes"]["b"] <= 2 * 5, stats
    stats = {}
    p = SwitchingPass(["a", "b"], [Engine("a", 1.0), Engine("b", 0.3)], stats, {"a": 0.3, "b": 1.0})
    ran = run(p, RACE_BEHIND_EVERY + 200)
    assert stats["leader"] == "b" and ran[-50:].count("b") >= 45, ran[-50:]


def test_each_engine_gets_its_own_inputs_and_the_output_of_the_one_that_ran():
    """As a Prepared: inputs in each engine's own form (here torch for one, numpy for the other), fed alike."""
    seen = []
    torch_engine = Prepared(lambda x: seen.append(("torch", type(x))) or x * 2, (torch.ones(3),), "native",
                            {"strategy": "compiled"})
    numpy_engine = Prepared(lambda x: seen.append(("numpy", type(x))) or x * 2, (np.ones(3, np.float32),),
                            "inference-precision-f32", {"strategy": "onnxruntime"},
                            convert=lambda t: tuple(a.numpy() for a in t))
    stats = {}
    p = switching({"compiled": torch_engine, "onnxruntime": numpy_engine}, "onnxruntime", stats)
    assert stats["engines"] == ["onnxruntime", "compiled"] and p.info["strategy"] == "onnxruntime"
    assert p.strategy_ran() == "onnxruntime"            # before any pass: the leader
    # the record names both modes its passes ran in, the leader's first
    assert p.precision_mode == "inference-precision-f32+native", p.precision_mode
    assert stats["precision_modes"] == {"onnxruntime": "inference-precision-f32", "compiled": "native"}
    for _ in range(100):
        out = p.fn(*p.inputs)
        assert np.allclose(np.asarray(out), 2.0)
    assert {kind for kind, _ in seen} == {"torch", "numpy"}                 # both ran (probes at least)
    assert set(seen) == {("torch", torch.Tensor), ("numpy", np.ndarray)}    # each in its own form
    fed = p.feed((torch.full((3,), 5.0),))
    assert isinstance(fed[0][0], np.ndarray) and isinstance(fed[1][0], torch.Tensor) and fed[0][0][0] == 5.0
