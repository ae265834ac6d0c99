import json

import pandas as pd
import pytest

from aio_examples.core import records as res
from aio_examples.core.errors import UsageError


def record(**kw):
    base = {"model": "m", "task": "custom", "backend": "eager", "precision": "fp32", "batch_size": 1, "threads": 1,
                "input_shape": {"batch_size": 1}, "latency_ms": {"median": 2.0}, "samples_ms": [1.0, 2.0, 3.0]}
    base.update(kw)
    return res.Result(**base)


def test_append_and_load_round_trip(tmp_path):
    res.append(tmp_path, record())
    res.append(tmp_path, record(backend="inductor", status="unsupported", reason="why"))
    df = pd.read_json(tmp_path / "results.jsonl", lines=True)
    assert df["backend"].tolist() == ["eager", "inductor"]
    assert list(df.columns[:3]) == ["schema_version", "run_id", "timestamp"]
    assert [r["status"] for r in res.load(tmp_path)] == ["ok", "unsupported"]


def test_corrupt_line_is_named(tmp_path):
    (tmp_path / "results.jsonl").write_text(json.dumps({"a": 1}) + "\n{broken\n")
    with pytest.raises(UsageError, match="results.jsonl:2"):
        res.load(tmp_path)


def test_unknown_status_is_refused():
    with pytest.raises(ValueError):
        record(status="great")


def test_table_shows_reasons():
    text = res.format_table([record(), record(backend="x", status="unsupported", reason="no bf16 kernel")])
    assert "eager" in text and "x/fp32: unsupported: no bf16 kernel" in text


def test_debug_mode_levels():
    import logging

    from aio_examples.core.log import configure, debug_mode, logger

    assert debug_mode({}) == 2
    assert debug_mode({"AIO_DEBUG_MODE": "4"}) == 4
    with pytest.raises(UsageError, match="AIO_DEBUG_MODE='x'"):
        debug_mode({"AIO_DEBUG_MODE": "x"})
    configure(1)
    assert not logger.isEnabledFor(logging.WARNING) and logger.isEnabledFor(logging.ERROR)
    configure(3)
    assert logger.isEnabledFor(logging.DEBUG)
    configure(0)
    assert not logger.isEnabledFor(logging.CRITICAL)
    configure(2)
