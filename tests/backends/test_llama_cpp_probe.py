"""llama.cpp's probe of its extra buffer types (AMX, repacked weights): real child processes that crash with
SIGILL, the decision and its cache, the refusal, and the real probe and engine on this machine's CPU."""

import os
import shutil
import sys
from pathlib import Path

import pytest
from test_llm_engines import engine_run, needs

from aio_examples.backends import llama_cpp_probe as probe

# A probe child that dies from SIGILL in the settings `crash_in` names ("on", "off") and otherwise runs, and
# writes each setting it was started with to a counter file first.
CHILD = """
import os, signal, sys
counter, setting, crash_in = sys.argv[1:]
with open(counter, "a") as fh:
    fh.write(setting + "\\n")
if setting in crash_in.split(","):
    os.kill(os.getpid(), signal.SIGILL)
"""
MACHINE = {"cpu": "a test's", "llama_cpp_python": "none"}


@pytest.fixture(autouse=True)
def _own_cache(tmp_path, monkeypatch):
    """Decisions cached by one test are not another's; the machine's memory bandwidth (the generation roofline's,
    half a minute to measure at full size) is the session's, when it has been measured."""
    session, own = Path(os.environ["AIO_CACHE_DIR"]), tmp_path / "cache"
    if (session / "bandwidth").is_dir():
        shutil.copytree(session / "bandwidth", own / "bandwidth")
    monkeypatch.setenv("AIO_CACHE_DIR", str(own))


def crashing(counter: Path, crash_in: str):
    return lambda extra: [sys.executable, "-c", CHILD, str(counter), "on" if extra else "off", crash_in]


def started(counter: Path) -> list:
    return counter.read_text().split() if counter.exists() else []


def test_a_crash_with_extra_buffer_types_turns_them_off_once(tmp_path):
    counter = tmp_path / "started"
    decided = probe.decide("Q4_0", crashing(counter, "on"), MACHINE)
    assert started(counter) == ["on", "off"]            # the caller survived both children
    assert decided.extra_buffer_types is False and not decided.unsupported
    assert "SIGILL" in decided.reason and "on this CPU" in decided.reason
    info = decided.info()
    assert info["extra_buffer_types"] is False and "SIGILL" in info["extra_buffer_types_why"]
    again = probe.decide("Q4_0", crashing(counter, "on"), MACHINE)
    assert started(counter) == ["on", "off"]            # cached: no child this time
    assert again.extra_buffer_types is False and again.reason == decided.reason and again.probe_s is None
    # another tensor type is probed on its own
    assert probe.decide("Q8_0", crashing(counter, ""), MACHINE).extra_buffer_types is True
    assert started(counter) == ["on", "off", "on"]


def test_a_crash_either_way_is_unsupported(tmp_path):
    counter = tmp_path / "started"
    decided = probe.decide("Q8_0", crashing(counter, "on,off"), MACHINE)
    assert started(counter) == ["on", "off"]
    assert decided.unsupported and "crashed with SIGILL on this CPU" in decided.reason
    assert "with and without its extra buffer types" in decided.reason
    assert probe.decide("Q8_0", crashing(counter, "on,off"), MACHINE).unsupported
    assert started(counter) == ["on", "off"]


def test_a_failed_probe_leaves_the_default_and_is_not_cached(tmp_path):
    fails = lambda extra: [sys.executable, "-c", "raise SystemExit('no such model')"]
    decided = probe.decide("Q4_0", fails, MACHINE)
    assert decided.extra_buffer_types is True and "exit code 1: no such model" in decided.reason
    counter = tmp_path / "started"
    assert probe.decide("Q4_0", crashing(counter, ""), MACHINE).reason is None
    assert started(counter) == ["on"]


@needs("llama_cpp")
def test_the_setting_takes_effect_in_llama_cpp():
    """llama.cpp's own log: without extra buffer types every weight sits in a plain CPU buffer."""
    import llama_cpp

    command = probe.probe_command("Q4_0")
    off = probe.run_probe(command(False))
    assert off.ran, off.failure()
    assert off.buffer_types and set(off.buffer_types) <= set(probe.PLAIN_BUFFERS)
    on = probe.run_probe(command(True))
    features = llama_cpp.llama_print_system_info().decode()
    if on.ran and "REPACK = 1" in features and "AVX2 = 1" in features:     # Q4_0 is repacked for AVX2
        assert set(on.buffer_types) - set(probe.PLAIN_BUFFERS), on.buffer_types


@needs("llama_cpp")
def test_llama_cpp_loads_as_a_cached_decision_says(tmp_path):
    """Decisions a crashing child made, cached for this machine: int4 loads without extra buffer types, and int8
    is refused naming the signal."""
    counter = tmp_path / "started"
    probe.decide("Q4_0", crashing(counter, "on"), probe.machine())
    probe.decide("Q8_0", crashing(counter, "on,off"), probe.machine())
    results = {r.precision: r for r in engine_run(tmp_path, "llama_cpp", ["int4", "int8"], with_eager=False) if r.backend == "llama_cpp"}
    int4, int8 = results["int4"], results["int8"]
    assert int4.status == "ok", int4.reason
    assert int4.backend_info["extra_buffer_types"] is False
    assert "SIGILL" in int4.backend_info["extra_buffer_types_why"]
    assert int8.status == "unsupported" and "crashed with SIGILL on this CPU" in int8.reason
    assert started(counter) == ["on", "off", "on", "off"]      # the backend read both from the cache


@needs("llama_cpp")
@pytest.mark.slow       # llama.cpp loaded in each probe child on this CPU; the decisions are tested above on crashing children
def test_the_real_probe_decides_and_llama_cpp_runs_int8_and_int4(tmp_path):
    decided = {t: probe.decision(t) for t in ("Q8_0", "Q4_0")}
    for d in decided.values():
        assert d.probe_s is not None and (d.extra_buffer_types or d.reason)
    if "amx" not in " ".join(probe.machine()["isa"]):         # no AMX: the extra buffer types are plain AVX code
        assert all(d.extra_buffer_types for d in decided.values())
    results = [r for r in engine_run(tmp_path, "llama_cpp", ["int8", "int4"]) if r.backend == "llama_cpp"]
    for r in results:
        d = decided[{"int8": "Q8_0", "int4": "Q4_0"}[r.precision]]
        if d.unsupported:
            assert r.status == "unsupported" and r.reason == d.reason
            continue
        assert r.status == "ok", r.reason
        assert r.backend_info["extra_buffer_types"] is d.extra_buffer_types
        assert r.backend_info["probe_buffer_types"] == list(d.buffer_types)
        assert "probe_s" not in r.backend_info               # read from the cache the probes above wrote
