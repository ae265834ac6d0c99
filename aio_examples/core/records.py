"""Result records: versioned, flat-ish JSON, one per measured configuration.

`results.jsonl` holds one record per line; `pandas.read_json(path, lines=True)` loads it.
The schema is documented in docs/results.md; bump SCHEMA_VERSION on any breaking change.
"""

import json
import os
import uuid
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from pathlib import Path

from .errors import UsageError

SCHEMA_VERSION = "1.5"
STATUSES = ("ok", "fail_accuracy", "unsupported", "failed", "timeout")


def new_run_id() -> str:
    return datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ-") + uuid.uuid4().hex[:8]


@dataclass
class Result:
    """One measured (or refused) configuration."""

    model: str
    task: str
    backend: str
    precision: str
    batch_size: int
    threads: int
    input_shape: dict
    status: str = "ok"
    reason: str | None = None
    weights: str = "random"
    weights_path: str | None = None
    precision_mode: str | None = None
    latency_ms: dict | None = None
    throughput: dict | None = None
    first_pass_ms: float | None = None
    prepare_s: float | None = None
    warmup: dict | None = None
    measured_s: float | None = None
    stop_reason: str | None = None
    confidence_met: bool = False
    confidence_target: dict | None = None
    peak_rss_mb: float | None = None
    samples_ms: list = field(default_factory=list)
    metrics: dict = field(default_factory=dict)      # task extras, e.g. time to first token
    speedup_vs_eager_fp32: float | None = None       # only for status ok: a wrong answer is no speedup
    check: dict | None = None                        # outputs vs eager fp32, see checks.py
    probe: dict | None = None                        # machine probe per round (machine_probe.py), when asked
    turns: list | None = None                        # [passes, start (Unix s)] per turn, taking turns (turns.py)
    strategy: str | None = None                      # how the backend ran it (the optimized backend chooses)
    warnings: list = field(default_factory=list)
    backend_info: dict = field(default_factory=dict)
    binding: dict = field(default_factory=dict)
    instances: int = 1                               # processes measured side by side (multi-instance)
    instance: dict | None = None                     # this record's place among them, or their aggregate
    point_id: str | None = None                      # the sweep point this record answers (for resuming)
    env: dict = field(default_factory=dict)
    run_id: str = field(default_factory=new_run_id)
    timestamp: str = field(default_factory=lambda: datetime.now(UTC).isoformat(timespec="seconds"))
    schema_version: str = SCHEMA_VERSION

    def __post_init__(self):
        if self.status not in STATUSES:
            raise ValueError(f"status {self.status!r} is not one of {STATUSES}")

    @classmethod
    def for_config(cls, spec, backend: str, precision: str, batch_size: int, threads: int, shape: dict,
                   **fields) -> "Result":
        """A record its caller fills: a point whose process crashed or never started, or an aggregate."""
        return cls(model=spec.name, task=spec.task, backend=backend, precision=precision, batch_size=batch_size,
                   threads=threads, input_shape=spec.input_shape(batch_size, shape), **fields)

    @property
    def median_ms(self) -> float | None:
        return (self.latency_ms or {}).get("median")

    def to_dict(self) -> dict:
        d = asdict(self)
        return {"schema_version": d.pop("schema_version"), "run_id": d.pop("run_id"),
                "timestamp": d.pop("timestamp"), **d}

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), default=str)

    def to_series(self):
        """One pandas row with nested fields flattened (`latency_ms.median`, ...), samples left out."""
        import pandas as pd

        d = self.to_dict()
        d.pop("samples_ms")
        return pd.json_normalize(d).iloc[0]

    def to_frame(self):
        return self.to_series().to_frame().T


def check_output_dir(path) -> Path:
    """Create the output folder and prove it is writable before anything is measured."""
    out = Path(path)
    try:
        out.mkdir(parents=True, exist_ok=True)
        probe = out / f".write-test-{os.getpid()}"
        probe.write_text("")
        probe.unlink()
    except OSError as exc:
        raise UsageError(f"--output {str(path)!r} is not writable ({exc.strerror}); "
                         "accepted: a folder this user can create and write") from exc
    return out


def append(out_dir: Path, result: Result) -> Path:
    """Append one record as one line in one write, flushed to disk, so a kill leaves no half line."""
    path = Path(out_dir) / "results.jsonl"
    line = (result.to_json() + "\n").encode()
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    try:
        os.write(fd, line)
        os.fsync(fd)
    finally:
        os.close(fd)
    return path


def load(path, since: int = 0, require: tuple = ()) -> list[dict]:
    """Records of a results.jsonl file (or of `results.jsonl` inside a folder), from byte offset `since`.

    `require`: fields every record must have; a record without one is an error naming the file and line.
    """
    path = Path(path)
    if path.is_dir():
        path = path / "results.jsonl"
    records = []
    with open(path, "rb") as fh:
        fh.seek(since)
        for number, line in enumerate(fh, 1):
            if line.strip():
                try:
                    records.append(json.loads(line))
                except json.JSONDecodeError as exc:
                    where = f"{path}:{number}" if not since else f"{path}, line {number} after byte {since},"
                    raise UsageError(f"{where} is not a JSON record ({exc.msg})") from exc
                missing = [k for k in require if not isinstance(records[-1], dict) or k not in records[-1]]
                if missing:
                    raise UsageError(f"{path}:{number} is not a result record (no {', '.join(missing)}); "
                                     "accepted: lines written by aio-examples")
    return records


def records_in(out_dir, since: int = 0) -> list[dict]:
    """Records in `<out_dir>/results.jsonl` (from byte `since`); none while nothing has been written."""
    path = Path(out_dir) / "results.jsonl"
    return load(path, since) if path.exists() else []


def end_offset(out_dir) -> int:
    """Where the next record of `<out_dir>/results.jsonl` will start: read only what a run adds after it."""
    path = Path(out_dir) / "results.jsonl"
    return path.stat().st_size if path.exists() else 0


def format_table(results: list[Result]) -> str:
    """A readable comparison table of results."""
    import pandas as pd

    rows = []
    for r in results:
        lat = r.latency_ms or {}
        rows.append({
            "model": r.model, "backend": r.backend, "precision": r.precision, "batch": r.batch_size,
            "threads": r.threads, "status": r.status,
            "median ms": _fmt(lat.get("median")), "p90 ms": _fmt(lat.get("p90")),
            "+-CI %": _fmt(100 * lat["ci_rel_halfwidth"], 1) if lat.get("ci_rel_halfwidth") not in (None, float("inf")) else "-",
            "throughput": f"{r.throughput['value']:.2f} {r.throughput['unit']}" if r.throughput else "-",
            "vs eager fp32": f"{r.speedup_vs_eager_fp32:.2f}x" if r.speedup_vs_eager_fp32 else "-",
            "check": _check_cell(r), "strategy": r.strategy or "-",
            "n": lat.get("n", 0), "confident": "yes" if r.confidence_met else "no",
        })
    table = pd.DataFrame(rows).to_string(index=False)
    notes = [f"  {r.backend}/{r.precision}: {r.status}: {r.reason}" for r in results if r.reason]
    notes += [f"  {r.backend}/{r.precision}: warning: {w}" for r in results for w in r.warnings]
    return table + ("\n" + "\n".join(notes) if notes else "")


def _check_cell(r: Result) -> str:
    """Output check against eager fp32: pass/FAIL and the cosine similarity."""
    if not r.check:
        return "-"
    cosine = r.check.get("cosine")
    return ("pass" if r.check["passed"] else "FAIL") + (f" cos {cosine:.4f}" if cosine is not None else "")


def _fmt(value, digits=2) -> str:
    return "-" if value is None else f"{value:.{digits}f}"
