"""Process isolation of points and the support matrix, with real subprocesses."""

import json

import pytest
from conftest import run_cli

from aio_examples.core.processes import run_isolated
from aio_examples.drivers.matrix import README_END, README_START, update_readme


def test_a_segfault_is_caught_with_its_signal_and_last_stderr_line():
    out = run_isolated(["-c", ("import os, signal, sys; print('about to crash', file=sys.stderr); "
                              "os.kill(os.getpid(), signal.SIGSEGV)")], timeout_s=60)
    assert out.crashed and "SIGSEGV" in out.reason and "about to crash" in out.reason


def test_a_hanging_process_group_is_killed_at_the_timeout():
    out = run_isolated(["-c", ("import subprocess, sys, time; "
                              "subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)']); time.sleep(60)")],
                       timeout_s=2)
    assert out.crashed and out.timed_out and out.seconds < 30 and "timed out" in out.reason


def test_a_clean_exit_is_not_a_crash():
    out = run_isolated(["-c", "import sys; sys.exit(1)"], timeout_s=60)
    assert not out.crashed and out.returncode == 1


@pytest.mark.slow       # a long end-to-end run: the second tier keeps the default one under 15 minutes
def test_matrix_runs_each_cell_renders_and_resumes(tmp_path):
    out = tmp_path / "mx"
    args = ["-m", "aio_examples", "matrix", "--models", "squeezenet", "--backends", "eager,torchscript",
            "--precisions", "fp32,bf16", "--output", str(out), "-t", "1"]
    first = run_cli(args)
    assert first.returncode == 0, first.stderr
    records = [json.loads(line) for line in (out / "results.jsonl").read_text().splitlines()]
    cells = {(r["backend"], r["precision"]): r["status"] for r in records}
    assert cells == {("eager", "fp32"): "ok", ("eager", "bf16"): "ok", ("torchscript", "fp32"): "ok",
                     ("torchscript", "bf16"): "ok"}
    assert "| squeezenet | ok | ok |" in first.stdout
    again = run_cli(args)
    assert again.returncode == 0
    assert len((out / "results.jsonl").read_text().splitlines()) == len(records)     # nothing re-run


def test_readme_section_is_replaced_between_markers(tmp_path):
    readme = tmp_path / "README.md"
    readme.write_text(f"# title\n{README_START}\nold\n{README_END}\nafter\n")
    update_readme(readme, "| new |")
    text = readme.read_text()
    assert "| new |" in text and "old" not in text and text.endswith("after\n")


def test_matrix_rejects_an_unknown_backend():
    r = run_cli(["-m", "aio_examples", "matrix", "--backends", "tensorrt", "--render-only"])
    assert r.returncode == 2 and "tensorrt" in r.stderr and "accepted" in r.stderr


def test_a_matrix_of_some_models_keeps_the_other_rows_and_their_reasons(tmp_path):
    """Rendering new models' records against a file's table keeps the rows of models not run, with each reason
    renumbered beside the new ones."""
    from aio_examples.core.records import Result
    from aio_examples.drivers.matrix import previous_cells, render

    old = (f"{README_START}\n\nMeasured on Old CPU (ISA: avx2) with torch 1.\n\n**fp32**\n\n| model | eager | onnxruntime |\n"
           "|---|---|---|\n| gpt2 | ok | n/a [1] |\n| bert_base | ok | ok |\n\n1. no graph for a KV cache\n"
           f"\n{README_END}\n")
    out = tmp_path / "mx"
    out.mkdir()
    new = Result(model="dlrm", task="recommendation", backend="onnxruntime", precision="fp32", status="unsupported",
                 reason="a reason of its own", batch_size=1, threads=1, input_shape={})
    (out / "results.jsonl").write_text(new.to_json() + "\n")
    table = render(out, ["dlrm"], ["eager", "onnxruntime"], ["fp32"], previous_cells(old))
    assert "| dlrm | - | n/a [2] |" in table
    assert "| gpt2 | ok | n/a [1] |" in table and "| bert_base | ok | ok |" in table
    assert table.index("| gpt2 |") < table.index("| bert_base |") < table.index("| dlrm |")     # new rows last
    assert "1. no graph for a KV cache" in table and "2. a reason of its own" in table
    assert "kept from the previous table (not run this time), measured on Old CPU (ISA: avx2) with torch 1" in table
