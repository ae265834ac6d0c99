"""aio's split strategy: the graph cut where few tensors cross, each segment on the engine fastest on it, kept
only when the whole split is faster than the one engine chosen before."""

import json
import time
from pathlib import Path

import pytest
import torch
from conftest import run_cli

from aio_examples import benchmark
from aio_examples.backends import split
from aio_examples.backends.aio import settings
from aio_examples.core.errors import UnsupportedError
from aio_examples.measurement import runner, timing


class Layers(torch.nn.Module):
    """Four residual layers sharing a mask: two tensors cross every layer boundary, as in a transformer."""

    def __init__(self, width: int = 32, layers: int = 4):
        super().__init__()
        self.layers = torch.nn.ModuleList(torch.nn.Linear(width, width) for _ in range(layers))
        self.head = torch.nn.Linear(width, 5)

    def forward(self, x, mask):
        for layer in self.layers:
            x = x + torch.relu(layer(x)) * mask
        return self.head(x)


def inputs(batch: int = 3):
    torch.manual_seed(0)
    return torch.randn(batch, 32), (torch.rand(batch, 32) > 0.3).float()


def test_the_graph_is_cut_where_few_tensors_cross_and_its_segments_remake_the_model():
    torch.manual_seed(1)
    model, args = Layers().eval(), inputs()
    graph = split.export_graph(model, args)
    segments = graph.segments()
    assert len(segments) == split.SEGMENTS and len(graph.cut_names()) == split.SEGMENTS - 1
    assert segments[0].inputs == graph.inputs == ["x", "mask"]
    assert all(1 <= len(seg.inputs) <= split.MAX_CROSSING for seg in segments[1:])
    assert "mask" in segments[1].inputs and segments[-1].inputs == [segments[-2].outputs[-1]]   # none after the last use
    per = split.segment_inputs(graph, segments, [args])
    assert [len(p) for p in per] == [1] * len(segments)
    with torch.no_grad():
        env = dict(zip(graph.inputs, args, strict=True))
        for seg in segments:
            env.update(zip(seg.outputs, seg.module(*(env[n] for n in seg.inputs)), strict=True))
        assert torch.equal(graph.outputs(env), model(*args))
    assert len({s.digest for s in segments}) == len(segments)
    with pytest.raises(UnsupportedError, match="no point"):                # one GEMM: nowhere to cut
        split.export_graph(torch.nn.Linear(4, 2).eval(), (torch.randn(2, 4),))


@pytest.fixture
def split_on(monkeypatch, tmp_path):
    monkeypatch.setenv("AIO_TUNE_SPLIT", "1")
    monkeypatch.setenv("AIO_TUNE", "thorough")         # the stages after the choice: thorough tuning's
    monkeypatch.setenv("AIO_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(timing, "TUNING_CONTENDED_CORES", float("inf"))     # whatever else the machine runs now
    monkeypatch.setattr(timing, "TUNING_TIMEOUT_S", 1.0)
    monkeypatch.setattr(settings, "STRATEGIES", ("onnxruntime", "openvino"))


def handicapped(monkeypatch, slower: str):
    """Real timing, with a real 2 ms sleep added: to OpenVINO on even segments and ONNX Runtime on odd ones (so
    that each engine wins half of them), and to `slower` ("kept" or "split") when the split meets the whole."""
    real, calls = runner.time_passes, []

    def timed(passes, threads):
        calls.append(sorted(passes))
        segment = len(calls) - 2                        # the first call chooses among whole models
        slow = slower if "split" in passes else None if segment < 0 else ("openvino", "onnxruntime")[segment % 2]
        if slow in passes:
            fn = passes[slow]
            passes = {**passes, slow: lambda: (time.sleep(0.002), fn())[1]}
        return real(passes, threads)

    monkeypatch.setattr(runner, "time_passes", timed)
    return calls


def run():
    torch.manual_seed(2)
    return benchmark(Layers().eval(), example_inputs=inputs(), backend="aio", threads=1, num_runs=3)


@pytest.mark.slow       # a long end-to-end run: the second tier keeps the default one under 15 minutes
def test_a_split_that_wins_is_kept_checked_recorded_and_reused_from_the_cache(split_on, monkeypatch):
    calls = handicapped(monkeypatch, "kept")
    first = run()
    assert first.status == "ok", first.reason
    tuning = first.backend_info["tuning"]
    trial = tuning["split"]
    assert len(calls) == 2 + trial["segments"], calls          # the choice, each segment, the split against it
    assert trial["plan"] == ["onnxruntime", "openvino"] * (trial["segments"] // 2), trial
    assert trial["kept"] and trial["gain"] >= settings.KNOB_MIN_GAIN and trial["ms"]["split"] > 0
    assert first.strategy == "split" and tuning["whole_strategy"] in ("onnxruntime", "openvino")
    assert first.precision_mode.startswith("split (0: onnxruntime native, 1: openvino inference-precision-f32")
    assert [s["engine"] for s in first.backend_info["segments"]] == trial["plan"]
    assert first.check["passed"], first.check            # the split's outputs against eager fp32
    saved = json.loads(Path(tuning["file"]).read_text())
    assert saved["strategy"] == "split" and saved["split"]["plan"] == trial["plan"]
    monkeypatch.setattr(runner, "time_passes", timing.time_passes)
    again = run()
    assert again.status == "ok" and again.strategy == "split" and again.backend_info["tuning"]["cached"]
    assert [s["engine"] for s in again.backend_info["segments"]] == trial["plan"] and again.check["passed"]


@pytest.mark.slow
def test_a_split_slower_than_one_engine_is_not_kept(split_on, monkeypatch):
    handicapped(monkeypatch, "split")
    r = run()
    trial = r.backend_info["tuning"]["split"]
    assert r.status == "ok" and r.strategy in ("onnxruntime", "openvino") and not trial["kept"], trial
    assert trial["gain"] < 0 and trial["plan"] == ["onnxruntime", "openvino"] * (trial["segments"] // 2)
    assert json.loads(Path(r.backend_info["tuning"]["file"]).read_text())["strategy"] == r.strategy


def test_split_settings_are_checked_before_anything_runs():
    for var, bad in (("AIO_TUNE_SPLIT", "yes"), ("AIO_SPLIT_BUDGET_S", "-1")):
        proc = run_cli(["-m", "aio_examples", "run", "resnet_18", "--backend", "aio", "--timeout", "1"], env={var: bad})
        assert proc.returncode == 2 and proc.stderr.strip().count("\n") == 0, proc.stderr
        assert f"{var}={bad!r}" in proc.stderr and "accepted" in proc.stderr
