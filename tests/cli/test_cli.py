"""The CLI end to end, through real run.py subprocesses writing real results.jsonl files."""

import json
import os
import subprocess

import pandas as pd
import pytest
from conftest import ROOT, run_cli

from aio_examples.core.records import SCHEMA_VERSION

RESNET18 = ROOT / "classification" / "resnet_18"
QUICK = ["--input-size", "64", "--timeout", "1", "-t", "1"]


def test_run_py_writes_a_complete_record(tmp_path):
    out = tmp_path / "res"
    proc = run_cli(["run.py", "-p", "fp32", "--backend", "eager", "--output", str(out), *QUICK], cwd=RESNET18)
    assert proc.returncode == 0, proc.stderr
    assert "resnet_18" in proc.stdout and "eager" in proc.stdout
    records = pd.read_json(out / "results.jsonl", lines=True)
    assert len(records) == 1
    r = json.loads((out / "results.jsonl").read_text().splitlines()[0])
    assert r["schema_version"] == SCHEMA_VERSION
    assert (r["model"], r["task"], r["backend"], r["precision"], r["status"]) == (
        "resnet_18", "image-classification", "eager", "fp32", "ok")
    assert r["batch_size"] == 1 and r["threads"] == 1 and r["input_shape"]["input_size"] == 64
    assert r["weights"] == "random-unit-variance"          # classifiers: rescaled so the signal does not vanish
    lat = r["latency_ms"]
    assert lat["n"] == len(r["samples_ms"]) >= 1
    assert lat["min"] <= lat["median"] <= lat["p90"] <= lat["p99"] <= lat["max"]
    assert r["throughput"]["unit"] == "images/s" and r["throughput"]["value"] > 0
    assert r["first_pass_ms"] > 0 and r["prepare_s"] >= 0 and r["peak_rss_mb"] > 0
    assert r["binding"]["threads_in_effect"] == 1 and r["binding"]["affinity"]
    assert 0 < r["binding"]["observed_cores"] < 1.35           # one thread keeps at most one core busy
    assert r["check"]["passed"] and r["check"]["cosine"] > 0.9999 and r["strategy"] == "eager"
    env = r["env"]
    for key in ("cpu_model", "isa", "logical_cpus", "numa_nodes", "kernel", "python", "versions", "hostname",
                "env_vars", "torchvision_ops"):
        assert key in env
    assert env["versions"]["torch"].startswith("2.13.0")
    assert env["env_vars"]["OMP_NUM_THREADS"] == "1"


def test_aio_num_threads_is_honoured_and_records_append(tmp_path):
    out = tmp_path / "res"
    # `run MODEL` is what a model's run.py runs (above): forked from the tests' fork server
    args = ["-m", "aio_examples", "run", "resnet_18", "--backend", "eager", "--output", str(out), "--input-size", "32",
            "--num-runs", "5"]
    for _ in range(2):
        proc = run_cli(args, env={"AIO_NUM_THREADS": "1"})
        assert proc.returncode == 0, proc.stderr
    records = pd.read_json(out / "results.jsonl", lines=True)
    assert len(records) == 2 and records["run_id"].nunique() == 2
    assert all(b["threads_in_effect"] == 1 and b["threads_source"] == "AIO_NUM_THREADS" for b in records["binding"])
    assert all(len(s) == 5 for s in records["samples_ms"])
    assert set(records["stop_reason"]) == {"num_runs"}


def test_several_backends_give_one_table_with_speedups(tmp_path):
    out = tmp_path / "res"
    proc = run_cli(["-m", "aio_examples", "run", "resnet_18", "-p", "bf16", "--backend", "eager,torchscript",
                    "--output", str(out), *QUICK])
    assert proc.returncode == 0, proc.stderr
    assert "interleaved" in proc.stdout
    records = pd.read_json(out / "results.jsonl", lines=True)
    # eager fp32 is measured alongside as the reference for the speedup column
    assert sorted(zip(records["backend"], records["precision"])) == [
        ("eager", "bf16"), ("eager", "fp32"), ("torchscript", "bf16")]
    ok = records[records["status"] == "ok"]
    assert len(ok) >= 2
    ref = ok[(ok["backend"] == "eager") & (ok["precision"] == "fp32")]
    assert ref["speedup_vs_eager_fp32"].iloc[0] == pytest.approx(1.0)
    for _, row in ok.iterrows():
        expected = ref["latency_ms"].iloc[0]["median"] / row["latency_ms"]["median"]
        assert row["speedup_vs_eager_fp32"] == pytest.approx(expected)
    assert "vs eager fp32" in proc.stdout


@pytest.mark.parametrize("args, env, words", [
    (["run", "no_such_model"], {}, "model 'no_such_model' is unknown; accepted: resnet_50_v1"),
    (["run", "resnet_18", "-p", "fp64"], {}, "precision 'fp64' is not supported; accepted: fp32, bf16"),
    (["run", "resnet_18", "-b", "0"], {}, "-b/--batch-size '0' is invalid"),
    (["run", "resnet_18", "--weights", "/nonexistent/w.pt"], {}, "--weights '/nonexistent/w.pt'"),
    (["run", "resnet_18", "--output", "/proc/forbidden"], {}, "--output '/proc/forbidden' is not writable"),
    (["run", "resnet_18"], {"AIO_NUM_THREADS": "abc"}, "AIO_NUM_THREADS='abc' is invalid"),
    (["run", "resnet_18", "-t", "999"], {}, "-t/--threads") ,
    (["run", "resnet_18", "--backend", "tensorrt"], {}, "backend 'tensorrt' is unknown"),
    (["run", "resnet_18", "--seq-len", "64"], {}, "--seq-len does not apply to resnet_18"),
    (["run", "bert_base", "--seq-len", "4096"], {}, "--seq-len 4096 is too long for bert_base"),
    (["run", "resnet_18", "--model-dir", "."], {}, "--model-dir is for Hugging Face models"),
    (["run", "resnet_18"], {"AIO_DEBUG_MODE": "7"}, "AIO_DEBUG_MODE='7' is invalid"),
])
def test_bad_input_is_one_line_and_exit_2(tmp_path, args, env, words):
    if "--output" not in args:
        args = [*args, "--output", str(tmp_path / "res")]
    proc = run_cli(["-m", "aio_examples", *args, "--timeout", "1"], env=env)
    assert proc.returncode == 2, (proc.stdout, proc.stderr)
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, proc.stderr
    assert lines[0].startswith("aio-examples: error: ")
    assert words.replace("-t/--threads", "more than") in lines[0] or words in lines[0], lines[0]
    assert "Traceback" not in proc.stderr


def test_debug_mode_3_shows_the_traceback(tmp_path):
    proc = run_cli(["-m", "aio_examples", "run", "resnet_18", "-b", "0"], env={"AIO_DEBUG_MODE": "3"})
    assert proc.returncode == 2
    assert "Traceback" in proc.stderr


def test_an_unwritable_output_fails_before_measuring(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("")
    proc = run_cli(["-m", "aio_examples", "run", "resnet_18", "--output", str(blocker / "sub")])
    assert proc.returncode == 2 and "not writable" in proc.stderr
    assert "preparing" not in proc.stderr


def test_list_shows_the_zoo(tmp_path):
    proc = run_cli(["-m", "aio_examples", "list", "--no-flops"])
    assert proc.returncode == 0
    for name in ("resnet_50_v1", "inception_v3", "ssdlite320_mobilenet_v3", "bert_base", "gpt2"):
        assert name in proc.stdout
    assert "input_size=299" in proc.stdout


def test_flops_are_counted_once_per_shape_and_cached(tmp_path, monkeypatch):
    from aio_examples.measurement.flops import cached_flops
    from aio_examples.models import get_model

    monkeypatch.setenv("AIO_CACHE_DIR", str(tmp_path))
    resnet50, resnet18 = get_model("resnet_50_v1"), get_model("resnet_18")
    deep, shallow = (cached_flops(spec, spec.shape(input_size=64)) for spec in (resnet50, resnet18))
    assert deep > 2 * shallow > 0                  # a deeper net does more work at the same size
    table = json.loads((tmp_path / "flops.json").read_text())
    assert sorted(table.values()) == sorted([deep, shallow])
    key = next(k for k, v in table.items() if v == deep)
    table[key] = 7                                 # read back from the cache, not counted again
    (tmp_path / "flops.json").write_text(json.dumps(table))
    assert cached_flops(resnet50, resnet50.shape(input_size=64)) == 7


def test_attention_is_counted_through_the_fused_paths():
    """nn.MultiheadAttention's fused inference path and CPU flash attention are counted like their unfused
    ops: an encoder layer's projections, both attention matmuls and its MLP, each 2 x multiply-adds."""
    import torch

    from aio_examples.measurement.flops import flops_of

    e, seq, ff = 16, 8, 32
    layer = torch.nn.TransformerEncoderLayer(e, 2, dim_feedforward=ff, batch_first=True).eval()
    x = torch.randn(1, seq, e)
    expected = 2 * seq * e * 3 * e + 2 * seq * e * e + 2 * (2 * seq * seq * e) + 2 * (2 * seq * e * ff)
    assert flops_of(lambda: layer(x)) == expected
    assert torch.backends.mha.get_fastpath_enabled()          # turned back on after counting
    q = torch.randn(1, 2, seq, e // 2)
    assert flops_of(lambda: torch.nn.functional.scaled_dot_product_attention(q, q, q)) == 2 * (2 * seq * seq * e)


@pytest.mark.slow      # counts every zoo model at its full shape (the UNet, Llama 3.2 1B...): minutes
def test_list_counts_flops_once_and_caches_them(tmp_path):
    cache = tmp_path / "cache"
    env = {"AIO_CACHE_DIR": str(cache)}
    first = run_cli(["-m", "aio_examples", "list", "--json"], env=env, timeout=900)
    assert first.returncode == 0, first.stderr
    rows = {json.loads(line)["model"]: json.loads(line) for line in first.stdout.splitlines()}
    resnet = float(rows["resnet_50_v1"]["GFLOPs/pass (b=1)"])
    resnet18 = float(rows["resnet_18"]["GFLOPs/pass (b=1)"])
    assert resnet > 2 * resnet18 > 0               # a deeper net does more work at the same size
    assert (cache / "flops.json").is_file()


def test_console_script_is_installed_and_runs():
    import subprocess
    import sys
    from pathlib import Path

    exe = Path(sys.executable).parent / "aio-examples"
    assert exe.is_file() and os.access(exe, os.X_OK)
    proc = subprocess.run([str(exe), "list", "--no-flops"], capture_output=True, text=True, check=False)
    assert proc.returncode == 0 and "resnet_50_v1" in proc.stdout


def test_ctrl_c_keeps_what_was_measured(tmp_path):
    """SIGINT during measurement: the records so far are written, the exit code says interrupted."""
    import signal
    import subprocess
    import sys
    import time

    out = tmp_path / "res"
    proc = subprocess.Popen([sys.executable, "run.py", "--backend", "eager", "--output", str(out),
                             "--input-size", "64", "--timeout", "300", "--num-runs", "1000000", "-t", "1"],
                            cwd=RESNET18, stderr=subprocess.PIPE, text=True)
    for line in proc.stderr:                 # wait until measuring has begun
        if "measuring" in line:
            break
    time.sleep(3)
    proc.send_signal(signal.SIGINT)
    rest = proc.stderr.read()
    assert proc.wait(timeout=60) == 130
    assert "records already written are kept" in rest
    record = json.loads((out / "results.jsonl").read_text())
    assert record["status"] == "ok" and record["stop_reason"] == "interrupted"
    assert record["latency_ms"]["n"] == len(record["samples_ms"]) > 0


def test_run_all_nightly_checks_its_baseline_before_measuring_anything(tmp_path):
    out = tmp_path / "night"
    proc = subprocess.run(["bash", str(ROOT / "run_all.sh"), "--nightly", "--baseline", str(tmp_path / "nope"),
                           "--output", str(out)], cwd=ROOT, capture_output=True, text=True, timeout=300, check=False)
    assert proc.returncode == 2 and not out.exists(), proc.stderr[-1500:]
    [line] = proc.stderr.strip().splitlines()
    assert line.startswith("run_all.sh: --baseline") and "nope" in line and "regression report" not in proc.stdout


@pytest.mark.parametrize("value", ["inf", "nan", "-1", "1e999"])
def test_a_timeout_that_is_not_a_finite_number_of_seconds_is_refused(value, tmp_path):
    proc = run_cli(["-m", "aio_examples", "run", "squeezenet", "--timeout", value, "--output", str(tmp_path)])
    assert proc.returncode == 2 and f"--timeout '{value}' is invalid" in proc.stderr
    sweep = tmp_path / "s.toml"
    sweep.write_text(f'models = ["squeezenet"]\ntimeout = {value if value != "1e999" else "inf"}\n')
    proc = run_cli(["-m", "aio_examples", "sweep", "--config", str(sweep), "--output", str(tmp_path / "o")])
    assert proc.returncode == 2 and "timeout" in proc.stderr and "finite" in proc.stderr, proc.stderr
