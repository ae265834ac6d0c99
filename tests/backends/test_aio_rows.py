"""aio's rows stage: the model rewritten to compute only the rows its output reads (aio_compile/rows.py), timed
on the chosen strategy against the model as built, kept only when it wins, and reused from the cache."""

import json
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from conftest import handicap, run_cli

from aio_examples import benchmark
from aio_examples.backends.aio import choose, settings
from aio_examples.measurement import runner, timing


class Classifier(torch.nn.Module):
    """One transformer block and a head on the first token: most of the block's GEMM work feeds rows the
    head never reads."""

    def __init__(self, width: int = 64, heads: int = 4):
        super().__init__()
        self.heads = heads
        self.qkv, self.out = torch.nn.Linear(width, 3 * width), torch.nn.Linear(width, width)
        self.up, self.down = torch.nn.Linear(width, 4 * width), torch.nn.Linear(4 * width, width)
        self.norm, self.head = torch.nn.LayerNorm(width), torch.nn.Linear(width, 4)

    def forward(self, x):
        b, s, w = x.shape
        q, k, v = self.qkv(x).view(b, s, 3, self.heads, w // self.heads).permute(2, 0, 3, 1, 4)
        x = x + self.out(F.scaled_dot_product_attention(q, k, v).transpose(1, 2).reshape(b, s, w))
        x = self.norm(x + self.down(F.gelu(self.up(x))))
        return self.head(x[:, 0])


@pytest.fixture
def rows_on(monkeypatch, tmp_path):
    monkeypatch.setenv("AIO_TUNE_ROWS", "1")
    monkeypatch.setenv("AIO_TUNE", "thorough")         # the stages after the choice: thorough tuning's
    monkeypatch.setenv("AIO_TUNE_KNOBS", "0")
    monkeypatch.setenv("AIO_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(timing, "TUNING_CONTENDED_CORES", float("inf"))     # whatever else the machine runs now
    monkeypatch.setattr(timing, "TUNING_ROUND_S", 0.2)
    monkeypatch.setattr(settings, "STRATEGIES", ("openvino",))


def run():
    torch.manual_seed(0)
    return benchmark(Classifier().eval(), example_inputs=(torch.randn(1, 64, 64),), backend="aio", threads=1,
                     num_runs=3)


def test_the_rewrite_that_wins_is_kept_checked_recorded_and_reused_from_the_cache(rows_on, monkeypatch):
    handicap(monkeypatch)
    first = run()
    assert first.status == "ok", first.reason
    trial = first.backend_info["tuning"]["rows"]
    assert trial["kept"] and trial["again"]["kept"] and trial["ops_narrowed"] >= 5, trial
    assert trial["ms"]["rows read"] < trial["ms"]["all rows"]
    assert "only the rows the output reads" in first.backend_info["rows"]
    assert first.check["passed"], first.check            # against eager fp32 of the model as built
    saved = json.loads(Path(first.backend_info["tuning"]["file"]).read_text())
    assert saved["rows"]["kept"] and saved["strategy"] == "openvino"
    monkeypatch.setattr(runner, "time_passes", timing.time_passes)
    monkeypatch.setenv("AIO_RACE_CLOSE", "0")       # the cached decision as it is, not raced again
    again = run()
    assert again.status == "ok" and again.backend_info["tuning"]["cached"], again.backend_info
    assert again.backend_info["rows"] == first.backend_info["rows"] and again.check["passed"]
    monkeypatch.setenv("AIO_TUNE_ROWS", "0")         # the model as built: its own IR, beside the rewritten one's
    plain = run()
    assert plain.status == "ok" and "rows" not in plain.backend_info["tuning"] and "rows" not in plain.backend_info
    assert plain.backend_info["ir"] != again.backend_info["ir"] == first.backend_info["ir"]


def test_a_rewrite_that_loses_is_not_kept(rows_on, monkeypatch):
    handicap(monkeypatch, lambda passes: "rows" if "rows" in passes else None)
    r = run()
    trial = r.backend_info["tuning"]["rows"]
    assert r.status == "ok" and not trial["kept"] and trial["gain"] < 0, trial
    assert "rows" not in r.backend_info and r.check["passed"]
    assert not json.loads(Path(r.backend_info["tuning"]["file"]).read_text())["rows"]["kept"]


def test_the_rows_setting_is_checked_before_anything_runs():
    proc = run_cli(["-m", "aio_examples", "run", "resnet_18", "--backend", "aio", "--timeout", "1"],
                   env={"AIO_TUNE_ROWS": "yes"})
    assert proc.returncode == 2 and proc.stderr.strip().count("\n") == 0, proc.stderr
    assert "AIO_TUNE_ROWS='yes'" in proc.stderr and "accepted" in proc.stderr


def test_strategies_close_to_the_fastest_take_their_own_stages_and_race_again():
    medians = {"openvino": 10.0, "onnxruntime": 10.4, "compiled": 12.0}
    assert choose.finalists("openvino", medians) == ["openvino", "onnxruntime"]
    assert choose.finalists("openvino", {**medians, "onnxruntime": 10.6}) == ["openvino"]


@pytest.mark.slow       # the default tier stays under 15 minutes
def test_a_runner_up_that_wins_once_tuned_is_kept_with_its_own_stages(rows_on, monkeypatch):
    """Every strategy a finalist; the first timing (the choice) puts ONNX Runtime ahead, the final (the same
    two names again) OpenVINO: the decision is OpenVINO's, with its own rows trial, and the cache reuses it."""
    monkeypatch.setattr(settings, "STRATEGIES", ("onnxruntime", "openvino"))
    monkeypatch.setattr(settings, "FINALIST_MARGIN", float("inf"))
    whole = []

    def slowed(passes):
        if set(passes) != {"onnxruntime", "openvino"}:
            return None
        whole.append(1)
        return "openvino" if len(whole) == 1 else "onnxruntime"

    handicap(monkeypatch, slowed)
    r = run()
    assert r.status == "ok" and len(whole) == 2, r.reason
    tuning = r.backend_info["tuning"]
    assert r.strategy == "openvino" == tuning["finalists"]["chosen"], tuning
    assert tuning["finalists"]["medians_ms"]["openvino"] < tuning["finalists"]["medians_ms"]["onnxruntime"]
    assert "rows" in tuning["finalists"]["onnxruntime"] and tuning["rows"]["ops_narrowed"] >= 5
    assert r.check["passed"]
    assert json.loads(Path(tuning["file"]).read_text())["strategy"] == "openvino"
    monkeypatch.setattr(runner, "time_passes", timing.time_passes)
    monkeypatch.setenv("AIO_RACE_CLOSE", "0")       # the cached decision as it is, not raced again
    again = run()
    assert again.strategy == "openvino" and again.backend_info["tuning"]["cached"]
