"""ImageNet-style and COCO datasets: real images, real labels, real evaluators, and the CLI end to end.

The ground truth is brought by the tests: scikit-learn's real handwritten digits, written as an ImageNet
validation folder, and a resnet_18 trained on the other digits by the test itself.
"""

import json
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import ROOT, run_cli
from PIL import Image

from aio_examples.core.errors import UsageError
from aio_examples.core.records import load_records
from aio_examples.datasets import open_dataset, resolve
from aio_examples.datasets.base import Batch
from aio_examples.datasets.coco import CocoEvaluation
from aio_examples.datasets.imagenet import TopK
from aio_examples.datasets.metrics import coco_detection
from aio_examples.machine.threads import ThreadChoice
from aio_examples.measurement.runner import RunRequest, run
from aio_examples.measurement.timing import StopRule
from aio_examples.models import get_model

sys.path.insert(0, str(ROOT / "benchmarks"))
import digits  # benchmarks/ is scripts, not a package


@pytest.fixture(scope="module")
def trained_digits(tmp_path_factory):
    """(images, labels file, weights) of held-out digits and a resnet_18 trained on the rest, at 32x32."""
    return digits.prepare(tmp_path_factory.mktemp("digits"))


@pytest.fixture(scope="module")
def held_out_digits(tmp_path_factory):
    """(images, labels file) of the held-out digits alone: the tests that read the data need no training."""
    images = tmp_path_factory.mktemp("digits") / "val"
    return images, digits.write_folder(digits.split()[1], images)


@pytest.mark.slow       # trains a classifier first (~40 s): the second tier keeps the default one under 15 minutes
def test_a_classifier_trained_on_digits_scores_far_above_chance_through_run_py(trained_digits, tmp_path):
    images, labels, weights = trained_digits
    out = tmp_path / "results"
    proc = run_cli(["run.py", "--weights", str(weights), "--input-size", "32", "-b", "8",
                    "--backend", "eager,onnxruntime", "-p", "fp32,bf16,int8", "--timeout", "0.5", "-t", "1",
                    "--output", str(out)], cwd=ROOT / "classification" / "resnet_18",
                   env={"IMAGENET_IMG_PATH": str(images), "IMAGENET_LABELS_PATH": str(labels)})
    assert proc.returncode == 0, proc.stderr[-2000:]
    records = {(r.backend, r.precision): r for r in load_records(out / "results.jsonl")}
    fp32 = records["eager", "fp32"]
    assert fp32.dataset == "imagenet" and fp32.accuracy["samples"] == 360
    assert fp32.accuracy["metrics"]["top_1"] >= 0.85             # chance is 0.10
    assert fp32.accuracy["dataset"]["digest"] and fp32.accuracy["dataset"]["path"] == str(images.resolve())
    ran = [r for r in records.values() if r.status != "unsupported"]
    assert {("eager", "bf16"), ("onnxruntime", "int8"), ("onnxruntime", "fp32")} <= {(r.backend, r.precision) for r in ran}
    for r in ran:          # bf16 and int8 within their allowance of eager fp32, on the same samples
        assert r.status == "ok", (r.backend, r.precision, r.reason)
        assert abs(r.accuracy["delta_vs_eager_fp32"]["top_1"]) <= 0.01
        predictions = json.loads(Path(r.accuracy["predictions"]).read_text())
        assert len(predictions) == 360 and predictions[0]["image"] == "digit_00001.png"
        top1 = np.mean([p["top_5"][0] == p["label"] for p in predictions])
        assert top1 == pytest.approx(r.accuracy["metrics"]["top_1"])          # anyone can rescore the file
    assert "top_1" in proc.stdout and "accuracy" in proc.stdout


def test_flags_win_over_variables_and_num_samples_limits_the_samples(held_out_digits):
    images, labels = held_out_digits
    environ = {"IMAGENET_IMG_PATH": "/nowhere", "IMAGENET_LABELS_PATH": "/nowhere.txt"}
    ds = resolve("image-classification", f"imagenet:{images}", str(labels), 50, environ=environ)
    assert len(ds.samples) == 50 and ds.describe()["kind"] == "imagenet"
    assert resolve("image-classification", environ={}).name == "synthetic"
    with pytest.raises(UsageError, match="'/nowhere' does not exist"):
        resolve("image-classification", environ=environ)
    with pytest.raises(UsageError, match="dataset 'imagenet' is for image-classification, not object-detection"):
        resolve("object-detection", f"imagenet:{images}", str(labels))
    with pytest.raises(UsageError, match="--num-samples 0 is invalid"):
        open_dataset("imagenet", str(images), str(labels), 0)


def test_image_folder_layout_numbers_classes_in_sorted_order(tmp_path):
    for cls in ("cat", "ant", "bee"):
        (tmp_path / cls).mkdir()
        Image.new("RGB", (40, 30), (10, 20, 30)).save(tmp_path / cls / f"{cls}1.png")
    ds = open_dataset("imagenet", str(tmp_path))
    assert [(p.name, label) for p, label in ds.samples] == [("ant1.png", 0), ("bee1.png", 1), ("cat1.png", 2)]
    spec = get_model("resnet_18")
    [batch] = list(ds.batches(spec, 2, {"input_size": 32}, None))[1:]
    assert batch.inputs[0].shape == (2, 3, 32, 32) and batch.targets == [("cat/cat1.png", 2)]   # padded to 2


def test_bad_datasets_are_refused_in_one_line_before_any_model_is_built(tmp_path):
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(UsageError, match="empty"):
        open_dataset("imagenet", str(empty))
    images = tmp_path / "images"
    images.mkdir()
    Image.new("L", (8, 8)).save(images / "a.png")
    cases = {"a.png 3\nb.png 4\n": "names 'b.png', which is not in",
             "a.png 1000\n": "class 1000 is out of range; accepted: 0..999",
             "a.png cat\n": "line 1 is 'a.png cat'; accepted: a labels file"}
    for text, message in cases.items():
        (tmp_path / "labels.txt").write_text(text)
        with pytest.raises(UsageError, match=message) as err:
            open_dataset("imagenet", str(images), str(tmp_path / "labels.txt"))
        assert "\n" not in str(err.value)
    (tmp_path / "x.json").write_text(json.dumps({"info": {}}))
    with pytest.raises(UsageError, match="is not a COCO instances file"):
        open_dataset("coco", str(images), str(tmp_path / "x.json"))
    (tmp_path / "x.json").write_text("{nope")
    with pytest.raises(UsageError, match="is not JSON"):
        open_dataset("coco", str(images), str(tmp_path / "x.json"))


def test_bad_dataset_flags_exit_2_with_one_line(tmp_path):
    cases = [(["--dataset", f"coco:{tmp_path}"], "dataset 'coco' is for object-detection, not image-classification"),
             (["--dataset", f"imagenet:{tmp_path / 'missing'}"], "does not exist"),
             (["--num-samples", "0"], "--num-samples '0' is invalid"),
             (["--labels", str(tmp_path / "l.txt")], "--labels needs a dataset")]
    for flags, message in cases:
        proc = run_cli(["-m", "aio_examples", "run", "resnet_18", *flags, "--output", str(tmp_path / "r")],
                       timeout=120)
        assert proc.returncode == 2 and message in proc.stderr, proc.stderr
        assert len(proc.stderr.strip().splitlines()) == 1
        assert not (tmp_path / "r" / "results.jsonl").exists()


def test_top_k_drops_the_background_class_of_1001_way_models():
    logits = np.zeros((2, 1001))
    logits[0, 8] = 5.0          # class 7 once the background column is gone
    logits[1, 1] = 5.0          # class 0
    ev = TopK()
    ev.add(Batch((), [("a", 7), ("b", 1)]), [logits])
    assert ev.metrics()["top_1"] == 0.5 and ev.predictions()[0]["top_5"][0] == 7


def _coco(tmp_path, boxes):
    """A COCO folder: one 200x100 image per entry of `boxes` (x, y, w, h of category 3), and its annotations."""
    images, annotations = [], []
    for i, box in enumerate(boxes, 1):
        Image.new("RGB", (200, 100), (i * 40, 90, 20)).save(tmp_path / f"{i:012d}.jpg")
        images.append({"id": i, "file_name": f"{i:012d}.jpg", "width": 200, "height": 100})
        annotations.append({"id": i, "image_id": i, "category_id": 3, "bbox": list(box), "area": box[2] * box[3],
                            "iscrowd": 0})
    anno = tmp_path / "instances.json"
    anno.write_text(json.dumps({"images": images, "annotations": annotations,
                                "categories": [{"id": 3, "name": "car"}]}))
    return anno


def test_detections_map_back_to_the_original_image_and_score_like_pycocotools(tmp_path):
    anno = _coco(tmp_path, [(20, 10, 100, 50), (0, 0, 50, 50)])
    ds = open_dataset("coco", str(tmp_path), str(anno))
    spec = get_model("ssdlite320_mobilenet_v3")
    [batch] = ds.batches(spec, 2, {"input_size": 320}, None)
    # SSDlite's reference resize is to its fixed 320 x 320, whatever the image's aspect ratio
    assert batch.inputs[0].shape == (2, 3, 320, 320) and batch.inputs[1].tolist() == [[320, 320]] * 2
    assert batch.targets[0] == (1, (200 / 320, 100 / 320, 0, 0))
    # the first image's box found exactly (at model scale), the second's found half-shifted
    sx, sy = 320 / 200, 320 / 100
    outputs = [np.array([[20 * sx, 10 * sy, 120 * sx, 60 * sy]]), np.array([3]), np.array([0.9]),
               np.array([[25 * sx, 0, 75 * sx, 50 * sy]]), np.array([3]), np.array([0.8])]
    ev = CocoEvaluation(ds.ground_truth())
    ev.add(batch, outputs)
    assert ev.predictions()[0]["bbox"] == pytest.approx([20, 10, 100, 50])
    metrics = ev.metrics()
    from pycocotools.coco import COCO
    from pycocotools.cocoeval import COCOeval

    gt = COCO(str(anno))
    direct = COCOeval(gt, gt.loadRes(ev.predictions()), "bbox")
    direct.evaluate(), direct.accumulate(), direct.summarize()
    assert metrics == {"map": direct.stats[0], "ap50": direct.stats[1]}
    assert metrics["ap50"] == pytest.approx(0.5, abs=0.01)  # IoU of the shifted box is 1/3: half the images found
    assert coco_detection(gt, [], [1, 2]) == {"map": 0.0, "ap50": 0.0}


def test_a_detector_on_coco_through_the_runner_writes_results_pycocotools_rescores(tmp_path):
    anno = _coco(tmp_path, [(20, 10, 100, 50), (0, 0, 50, 50), (100, 50, 90, 40)])
    ds = open_dataset("coco", str(tmp_path), str(anno))
    spec = get_model("ssdlite320_mobilenet_v3")
    [r] = run(RunRequest(spec, ["eager"], "fp32", 2, ThreadChoice(1, "--threads"), {"input_size": 320},
                         rule=StopRule(timeout_s=0.3), dataset=ds), tmp_path / "out")
    assert r.status == "ok" and r.accuracy["samples"] == 3 and set(r.accuracy["metrics"]) == {"map", "ap50"}
    from pycocotools.coco import COCO
    from pycocotools.cocoeval import COCOeval

    results = json.loads(Path(r.accuracy["predictions"]).read_text())
    assert {d["image_id"] for d in results} <= {1, 2, 3} and all(len(d["bbox"]) == 4 for d in results)
    gt = COCO(str(anno))
    direct = COCOeval(gt, gt.loadRes(results), "bbox")
    direct.evaluate(), direct.accumulate(), direct.summarize()
    assert r.accuracy["metrics"]["map"] == pytest.approx(max(direct.stats[0], 0.0), abs=1e-6)


def test_backends_take_a_datasets_later_batches_in_their_own_form():
    spec = get_model("squeezenet")
    module = spec.build(shape={"input_size": 32})
    first, later = torch.rand(2, 3, 32, 32), torch.rand(2, 3, 32, 32)
    from aio_examples.backends import BACKENDS, PrepareContext

    ctx = PrepareContext("squeezenet", spec.task, "vision", {"input_size": 32}, 2, "w")
    with torch.no_grad():
        expected = module(later).numpy()
        for name in ("eager", "onnxruntime", "openvino"):
            prepared = BACKENDS[name].prepare(module, (first,), "fp32", 1, ctx)
            out = prepared.fn(*prepared.feed((later,)))
            got = out[0] if isinstance(out, (list, tuple)) else out
            assert np.allclose(np.asarray(got), expected, atol=1e-4), name


@pytest.mark.slow       # a long end-to-end run: the second tier keeps the default one under 15 minutes
def test_a_sweep_scores_each_model_on_its_dataset_and_records_a_point_whose_data_fails(trained_digits, tmp_path):
    images, labels, _ = trained_digits
    broken = tmp_path / "broken"
    broken.mkdir()
    (broken / "a.png").write_bytes(b"not a png")        # named by its labels file: found only when decoded
    (broken / "val_map.txt").write_text("a.png 1\n")
    config = tmp_path / "accuracy.toml"
    config.write_text(f"""
models = ["squeezenet"]
backends = ["eager", "onnxruntime"]
threads = [1]
batch_sizes = [4]
timeout = 0.3
num_samples = 40
shape = {{input_size = 32}}
output = "{tmp_path / 'out'}"
[datasets.imagenet]
path = "{images}"
labels = "{labels}"
""")
    proc = run_cli(["-m", "aio_examples", "sweep", "--config", str(config), "--quiet"])
    assert proc.returncode == 0, proc.stderr[-2000:]
    records = load_records(tmp_path / "out" / "results.jsonl")
    assert {r.backend for r in records} == {"eager", "onnxruntime"}
    assert all(r.dataset == "imagenet" and r.accuracy["samples"] == 40 for r in records)
    assert len({r.accuracy["dataset"]["digest"] for r in records}) == 1      # the same samples everywhere
    again = run_cli(["-m", "aio_examples", "sweep", "--config", str(config), "--quiet"])
    assert "2 already done" in again.stdout                               # resumed by the dataset's key too
    config.write_text(config.read_text().replace(str(labels), str(broken / "val_map.txt"))
                      .replace(str(images), str(broken)).replace(str(tmp_path / "out"), str(tmp_path / "out2")))
    proc = run_cli(["-m", "aio_examples", "sweep", "--config", str(config), "--quiet"])
    [first, *_] = load_records(tmp_path / "out2" / "results.jsonl")
    assert first.status == "failed" and "cannot be decoded" in first.reason


@pytest.mark.slow      # every backend compiles or converts the model: the second tier
def test_every_backend_keeps_the_trained_digits_accuracy_at_every_precision_it_runs(trained_digits, tmp_path):
    images, labels, weights = trained_digits
    ds = open_dataset("imagenet", str(images), str(labels))
    records = run(RunRequest(get_model("resnet_18"), ["eager", "torchscript", "inductor", "aio", "onnxruntime",
                                                      "openvino"], ["fp32", "bf16", "int8"], 8,
                             ThreadChoice(2, "--threads"), {"input_size": 32}, weights=str(weights),
                             rule=StopRule(timeout_s=0.5), dataset=ds), tmp_path, reference=True)
    ran = [r for r in records if r.status != "unsupported"]
    assert len(ran) >= 10 and {r.precision for r in ran} == {"fp32", "bf16", "int8"}
    for r in ran:
        assert r.status == "ok", (r.backend, r.precision, r.reason)
        assert r.accuracy["metrics"]["top_1"] >= 0.85
        assert abs(r.accuracy["delta_vs_eager_fp32"]["top_1"]) <= 0.01


@pytest.mark.slow       # trains a classifier first (~40 s): the second tier keeps the default one under 15 minutes
def test_loadgen_accuracy_mode_scores_the_served_answers(trained_digits, tmp_path):
    """LoadGen issues every digit once; the answers it logged, scored, are eager fp32's own."""
    pytest.importorskip("mlperf_loadgen")
    images, labels, weights = trained_digits
    out = tmp_path / "results"
    proc = run_cli(["-m", "aio_examples", "loadgen", "resnet_18", "--weights", str(weights), "--input-size", "32",
                    "--scenario", "Offline", "--mode", "accuracy", "--dataset", f"imagenet:{images}",
                    "--labels", str(labels), "-b", "8", "--backend", "eager", "--instances", "2",
                    "--threads-per-instance", "1", "--output", str(out)], timeout=900)
    assert proc.returncode == 0, proc.stderr[-2000:]
    [r] = load_records(out / "results.jsonl")
    assert r.scenario["mode"] == "accuracy" and r.dataset == "imagenet" and r.accuracy["samples"] == 360
    assert r.accuracy["metrics"]["top_1"] >= 0.85
    # the same model on the same samples, served in batches by two processes: exactly eager fp32's answers
    assert r.accuracy["delta_vs_eager_fp32"]["top_1"] == 0
    log = json.loads((out / r.instance["loadgen_logs"] / "mlperf_log_accuracy.json").read_text())
    assert sorted(e["qsl_idx"] for e in log) == list(range(360))          # every sample answered once
    assert "top_1" in proc.stdout
