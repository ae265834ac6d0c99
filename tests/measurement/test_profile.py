"""--profile: profiled passes after the timed ones, per backend with its own profiler, op categories, the
top ops, traces beside the results, and the report's section."""

import json
from pathlib import Path

import pytest
from conftest import ROOT, run_cli

from aio_examples.core.records import load_records
from aio_examples.measurement.profile import NAMES, category


@pytest.mark.parametrize(("op", "expected"), [
    ("aten::mkldnn_convolution", "convolution"), ("mkldnn::_convolution_pointwise_", "convolution"),
    ("FusedConv", "convolution"), ("Convolution (brgconv_avx512_f32)", "convolution"),
    ("aten::addmm", "matmul/linear"), ("aten::mm", "matmul/linear"), ("FullyConnected (gemm_mlas_f32)", "matmul/linear"),
    ("aten::scaled_dot_product_attention", "attention"), ("Softmax", "attention"),
    ("aten::native_layer_norm", "normalization"), ("MVN (jit_avx512_f32)", "normalization"),
    ("aten::relu_", "element-wise"), ("Add", "element-wise"), ("## Call CompiledFxGraph None ##", "element-wise"),
    ("Convert (unknown)", "data movement"), ("Reorder (jit_uni_f32)", "data movement"), ("aten::t", "data movement"),
    ("TorchDynamo Cache Lookup", "other"),
])
def test_ops_fall_in_their_category(op, expected):
    assert category(op) == expected


@pytest.mark.slow       # a long end-to-end run: the second tier keeps the default one under 15 minutes
def test_run_py_profiles_each_backend_with_its_own_profiler(tmp_path):
    out = tmp_path / "res"
    proc = run_cli(["run.py", "--profile", "--backend", "eager,onnxruntime,openvino", "--input-size", "32",
                    "--timeout", "1", "-t", "1", "--output", str(out)], cwd=ROOT / "classification" / "resnet_18")
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "profile (separate passes after timing" in proc.stdout and "top ops, onnxruntime/fp32" in proc.stdout
    records = {r.backend: r for r in load_records(out / "results.jsonl")}
    tools = {"eager": "torch.profiler", "onnxruntime": "onnxruntime session profiling",
             "openvino": "openvino performance counters"}
    for backend, r in records.items():
        p = r.metrics["profile"]
        assert p["tool"] == tools[backend] and p["outside_timing"] and p["passes"] == 5
        assert sum(p["categories_share"].values()) == pytest.approx(1.0)
        assert p["categories_share"]["other"] < 0.05            # the categories cover the time
        assert max(p["categories_share"], key=p["categories_share"].get) == "convolution"      # a ResNet
        # at a 32x32 input the classifier's matrix product can outweigh any single convolution row
        assert any(t["category"] == "convolution" for t in p["top"][:3]) and p["op_calls"] >= len(p["top"])
        assert [t["self_ms"] for t in p["top"]] == sorted((t["self_ms"] for t in p["top"]), reverse=True)
        assert len(r.samples_ms) == r.latency_ms["n"]           # the timed passes alone
    for backend in ("eager", "onnxruntime"):                    # the Chrome traces the field opens
        trace = json.loads(Path(records[backend].metrics["profile"]["trace"]).read_text())
        events = trace["traceEvents"] if isinstance(trace, dict) else trace
        assert len(events) > 10
    assert any(t["op"].startswith("Convolution (") for t in records["openvino"].metrics["profile"]["top"])  # kernel
    report = run_cli(["-m", "aio_examples", "report", str(out), "--output", str(tmp_path / "report")])
    assert report.returncode == 0, report.stderr
    page = (tmp_path / "report" / "report.html").read_text()
    assert "Where the time goes (profiles)" in page and page.count("Top ops:") == 3
    assert all(n in page for n in NAMES)
    assert (tmp_path / "report" / "plots" / "profile-categories.png").stat().st_size > 1000


def test_the_profile_command_is_run_with_profile(tmp_path):
    proc = run_cli(["-m", "aio_examples", "profile", "resnet_18", "--backends", "eager", "--input-size", "32",
                    "--timeout", "1", "-t", "1", "--output", str(tmp_path)])
    assert proc.returncode == 0, proc.stderr[-2000:]
    [r] = load_records(tmp_path / "results.jsonl")
    assert r.backend == "eager" and r.metrics["profile"]["tool"] == "torch.profiler"
    assert "top ops, eager/fp32" in proc.stdout
