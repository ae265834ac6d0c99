"""benchmarks/agreement.py's side of the engines' own tools: each run for real on a tiny artefact, its output read,
and a tool that ran with other settings than the harness's (or not at all) refused with what differed."""

import os
import shutil
import subprocess
import sys

import pytest
from conftest import ROOT

sys.path.insert(0, str(ROOT / "benchmarks"))
import agreement  # benchmarks/ is scripts, not a package

needs_benchmark_app = pytest.mark.skipif(shutil.which("benchmark_app") is None, reason="benchmark_app is not on PATH")


@pytest.fixture(scope="module")
def tiny_ir(tmp_path_factory):
    """An OpenVINO IR of one convolution on a (1, 3, 16, 16) f32 image."""
    import numpy as np
    import openvino as ov
    import openvino.opset13 as ops

    image = ops.parameter([1, 3, 16, 16], np.float32, name="image")
    conv = ops.convolution(image, ops.constant(np.ones((4, 3, 3, 3), np.float32)), [1, 1], [0, 0], [0, 0], [1, 1])
    xml = tmp_path_factory.mktemp("ir") / "model.xml"
    ov.save_model(ov.Model([ops.relu(conv)], [image]), str(xml), compress_to_fp16=False)
    return xml


@pytest.fixture(scope="module")
def benchmark_app_log(tiny_ir, tmp_path_factory):
    """benchmark_app's log of a one-second run, with the settings the agreement benchmark gives it."""
    tool = agreement.BenchmarkApp({"backend_info": {"ir": str(tiny_ir), "precision_hint_read_back": "f32"}},
                                  threads=2, seconds=1, scratch=tmp_path_factory.mktemp("scratch"))
    done = subprocess.run(tool.argv, capture_output=True, text=True, check=False, timeout=120)
    return tool, done.stdout + done.stderr


@needs_benchmark_app
def test_benchmark_app_is_read_with_the_backends_settings_pinned(benchmark_app_log):
    tool, log = benchmark_app_log
    parsed = agreement.parse_benchmark_app(log)
    assert parsed["median_ms"] > 0 and parsed["count"] >= 1
    agreement.check_properties(parsed["properties"], tool.expected)        # threads, streams, f32, latency hint
    # the image stays f32 as in the IR (benchmark_app would feed it as u8 otherwise)
    assert "image (node: image) : f32" in log.split("Configuring input of the model")[1]


@needs_benchmark_app
def test_benchmark_app_with_other_settings_is_refused(benchmark_app_log):
    tool, log = benchmark_app_log
    properties = agreement.parse_benchmark_app(log)["properties"]
    with pytest.raises(agreement.ToolError, match=r"INFERENCE_NUM_THREADS 2 \(the harness: 1\)"):
        agreement.check_properties(properties, {**tool.expected, "INFERENCE_NUM_THREADS": "1"})
    with pytest.raises(agreement.ToolError, match=r"INFERENCE_PRECISION_HINT <Type: 'float32'> \(the harness: "
                                                  r"<Type: 'bfloat16'>\)"):
        agreement.check_properties(properties, {**tool.expected, "INFERENCE_PRECISION_HINT": "bf16"})


@needs_benchmark_app
def test_a_benchmark_app_that_did_not_measure_says_why(tmp_path):
    done = subprocess.run(["benchmark_app", "-m", str(tmp_path / "missing.xml"), "-t", "1"], capture_output=True,
                          text=True, check=False, timeout=120)
    with pytest.raises(agreement.ToolError, match="benchmark_app printed no median latency: ir: Could not open the file: .*missing.xml"):
        agreement.parse_benchmark_app(done.stdout + done.stderr)


def test_onnx_runtime_times_its_run_loop_with_the_backends_session(tmp_path):
    import onnx
    from onnx import TensorProto, helper

    from aio_examples.backends.onnxruntime import make_session, session_info

    graph = helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], "tiny",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 64])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 64])])
    path = tmp_path / "model.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), str(path))
    expected = session_info(make_session(path, 2))
    runs = agreement.ort_run_loop(path, 2, 0.2, expected)
    assert len(runs) >= 10 and all(ms > 0 for ms in runs)
    with pytest.raises(agreement.ToolError, match="are not the harness's"):
        agreement.ort_run_loop(path, 1, 0.1, expected)            # one intra-op thread, the harness's two


def test_llama_bench_output_that_is_not_its_json_says_why():
    with pytest.raises(agreement.ToolError, match="llama-bench printed no JSON: error: unknown argument: --bogus"):
        agreement.parse_llama_bench("", "error: unknown argument: --bogus\n")


def test_build_script_says_why_it_cannot_build(tmp_path):
    script = ROOT / "scripts" / "build_llama_bench.sh"
    env = {**os.environ, "PYTHON": sys.executable, "AIO_CACHE_DIR": str(tmp_path)}
    done = subprocess.run(["bash", str(script), "--cached"], capture_output=True, text=True, env=env, check=False)
    assert done.returncode == 1 and "no llama-bench built for llama-cpp-python" in done.stderr
    done = subprocess.run(["bash", str(script), "--bogus"], capture_output=True, text=True, env=env, check=False)
    assert done.returncode == 2 and "unknown argument '--bogus'; accepted: --cached, --help" in done.stderr


@pytest.mark.slow       # builds llama-bench once per machine (minutes), kept where the benchmark keeps it
def test_llama_bench_runs_the_harness_gguf_with_its_settings(tmp_path, monkeypatch):
    from aio_examples.machine.threads import ThreadChoice
    from aio_examples.measurement.runner import RunRequest, run
    from aio_examples.measurement.timing import StopRule
    from aio_examples.models import get_model

    spec = get_model("llama_3_2_1b").with_config(
        ["num_hidden_layers=2", "hidden_size=128", "intermediate_size=256", "num_attention_heads=4",
         "num_key_value_heads=2", "head_dim=32", "vocab_size=512"])
    record = run(RunRequest(spec, ["llama_cpp"], ["int4"], 1, ThreadChoice(1, "--threads"),
                            spec.shape(seq_len=16, new_tokens=6), rule=StopRule(timeout_s=0.5)), tmp_path)[0]
    assert record.status == "ok", record.reason
    monkeypatch.delenv("AIO_CACHE_DIR")          # the build: once per machine, in the user's cache
    tool = agreement.LlamaBench(record.to_dict(), threads=1, seconds=0, scratch=tmp_path)
    figures = tool.round()
    assert len(figures["prefill"]) == 1 and len(figures["decode"]) == 1
    assert figures["prefill"][0] > 0 and figures["decode"][0] > 0
    pp = tool.run("-p", "16", "-n", "0")         # what it ran: the record's settings
    assert (pp["n_batch"], pp["n_threads"], pp["flash_attn"], pp["type_k"]) == (16, 1, 0, "f16")
    assert pp["model_filename"] == record.backend_info["file"] and pp["repack"] == record.backend_info[
        "extra_buffer_types"]
