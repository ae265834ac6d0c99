"""Every zoo model on every backend at fp32 and bf16: it runs, or says why not. Never a crash.

Slow (compiles every model): run with `python3 -m pytest -m slow -o addopts=""`.
"""

import pytest

from aio_examples import benchmark
from aio_examples.backends import BACKENDS
from aio_examples.models import ZOO

pytestmark = pytest.mark.slow

SMALL = {"image-classification": {"input_size": 64}, "object-detection": {"input_size": 128}}
SIZES = {"inception_v3": {"input_size": 80}, "vit_b_16": {"input_size": 224}}


def small_shape(spec):
    if spec.name in SIZES:
        return SIZES[spec.name]
    if spec.task in SMALL:
        return SMALL[spec.task]
    return {"seq_len": 8, "new_tokens": 4} if spec.task == "text-generation" else {"seq_len": 32}


@pytest.mark.parametrize("precision", ["fp32", "bf16"])
@pytest.mark.parametrize("backend", sorted(b for b in BACKENDS if b != "eager"))
@pytest.mark.parametrize("name", sorted(ZOO))
def test_every_model_runs_or_says_why(name, backend, precision):
    r = benchmark(name, backend=backend, precision=precision, threads=2, num_runs=3, timeout=20,
                  **small_shape(ZOO[name]))
    assert r.status in ("ok", "unsupported"), f"{name}/{backend}/{precision}: {r.status}: {r.reason}"
    if r.status == "ok":
        assert r.latency_ms["n"] == 3 and r.precision == precision
    else:
        assert r.reason
