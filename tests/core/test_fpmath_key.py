"""fp32 fast math and torch's runtime variables in the record model: which configurations a mode makes, whose
tolerances judge them, and the configuration key that tells them apart (records before 1.9 read as strict)."""

import pytest

from aio_examples.core import precision as prec
from aio_examples.core import records as res
from aio_examples.core.errors import UsageError


def test_a_mode_applies_to_fp32_and_every_other_precision_runs_once_strict():
    assert prec.fpmath_configs(["fp32", "int8"], ["strict", "bf16"]) == [("fp32", "strict"), ("fp32", "bf16"),
                                                                         ("int8", "strict")]
    assert prec.fpmath_configs(["bf16"], ["strict"]) == [("bf16", "strict")]
    with pytest.raises(UsageError, match="--fpmath-mode bf16 applies to fp32 models .* not to bf16, int8"):
        prec.fpmath_configs(["bf16", "int8"], ["bf16"])
    with pytest.raises(UsageError, match="--fpmath-mode 'tf32' is unknown; accepted: strict, bf16, f16"):
        prec.fpmath_configs(["fp32"], ["tf32"])


def test_fast_math_is_judged_like_the_type_it_rounds_to():
    assert prec.judged_as("fp32") == "fp32" and prec.judged_as("fp32", "strict") == "fp32"
    assert prec.judged_as("fp32", "bf16") == "bf16" and prec.judged_as("fp32", "f16") == "fp16"
    assert prec.judged_as("int8", "bf16") == "int8"


def record(**fields) -> res.Result:
    return res.Result.from_dict({"model": "resnet_18", "task": "image-classification", "backend": "eager",
                                 "precision": "fp32", "batch_size": 1, "threads": 1, "status": "ok",
                                 "input_shape": {"batch_size": 1, "input_size": 32}, **fields})


def test_the_key_tells_fast_math_and_runtime_variables_apart_and_old_records_read_as_strict():
    old = record(schema_version="1.8")
    strict = record(fpmath={"mode": "strict", "read_back": {}})
    fast = record(fpmath={"mode": "bf16", "read_back": {"INFERENCE_PRECISION_HINT": "bf16"}})
    cached = record(env={"env_axes": {"THP_MEM_ALLOC_ENABLE": "1", "LRU_CACHE_CAPACITY": "0"}})
    assert old.fpmath_mode == "strict" and old.key() == strict.key()
    assert fast.key() != strict.key() and fast.key().fpmath == "bf16" and fast.label == "eager/fp32 fpmath bf16"
    assert cached.key().env_axes == "LRU_CACHE_CAPACITY=0,THP_MEM_ALLOC_ENABLE=1" and old.key().env_axes == "default"
    assert cached.key() != old.key() and cached.key().setting != old.key().setting
    assert fast.key().setting == old.key().setting          # fast math's speedup is over strict eager fp32's
    assert res.Result.from_dict(fast.to_dict()).key() == fast.key()          # written and read back
    assert fast.key().ignoring(["fpmath"]) == strict.key().ignoring(["fpmath"])     # compare --ignore fpmath
    # the digest of a key made before these fields existed (a sweep's point id) is unchanged
    assert old.key().identity() == {k: v for k, v in old.key()._asdict().items() if k not in res.KEY_DEFAULTS}
    assert fast.key().identity()["fpmath"] == "bf16"
