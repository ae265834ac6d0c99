"""Real runs of resnet_18 at 32x32 in a fast-math mode: each record says the mode asked and the mode its engine
reads back (torch's settings and oneDNN's kernels, OpenVINO's compiled inference precision), is judged at bf16's
tolerances against a strict eager fp32 reference, and is a configuration of its own beside strict."""

import json
import platform

import pytest
from conftest import run_cli

from aio_examples import benchmark
from aio_examples.core import records as res
from aio_examples.machine import fpmath

needs_bf16 = pytest.mark.skipif("bf16" not in fpmath.accepted(fpmath.cpu_flags()),
                                reason="this CPU has no native bf16 arithmetic")
SMALL = ["resnet_18", "--input-size", "32", "-t", "1", "--num-runs", "5"]


def run(tmp_path, *flags) -> list[res.Result]:
    proc = run_cli(["-m", "aio_examples", "run", *SMALL, "-p", "fp32", "--output", str(tmp_path), *flags])
    assert proc.returncode == 0, proc.stderr[-3000:]
    return res.records_in(tmp_path)


@needs_bf16
def test_openvino_reads_back_its_inference_precision_and_onnxruntime_says_where_it_has_fast_math(tmp_path):
    by = {r.backend: r for r in run(tmp_path, "--fpmath-mode", "bf16", "--backend", "openvino,onnxruntime",
                                     "--launcher", "inline")}
    ov = by["openvino"]
    assert ov.status == "ok", ov.reason
    assert ov.fpmath == {"mode": "bf16", "read_back": {"INFERENCE_PRECISION_HINT": "bf16"}}
    assert ov.precision_mode == "inference-precision-bf16" and "fpmath_read_back" not in ov.backend_info
    assert ov.check["tolerance"]["precision"] == "bf16" and ov.key().fpmath == "bf16"
    ort = by["onnxruntime"]
    if platform.machine() in ("aarch64", "arm64"):
        assert ort.status == "ok" and ort.fpmath["read_back"] == {"mlas.enable_gemm_fastmath_arm64_bfloat16": "1"}
    else:           # refused before anything is exported, as any combination an engine cannot run
        assert ort.status == "unsupported" and "mlas.enable_gemm_fastmath_arm64_bfloat16" in ort.reason
        assert ort.fpmath == {"mode": "bf16"}


@needs_bf16
def test_benchmark_takes_the_mode_and_eager_reads_torchs_setting_back_in_its_own_process():
    r = benchmark("resnet_18", backend="eager", fpmath_mode="bf16", input_size=32, threads=1, num_runs=5)
    assert r.status == "ok", r.reason
    back = r.fpmath["read_back"]
    assert r.fpmath["mode"] == "bf16" and back["torch.backends.mkldnn.matmul.fp32_precision"] == "bf16"
    assert {k["fpmath"] for k in back["onednn_kernels"].values()} == {"bf16"}      # oneDNN's log of the primitives
    assert r.check["passed"] and r.check["tolerance"]["precision"] == "bf16"
    # the caller's process is left strict: the mode was its configuration's process's
    import torch

    assert torch.backends.mkldnn.matmul.fp32_precision in ("none", "ieee")


@pytest.mark.slow       # five processes, each starting torch: the second tier
@needs_bf16
def test_strict_and_fast_math_are_measured_in_one_interleaved_run_as_configurations_of_their_own(tmp_path):
    records = run(tmp_path, "--fpmath-mode", "strict,bf16", "--backend", "eager,openvino", "--json")
    assert [r.label for r in records] == ["eager/fp32", "openvino/fp32", "eager/fp32 fpmath bf16",
                                          "openvino/fp32 fpmath bf16"]
    assert all(r.status == "ok" for r in records), [r.reason for r in records]
    assert len({r.key() for r in records}) == 4 and len({r.run_id for r in records}) == 1
    shared = {tuple(r.scenario["rounds"]["with"]) for r in records}
    assert len(shared) == 1 and len(next(iter(shared))) == 4       # all four took the same interleaved rounds
    strict_eager = records[0]
    assert strict_eager.fpmath["read_back"]["torch.backends.mkldnn.conv.fp32_precision"] in ("none", "ieee")
    assert records[1].fpmath["read_back"] == {"INFERENCE_PRECISION_HINT": "f32"}
    # every speedup is over strict eager fp32, whose own is 1
    assert all(r.speedup_vs_eager_fp32 == pytest.approx(strict_eager.median_ms / r.median_ms) for r in records)
    assert [json.loads(r.to_json())["check"]["tolerance"]["precision"] for r in records] == ["fp32", "fp32", "bf16",
                                                                                            "bf16"]
