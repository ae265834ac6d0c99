"""What crashed a process on this CPU: the candidates aio stops trying.

A native crash (a segfault, an illegal instruction, an abort) in an engine cannot be caught: the process of the
configuration dies, and the driver that started it records `crashed` (drivers/launcher.py). So that aio does not
die the same way on every run, its process keeps a journal (`AIO_JOURNAL`, a file the driver names) of the
candidate it is preparing or timing. When the process dies, the driver hands the journal and the signal to
`remember`: the candidate is then remembered as crashing on this CPU with this version of its engine, for that
model at that precision (a crash is often one graph's: the same engine may run every other model), and aio leaves
it out of its tuning there (`known`), saying why in the record. A new version of the engine is tried again.
"""

import importlib.metadata
import json
import os
from datetime import UTC, datetime

from ..core.forkserver import JOURNAL_ENV
from ..core.paths import cache_dir, write_json_atomic

# The distribution whose version a strategy's crash belongs to
PACKAGES = {"compiled": "torch", "inductor": "torch", "eager": "torch", "onnxruntime": "onnxruntime",
            "openvino": "openvino", "llama_cpp": "llama-cpp-python", "onnxruntime_genai": "onnxruntime-genai",
            "openvino_genai": "openvino-genai"}


def engine_version(strategy: str) -> str:
    """`package version` of the engine a strategy runs on (a split's segments: each engine's own)."""
    package = PACKAGES.get(strategy, strategy)
    try:
        return f"{package} {importlib.metadata.version(package)}"
    except importlib.metadata.PackageNotFoundError:
        return f"{package} (not installed)"


def _store():
    from ..core.records import machine_fingerprint
    from ..machine.environment import capture

    return cache_dir("crashes") / f"{machine_fingerprint(capture({})) or 'unknown-cpu'}.json"


def _read(path) -> dict:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return {}


def trying(strategy: str, stage: str, model: str, precision: str) -> None:
    """Write down what this process is about to run (nothing when no driver asked for a journal)."""
    path = os.environ.get(JOURNAL_ENV)
    if not path:
        return
    try:
        with open(path, "w") as f:         # a few bytes per stage: no fsync, the kernel keeps it past our death
            json.dump({"strategy": strategy, "stage": stage, "model": model, "precision": precision,
                       "engine": engine_version(strategy)}, f)
    except OSError:
        pass


def done() -> None:
    """Nothing risky under way any more: a crash from here on is not a candidate's."""
    path = os.environ.get(JOURNAL_ENV)
    if path:
        try:
            os.unlink(path)
        except OSError:
            pass


def remember(journal_path, signal_name: str) -> dict | None:
    """After a process died of `signal_name`: the candidate its journal names, remembered for this CPU and its
    engine's version (what is remembered, or None when the journal names none)."""
    entry = _read(journal_path) if journal_path and os.path.exists(journal_path) else {}
    if not entry.get("strategy"):
        return None
    entry.update(signal=signal_name, when=datetime.now(UTC).isoformat(timespec="seconds"))
    store = _store()
    known_ = _read(store)
    known_[_key(entry["strategy"], entry["engine"], entry["model"], entry["precision"])] = entry
    write_json_atomic(store, known_, indent=1)
    return entry


def _key(strategy: str, engine: str, model: str, precision: str) -> str:
    return f"{strategy}|{engine}|{model}|{precision}"


def known(strategy: str, model: str, precision: str) -> str | None:
    """Why `strategy` is not tried for `model` at `precision` here: it crashed a process on this CPU with this
    version of its engine."""
    entry = _read(_store()).get(_key(strategy, engine_version(strategy), model, precision))
    if not entry:
        return None
    return (f"crashed a process with {entry['signal']} while {entry['stage']} {model} at {precision} on this CPU "
            f"with {entry['engine']} ({entry['when']}); not tried again until its version changes")
