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
    assert [r.status for r in res.read(tmp_path)] == ["ok", "unsupported"]


def test_corrupt_line_is_named(tmp_path):
    (tmp_path / "results.jsonl").write_text(record().to_json() + "\n{broken\n")
    with pytest.raises(UsageError, match="results.jsonl:2 is not a JSON record"):
        res.read(tmp_path)


def test_a_line_that_is_not_a_record_is_named_with_what_it_lacks(tmp_path):
    (tmp_path / "results.jsonl").write_text(record().to_json() + "\n" + json.dumps({"model": "m"}) + "\n")
    with pytest.raises(UsageError, match=r"results.jsonl:2 is not a result record \(no backend, precision"):
        res.load_records([tmp_path])
    with pytest.raises(UsageError, match="neither a results.jsonl file nor a folder holding one"):
        res.load_records([tmp_path / "missing"])


def test_a_record_round_trips_through_its_dict_and_keeps_fields_it_does_not_know():
    r = record(scenario={"name": "latency", "key": "latency", "round_s": 1.0}, dataset="synthetic")
    d = {**r.to_dict(), "from_a_newer_release": {"x": 1}}
    back = res.Result.from_dict(d)
    assert back.to_dict() == d and back.key() == r.key()
    with pytest.raises(UsageError, match="schema '2.0'"):
        res.Result.from_dict({**d, "schema_version": "2.0"})


def test_old_records_load_with_the_scenario_they_were_measured_in():
    old = {k: v for k, v in record().to_dict().items() if k not in ("scenario", "dataset")}
    old["schema_version"] = "1.3"
    assert res.Result.from_dict(old).key().scenario == "latency"
    assert res.Result.from_dict({**old, "instance": {"aggregate": True, "group": "g"}}).key().scenario == "window"
    assert res.Result.from_dict({**old, "turns": [[10, 0.0]]}).key().scenario == "latency"
    assert res.Result.from_dict(old).key().dataset == "synthetic"


def test_the_configuration_key_keeps_input_shapes_and_machines_apart():
    env = {"cpu_model": "X", "arch": "x86_64", "logical_cpus": 2, "hostname": "a"}
    small = record(input_shape={"batch_size": 1, "input_size": 64}, env=env)
    large = record(input_shape={"batch_size": 1, "input_size": 96}, env=env)
    renamed = record(input_shape={"batch_size": 1, "input_size": 64}, env={**env, "hostname": "b"})
    other = record(input_shape={"batch_size": 1, "input_size": 64}, env={**env, "cpu_model": "Y"})
    assert small.key() != large.key() and small.key().shape == "input_size=64"
    assert small.key() == renamed.key()               # the hostname is no part of the machine's identity
    assert small.key() != other.key() and small.key().setting != other.key().setting
    assert small.key().ignoring(["shape"]) == large.key().ignoring(["shape"])


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


def test_records_are_strict_json_a_value_that_is_not_finite_is_null(tmp_path):
    r = record(latency_ms={"median": 2.0, "ci_low": float("-inf"), "ci_rel_halfwidth": float("inf")},
               metrics={"x": float("nan"), "nested": [1.0, float("inf")]})

    def refuse(name):
        raise ValueError(f"{name} in a record")

    back = json.loads(r.to_json(), parse_constant=refuse)
    assert back["latency_ms"] == {"median": 2.0, "ci_low": None, "ci_rel_halfwidth": None}
    assert back["metrics"] == {"x": None, "nested": [1.0, None]}
    res.append(tmp_path, r)
    assert res.read(tmp_path)[0].latency_ms["ci_low"] is None
