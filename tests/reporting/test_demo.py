"""The example notebooks' helpers: what ran and what did not, and where the time goes."""

import matplotlib.pyplot as plt
import pytest

from aio_examples.core.records import Result
from aio_examples.measurement.profile import NAMES
from aio_examples.reporting import demo


def record(backend, status="ok", reason=None, strategy=None, shares=None, model="gpt2"):
    return Result(model=model, task="text-generation", backend=backend, precision="fp32", batch_size=1, threads=1,
                  input_shape={}, status=status, reason=reason, strategy=strategy,
                  metrics={"profile": {"categories_share": shares}} if shares else {})


def test_results_split_into_what_ran_and_what_did_not_with_why():
    runs = [record("aio", strategy="compiled"), record("onnxruntime", "unsupported", "no KV cache in a graph"),
            record("eager"), record("openvino", "failed", "compile error", model="bert_base")]
    ok, not_run = demo.split_results(runs)
    assert [r.backend for r in ok] == ["aio", "eager"]
    assert not_run.to_dict("records") == [
        {"model": "gpt2", "backend": "onnxruntime", "precision": "fp32", "status": "unsupported",
         "reason": "no KV cache in a graph"},
        {"model": "bert_base", "backend": "openvino", "precision": "fp32", "status": "failed",
         "reason": "compile error"}]
    ok, not_run = demo.split_results(runs[:1])          # all ok: an empty table that still has its columns
    assert len(ok) == 1 and not_run.empty and list(not_run.columns) == demo.NOT_RUN_COLUMNS


def test_profile_figure_draws_a_bar_per_backend_that_ran_ok():
    runs = [record("aio", strategy="openvino", shares={"convolution": 0.7, "element-wise": 0.3}),
            record("eager", strategy="eager", shares={"convolution": 0.5, "matmul/linear": 0.5}),
            record("onnxruntime", "unsupported", "no KV cache in a graph")]
    fig = demo.profile_figure(runs, "squeezenet")
    try:
        ax = fig.axes[0]
        assert [t.get_text() for t in ax.get_yticklabels()] == ["aio (openvino)", "eager"]
        assert ax.get_title() == "squeezenet"
        stacked = [0.0, 0.0]              # each backend's bars add up to its whole profiled time
        for bar in ax.patches:
            stacked[round(bar.get_y() + bar.get_height() / 2)] += bar.get_width()
        assert stacked == [pytest.approx(100), pytest.approx(100)]
        convolution = ax.patches[:2]      # the first category's bars, aio's then eager's
        assert NAMES[0] == "convolution" and [b.get_width() for b in convolution] == [pytest.approx(70),
                                                                                       pytest.approx(50)]
    finally:
        plt.close(fig)
