"""The whole support matrix: every zoo model on every backend at every precision runs with outputs
matching eager fp32, or says why it cannot. Each model x backend runs in its own process, so one
compiler's crash is a recorded cell, not a lost test run.

Slow (compiles every model several times, about 10 minutes per model on 2 cores):
`python3 -m pytest -m slow -o addopts=""`. One test per model, one model of each family first, so a
CI run that has to stop early has still covered every kind of model. `AIO_TEST_DEADLINE` (epoch
seconds) makes the tests that could not finish before it skip, saying so, instead of being killed.
"""

import json
import os
import time

import pytest
from conftest import run_cli

from aio_examples.models import ZOO

pytestmark = pytest.mark.slow

FIRST = ["resnet_18", "distilbert_base", "ssdlite320_mobilenet_v3", "gpt2"]
ORDER = FIRST + [m for m in ZOO if m not in FIRST]
MINUTES_PER_MODEL = 15      # the slowest models here (retinanet, vgg_16) take about this long


@pytest.mark.parametrize("model", ORDER)
def test_every_cell_runs_or_says_why(tmp_path, model):
    deadline = float(os.environ.get("AIO_TEST_DEADLINE", "inf"))
    left = deadline - time.time()
    if left < MINUTES_PER_MODEL * 60:
        pytest.skip(f"CI time budget: {max(left, 0) / 60:.0f} min left, a model needs up to {MINUTES_PER_MODEL}")
    out = tmp_path / "matrix"
    proc = run_cli(["-m", "aio_examples", "matrix", "--models", model, "--output", str(out), "-t", "1"],
                   timeout=3600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    records = [json.loads(line) for line in (out / "results.jsonl").read_text().splitlines()]
    assert {(r["backend"], r["precision"]) for r in records} >= {("eager", "fp32"), ("aio", "int8")}
    # fail_accuracy is a measured answer (e.g. int8 flushing a random-weight model's tiny outputs to 0),
    # shown as such; failed and timeout are bugs.
    bad = [f"{r['model']}/{r['backend']}/{r['precision']}: {r['status']}: {r['reason']}" for r in records
           if r["status"] not in ("ok", "unsupported", "fail_accuracy")]
    assert not bad, "\n".join(bad)
    assert all(r["reason"] for r in records if r["status"] != "ok")
    for r in records:
        if r["status"] in ("ok", "fail_accuracy"):
            assert r["check"]["passed"] == (r["status"] == "ok") and r["precision_mode"], r
