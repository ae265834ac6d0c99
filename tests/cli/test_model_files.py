"""A user's own model file (`--model-file`): a torch.export program and a TorchScript module run end to end
on the backends that can take them, named after the file with its digest; bad files and shapes refused."""

import json

import pytest
import torch
from conftest import run_cli


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    folder = tmp_path_factory.mktemp("own")
    net = torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.ReLU(), torch.nn.Linear(128, 10)).eval()
    x = torch.randn(4, 64)
    torch.export.save(torch.export.export(net, (x,)), folder / "mlp.pt2")
    torch.jit.save(torch.jit.trace(net, x), folder / "scripted.pt")
    (folder / "fake.pt2").write_text("not a model")
    return folder


def records(out):
    return {r["backend"]: r for r in map(json.loads, (out / "results.jsonl").read_text().splitlines())}


def test_an_exported_program_runs_on_every_backend_with_its_own_inputs(files, tmp_path):
    proc = run_cli(["-m", "aio_examples", "run", "--model-file", str(files / "mlp.pt2"),
                    "--backend", "eager,inductor,onnxruntime,openvino", "--timeout", "0.5", "-t", "1",
                    "--output", str(tmp_path)])
    assert proc.returncode == 0, proc.stderr[-2000:]
    found = records(tmp_path)
    for backend, r in found.items():
        assert r["status"] == "ok", (backend, r["reason"])
        assert r["model"] == "mlp" and r["input_shape"] == {"batch_size": 4, "input0": [4, 64]}   # its own inputs
        assert r["weights"] == "file" and "sha256" in r["weights_path"] and r["check"]["passed"]


def test_a_torchscript_file_runs_where_it_can_and_says_where_not(files, tmp_path):
    proc = run_cli(["-m", "aio_examples", "run", "--model-file", str(files / "scripted.pt"), "--input-shape",
                    "x=2x64", "--backend", "eager,inductor,onnxruntime", "--timeout", "0.5", "-t", "1",
                    "--output", str(tmp_path)])
    assert proc.returncode == 0, proc.stderr[-2000:]
    found = records(tmp_path)
    assert found["eager"]["status"] == found["onnxruntime"]["status"] == "ok"
    assert found["eager"]["batch_size"] == 2 and found["eager"]["model"] == "scripted"
    assert found["inductor"]["status"] == "unsupported" and "torch.jit" in found["inductor"]["reason"]


@pytest.mark.parametrize(("args", "message"), [
    (["fake.pt2"], "is not a saved torch.export program"),
    (["mlp.pt2", "--input-shape", "4x63"], "mlp.pt2 refuses inputs of shapes [[4, 63]]"),
    (["scripted.pt"], "does not say its input shapes"),
    (["mlp.onnx"], "has no known suffix"),
    (["mlp.pt2", "--input-shape", "4xA"], "--input-shape '4xA' is invalid"),
    (["mlp.pt2", "--input-dtype", "float8"], "--input-dtype 'float8' is invalid"),
])
def test_bad_files_and_shapes_are_one_line_and_exit_2(files, tmp_path, args, message):
    proc = run_cli(["-m", "aio_examples", "run", "--model-file", str(files / args[0]), *args[1:], "--backend",
                    "eager", "--output", str(tmp_path)])
    lines = [x for x in proc.stderr.splitlines() if x.strip() and "Failed to load" not in x]
    assert proc.returncode == 2 and len(lines) == 1 and message in lines[0], proc.stderr
