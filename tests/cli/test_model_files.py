"""A user's own model (`--model-file`, `--model-dir`): a torch.export program, a TorchScript module, an ONNX
file and a Hugging Face folder of an architecture outside the zoo run end to end on the backends that can take
them, named after the file or folder with its digest; bad files, folders and shapes refused in one line."""

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
    (folder / "fake.onnx").write_text("not a model")
    conv = torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3, padding=1), torch.nn.ReLU(), torch.nn.Conv2d(8, 8, 3),
                               torch.nn.ReLU(), torch.nn.AdaptiveAvgPool2d(1),
                               torch.nn.Flatten(), torch.nn.Linear(8, 10)).eval()
    images = torch.randn(2, 3, 32, 32)
    # a user's names (not input0..N), one static file and one with a symbolic batch
    torch.onnx.export(conv, (images,), folder / "conv.onnx", input_names=["pixels"], dynamo=False, opset_version=17)
    torch.onnx.export(net, (x,), folder / "dyn.onnx", input_names=["features"], dynamic_axes={"features": {0: "n"}},
                      dynamo=False, opset_version=17)
    (folder / "empty").mkdir()
    return folder


@pytest.fixture(scope="module")
def hf_folders(tmp_path_factory):
    """Folders as transformers saves them, of architectures the zoo does not have: an ELECTRA text classifier
    (with no tokenizer: random token ids) and a ConvNeXt image classifier with its processor's normalisation."""
    from aio_examples.models.nlp import load_transformers

    tf = load_transformers()
    folder = tmp_path_factory.mktemp("hf")
    torch.manual_seed(0)
    tf.ElectraForSequenceClassification(tf.ElectraConfig(
        vocab_size=500, embedding_size=32, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
        intermediate_size=64, max_position_embeddings=64, num_labels=3)).save_pretrained(folder / "electra")
    tf.ConvNextForImageClassification(tf.ConvNextConfig(
        hidden_sizes=[8, 16, 32, 64], depths=[1, 1, 1, 1], num_labels=10, image_size=32)).save_pretrained(
        folder / "convnext")
    (folder / "convnext" / "preprocessor_config.json").write_text(
        json.dumps({"image_mean": [0.5, 0.5, 0.5], "image_std": [0.25, 0.25, 0.25]}))
    tf.ElectraForPreTraining(tf.ElectraConfig(vocab_size=100, embedding_size=8, hidden_size=8, num_hidden_layers=1,
                                              num_attention_heads=1, intermediate_size=8)).save_pretrained(
        folder / "pretraining")
    return folder


def records(out):
    return {r["backend"]: r for r in map(json.loads, (out / "results.jsonl").read_text().splitlines())}


@pytest.mark.slow       # a long end-to-end run: the second tier keeps the default one under 15 minutes
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


# The slow tier: a second file format through the whole command (with inductor's compile): the ONNX file keeps that
# door in the default tier
@pytest.mark.slow
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
    (["mlp.txt"], "has no known suffix"),
    (["fake.onnx"], "is not an ONNX model"),
    (["dyn.onnx"], "does not say its input shapes"),
    (["dyn.onnx", "--input-shape", "4x65"], "dyn.onnx refuses inputs of shapes [[4, 65]]"),
    (["mlp.pt2", "--input-shape", "4xA"], "--input-shape '4xA' is invalid"),
    (["mlp.pt2", "--input-dtype", "float8"], "--input-dtype 'float8' is invalid"),
])
def test_bad_files_and_shapes_are_one_line_and_exit_2(files, tmp_path, args, message):
    (files / "mlp.txt").write_text("")
    proc = run_cli(["-m", "aio_examples", "run", "--model-file", str(files / args[0]), *args[1:], "--backend",
                    "eager", "--output", str(tmp_path)])
    lines = [x for x in proc.stderr.splitlines() if x.strip() and "Failed to load" not in x]
    assert proc.returncode == 2 and len(lines) == 1 and message in lines[0], proc.stderr


def test_an_onnx_file_runs_on_the_runtimes_and_the_torch_backends_say_why_not(files, tmp_path):
    """Given in place of a zoo name; its inputs, named by the user and with a symbolic batch, take the shape."""
    proc = run_cli(["-m", "aio_examples", "run", str(files / "dyn.onnx"), "--input-shape", "features=3x64",
                    "--backend", "eager,onnxruntime", "--timeout", "0.3", "-t", "1", "--output", str(tmp_path)])
    assert proc.returncode == 0, proc.stderr[-2000:]
    found = records(tmp_path)
    assert found["eager"]["status"] == "unsupported" and "ONNX Runtime and OpenVINO" in found["eager"]["reason"]
    ort = found["onnxruntime"]
    assert ort["status"] == "ok" and ort["model"] == "dyn" and ort["batch_size"] == 3, ort["reason"]
    assert ort["check"]["passed"] and ort["check"]["reference"] == "onnxruntime-fp32-unoptimized"
    assert ort["backend_info"]["inputs_renamed"] == {"features": "input0"} and "sha256" in ort["weights_path"]


@pytest.mark.slow       # about a minute: three engines at three precisions
def test_an_onnx_file_on_every_runtime_and_precision(files, tmp_path):
    proc = run_cli(["-m", "aio_examples", "run", "--model-file", str(files / "conv.onnx"), "--backend",
                    "onnxruntime,openvino,aio", "-p", "fp32,int8,bf16", "--timeout", "0.3", "-t", "1",
                    "--output", str(tmp_path)])
    assert proc.returncode == 0, proc.stderr[-2000:]
    rows = {(r["backend"], r["precision"]): r for r in map(json.loads, (tmp_path / "results.jsonl").read_text()
                                                           .splitlines())}
    for backend in ("onnxruntime", "openvino", "aio"):
        for precision in ("fp32", "int8"):
            r = rows[(backend, precision)]
            assert r["status"] == "ok" and r["check"]["passed"], (backend, precision, r["reason"])
    assert rows[("onnxruntime", "int8")]["precision_mode"] == "int8-static-qdq"      # counted as a conv net
    assert rows[("aio", "fp32")]["strategy"] in ("onnxruntime", "openvino")          # no torch strategy
    assert rows[("onnxruntime", "bf16")]["status"] == "unsupported"
    assert "precision it was saved in" in rows[("onnxruntime", "bf16")]["reason"]


@pytest.mark.slow       # every backend on two folders: a few minutes
def test_hugging_face_folders_outside_the_zoo_run_on_every_backend(hf_folders, tmp_path):
    for name, task in (("electra", "text-classification"), ("convnext", "image-classification")):
        out = tmp_path / name
        proc = run_cli(["-m", "aio_examples", "run", "--model-dir", str(hf_folders / name), "--backend",
                        "eager,torchscript,inductor,onnxruntime,openvino,aio", "--timeout", "0.3", "-t", "1",
                        "--output", str(out)])
        assert proc.returncode == 0, proc.stderr[-2000:]
        for backend, r in records(out).items():
            assert r["status"] == "ok" and r["check"]["passed"], (name, backend, r["reason"])
            assert r["model"] == name and r["task"] == task and r["weights"] == "model-dir"
            assert "sha256" in r["weights_path"]
    assert records(tmp_path / "convnext")["eager"]["input_shape"]["input_size"] == 32     # from config.json
    report = run_cli(["-m", "aio_examples", "report", str(tmp_path / "convnext"), "--output", str(tmp_path / "report")])
    assert report.returncode == 0 and "convnext" in (tmp_path / "report" / "summary.md").read_text()


@pytest.mark.slow       # a sweep's processes: about a minute
def test_a_sweep_takes_model_files_and_folders_beside_zoo_names(files, hf_folders, tmp_path):
    argv = ["-m", "aio_examples", "sweep", str(files / "conv.onnx"), str(hf_folders / "electra"), "--backends",
            "onnxruntime,eager", "--precisions", "fp32", "--threads", "1", "--timeout", "0.3", "--output", str(tmp_path)]
    proc = run_cli(argv)
    assert proc.returncode == 0, proc.stderr[-2000:]
    rows = [json.loads(line) for line in (tmp_path / "results.jsonl").read_text().splitlines()]
    assert sorted((r["model"], r["backend"], r["status"]) for r in rows) == [
        ("conv", "eager", "unsupported"), ("conv", "onnxruntime", "ok"),
        ("electra", "eager", "ok"), ("electra", "onnxruntime", "ok")]
    again = run_cli(argv)
    assert again.returncode == 0 and "4 already done" in again.stdout + again.stderr      # resumed by point


@pytest.mark.parametrize(("folder", "message"), [
    ("empty", "has no config.json"),
    ("pretraining", "ElectraForPreTraining, a head not benchmarked here"),
])
def test_bad_folders_are_one_line_and_exit_2(files, hf_folders, tmp_path, folder, message):
    path = files / folder if folder == "empty" else hf_folders / folder
    proc = run_cli(["-m", "aio_examples", "run", "--model-dir", str(path), "--backend", "eager",
                    "--output", str(tmp_path)])
    lines = [x for x in proc.stderr.splitlines() if x.strip()]
    assert proc.returncode == 2 and len(lines) == 1 and message in lines[0], proc.stderr
