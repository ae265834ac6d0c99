"""Output checks against eager fp32: numeric closeness, task agreement, verdicts."""

import numpy as np
import pytest
import torch

from aio_examples import benchmark
from aio_examples.measurement.output_check import COSINE_MIN, check_outputs, flatten


def logits(seed, n=1, classes=1000):
    return torch.randn(n, classes, generator=torch.Generator().manual_seed(seed))


def test_identical_outputs_pass_with_zero_error():
    ref = logits(0)
    c = check_outputs("image-classification", ref, ref.clone(), "fp32", judge_agreement=True)
    assert c.passed and c.metrics["max_abs_err"] == 0 and c.metrics["cosine"] == pytest.approx(1.0)
    assert c.metrics["agreement"] == {"top1": 1.0, "top5": 1.0}


def test_bf16_rounding_passes_at_bf16_but_not_at_fp32():
    ref = logits(0)
    rounded = ref.to(torch.bfloat16)
    assert check_outputs("image-classification", ref, rounded, "bf16", judge_agreement=False).passed
    noisy = ref + 0.05 * logits(1)
    fp32 = check_outputs("image-classification", ref, noisy, "fp32", judge_agreement=False)
    assert not fp32.passed and "cosine" in fp32.reason and str(COSINE_MIN["fp32"]) in fp32.reason


def test_unrelated_outputs_fail_at_every_precision():
    for precision in COSINE_MIN:
        c = check_outputs("text-classification", logits(0, 4, 2), logits(1, 4, 2), precision, judge_agreement=False)
        assert not c.passed, precision


def test_top1_flip_fails_only_when_agreement_is_judged():
    ref = torch.tensor([[1.0, 0.999, -5.0, -5.0, -5.0, -5.0]])
    out = torch.tensor([[0.999, 1.0, -5.0, -5.0, -5.0, -5.0]])
    judged = check_outputs("image-classification", ref, out, "bf16", judge_agreement=True)
    assert not judged.passed and "top1" in judged.reason
    assert check_outputs("image-classification", ref, out, "bf16", judge_agreement=False).passed


def test_qa_span_and_generation_prefix_agreement():
    start, end = logits(0, 2, 16), logits(1, 2, 16)
    moved = end.clone()
    moved[0] = moved[0].roll(3)
    c = check_outputs("question-answering", (start, end), (start, moved), "fp32", judge_agreement=False)
    assert c.metrics["agreement"]["span"] == 0.5
    tokens = torch.tensor([[1, 2, 3, 4]])
    c = check_outputs("text-generation", (tokens, logits(0)), (torch.tensor([[1, 2, 9, 4]]), logits(0)), "bf16",
                judge_agreement=True)
    assert c.metrics["agreement"]["token_prefix"] == 0.5 and not c.passed


def test_detection_matches_boxes_by_label_and_iou_in_any_key_order():
    boxes = torch.tensor([[0.0, 0, 10, 10], [20, 20, 40, 40]])
    ref = [{"boxes": boxes, "labels": torch.tensor([1, 2]), "scores": torch.tensor([0.9, 0.8])}]
    shifted = [{"boxes": boxes + 1, "scores": torch.tensor([0.8, 0.9]), "labels": torch.tensor([1, 3])}]
    c = check_outputs("object-detection", ref, shifted, "fp32", judge_agreement=True)
    assert c.metrics["agreement"]["boxes_matched"] == 0.5 and not c.passed
    assert check_outputs("object-detection", ref, ref, "fp32", judge_agreement=True).passed
    unjudged = check_outputs("object-detection", ref, shifted, "fp32", judge_agreement=False)
    assert unjudged.passed and unjudged.metrics["judged"] == [] and unjudged.metrics["agreement"]["boxes_matched"] == 0.5


def test_structure_mismatch_and_non_finite_outputs_fail():
    ref = logits(0)
    assert "structure" in check_outputs("image-classification", ref, (ref, ref), "fp32", False).reason
    broken = ref.clone()
    broken[0, 0] = float("nan")
    assert not check_outputs("image-classification", ref, broken, "int8", False).passed


def test_flatten_reads_numpy_and_nested_outputs_alike():
    t = logits(0)
    arrays = flatten({"a": [t, t.numpy()], "b": (t.to(torch.float16),)})
    assert len(arrays) == 3 and all(isinstance(a, np.ndarray) for a in arrays)


class Noisy(torch.nn.Module):
    """A model whose outputs change from call to call: no backend can agree with a reference run."""

    def forward(self, x):
        return x + torch.rand_like(x)


def test_a_run_that_disagrees_with_eager_fp32_is_fail_accuracy_not_a_speedup(tmp_path):
    r = benchmark(Noisy(), example_inputs=(torch.zeros(2, 64),), num_runs=3, output=tmp_path)
    assert r.status == "fail_accuracy" and "cosine" in r.reason
    assert r.speedup_vs_eager_fp32 is None and r.latency_ms["n"] == 3
    assert r.check["passed"] is False and r.check["tolerance"]["cosine_min"] == COSINE_MIN["fp32"]


def test_a_failed_check_names_the_reference_that_ran():
    ref = logits(0)
    noisy = ref + 0.05 * logits(1)
    onnx = check_outputs("image-classification", ref, noisy, "fp32", False, reference_name="onnxruntime-fp32-unoptimized")
    assert not onnx.passed and "ONNX Runtime fp32 (graph optimizations off)" in onnx.reason
    assert "eager" not in onnx.reason and onnx.to_dict()["reference"] == "onnxruntime-fp32-unoptimized"
    assert "eager fp32" in check_outputs("image-classification", ref, noisy, "fp32", False).reason
