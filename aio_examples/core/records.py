"""The record model: one `Result` per measured (or refused) configuration, written and read back.

`results.jsonl` holds one record per line; `pandas.read_json(path, lines=True)` loads it. Every reader
(report, compare, history, sweep resumption) loads records with `load_records` and identifies a
configuration by `Result.key` (a `ConfigKey`). The schema is documented in docs/results.md; records of
every 1.x schema load. Bump SCHEMA_VERSION on any change of the fields.
"""

import hashlib
import json
import math
import os
import sys
import uuid
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field, fields
from datetime import UTC, datetime
from pathlib import Path
from typing import NamedTuple

from .errors import AioError, UsageError

SCHEMA_VERSION = "1.9"
# `crashed`: the configuration's process died (a signal: a segfault, an illegal instruction, the OOM killer), see `crash`
STATUSES = ("ok", "fail_accuracy", "unsupported", "failed", "timeout", "crashed")
REQUIRED = ("model", "backend", "precision", "batch_size", "threads", "status")
# The scenario of records before schema 1.6: interleaved latency rounds ("key" is what identifies it).
DEFAULT_SCENARIO = {"name": "latency", "key": "latency"}
KEY_FIELDS = ("model", "task", "backend", "precision", "batch_size", "threads", "instances", "allocator", "shape",
              "scenario", "dataset", "machine", "fpmath", "env_axes")
# The key's fields added since schema 1.8 and their values in every record before: left out of a key's digest at
# these values, so the digests made before (a sweep's point ids) still name the same configurations.
KEY_DEFAULTS = {"fpmath": "strict", "env_axes": "default"}


class ConfigKey(NamedTuple):
    """What makes two records measurements of the same configuration; the one identity every reader uses.

    `shape` is the input shape without the batch (`input_size=224`, `seq_len=128,new_tokens=32`);
    `machine` the hardware fingerprint (machine_fingerprint), not the hostname; `fpmath` the fast-math mode of an
    fp32 configuration (`strict` for any other, and for records before 1.9); `env_axes` torch's runtime variables
    set in its process (machine/env_axes.py: `LRU_CACHE_CAPACITY=0`), or `default`.
    """

    model: str
    task: str
    backend: str
    precision: str
    batch_size: int
    threads: int
    instances: int
    allocator: str
    shape: str
    scenario: str
    dataset: str
    machine: str
    fpmath: str = "strict"
    env_axes: str = "default"

    def identity(self) -> dict:
        """The key as a dict for digests, the fields added since 1.8 left out at their old values."""
        return {k: v for k, v in self._asdict().items() if KEY_DEFAULTS.get(k, object()) != v}

    def ignoring(self, names) -> "ConfigKey":
        """The key with `names` set to "*", so configurations that differ only in them match."""
        return self._replace(**{n: "*" for n in names})

    @property
    def setting(self) -> tuple:
        """Everything but backend, precision and fast-math mode: the configurations a speedup over eager fp32
        (strict) compares."""
        return tuple(v for k, v in zip(KEY_FIELDS, self, strict=True) if k not in ("backend", "precision", "fpmath"))

    def __str__(self) -> str:
        return " ".join(str(v) for v in self)


def machine_fingerprint(env: dict | None) -> str | None:
    """Identity of the hardware a record was measured on: CPU model, ISA, CPUs, NUMA nodes, architecture.

    A machine restricted to fewer CPUs than its host has (a container's or a Ray node's CPU set: `machine_cpus`)
    is a machine of its own. Not the hostname (CI runners and containers change names) and not the libraries (a nightly run compares
    library builds on one machine). None when the record carries no environment.
    """
    if not (env or {}).get("cpu_model"):
        return None
    parts = [env["cpu_model"], env.get("arch"), env.get("logical_cpus"), env.get("numa_nodes"),
             ",".join(env.get("isa") or [])]
    if env.get("machine_cpus") not in (None, env.get("logical_cpus")):     # a smaller share of the host
        parts.append(f"cpus={env['machine_cpus']}")
    return hashlib.sha256("|".join(map(str, parts)).encode()).hexdigest()[:12]


def machine_description(env: dict | None) -> str:
    env = env or {}
    return f"{env.get('cpu_model') or 'unknown CPU'}, {env.get('logical_cpus') or '?'} CPUs, {env.get('arch') or '?'}"


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
    check: dict | None = None                        # outputs vs eager fp32, see measurement/output_check.py
    probe: dict | None = None                        # machine probe per round (machine/probe.py), when asked
    turns: list | None = None                        # [passes, start (Unix s)] per turn, taking turns (drivers/turns.py)
    strategy: str | None = None                      # how the backend ran it (the optimized backend chooses)
    warnings: list = field(default_factory=list)
    backend_info: dict = field(default_factory=dict)
    binding: dict = field(default_factory=dict)
    contention: dict | None = None   # what other processes took of our cores while measuring (machine/contention.py)
    instances: int = 1                               # processes measured side by side (multi-instance)
    instance: dict | None = None                     # this record's place among them, or their aggregate
    point_id: str | None = None                      # the sweep point this record answers (for resuming)
    scenario: dict = field(default_factory=lambda: dict(DEFAULT_SCENARIO))  # how it was driven (scenarios/)
    dataset: str = "synthetic"                       # where its inputs came from (datasets/)
    accuracy: dict | None = None                     # task metrics on a labelled dataset (docs/datasets.md)
    fpmath: dict | None = None      # fp32's fast-math mode: {mode, read_back} (machine/fpmath.py); None: not fp32
    crash: dict | None = None       # how its process died: signal, exit code, phase, the last lines of its stderr
    env: dict = field(default_factory=dict)
    run_id: str = field(default_factory=new_run_id)
    timestamp: str = field(default_factory=lambda: datetime.now(UTC).isoformat(timespec="seconds"))
    schema_version: str = SCHEMA_VERSION
    unknown: dict = field(default_factory=dict, repr=False)   # fields of a newer 1.x schema, kept as read

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
        d.pop("unknown")
        return {"schema_version": d.pop("schema_version"), "run_id": d.pop("run_id"),
                "timestamp": d.pop("timestamp"), **d, **self.unknown}

    def to_json(self) -> str:
        """Strict JSON: a value that is not a finite number (an interval that could not be computed) is null,
        never NaN or Infinity, which strict parsers (JavaScript's, databases') refuse."""
        return json.dumps(strict(self.to_dict()), default=str, allow_nan=False)

    def to_series(self):
        """One pandas row with nested fields flattened (`latency_ms.median`, ...), samples left out."""
        import pandas as pd

        d = self.to_dict()
        d.pop("samples_ms")
        return pd.json_normalize(d).iloc[0]

    def to_frame(self):
        return self.to_series().to_frame().T

    @classmethod
    def from_dict(cls, d: dict, where: str = "record") -> "Result":
        """A record read back: any 1.x schema (fields it lacks take their defaults, fields this version does
        not know are kept in `unknown` and written back as they were). `where` names it in errors."""
        if not isinstance(d, dict):
            raise UsageError(f"{where} is not a result record (a JSON {type(d).__name__}); "
                             "accepted: lines written by aio-examples")
        missing = [k for k in REQUIRED if k not in d]
        if missing:
            raise UsageError(f"{where} is not a result record (no {', '.join(missing)}); "
                             "accepted: lines written by aio-examples")
        if str(d.get("schema_version", "1.0")).split(".")[0] != SCHEMA_VERSION.split(".")[0]:
            raise UsageError(f"{where} has schema {d['schema_version']!r}; accepted: {SCHEMA_VERSION.split('.')[0]}.x")
        known = {f.name for f in fields(cls)} - {"unknown"}
        values = {k: v for k, v in d.items() if k in known}
        values.setdefault("task", "unknown")
        values.setdefault("input_shape", {})
        if "scenario" not in d:
            values["scenario"] = _scenario_of_old(d)
        try:
            r = cls(**values)
        except (TypeError, ValueError) as exc:
            raise UsageError(f"{where} is not a valid result record ({exc})") from None
        r.unknown = {k: v for k, v in d.items() if k not in known}
        return r

    @property
    def machine(self) -> str | None:
        """The hardware fingerprint of the environment it was measured in (None when it carries none)."""
        return machine_fingerprint(self.env)

    @property
    def allocator(self) -> str:
        return (self.env or {}).get("allocator") or "default"

    @property
    def fpmath_mode(self) -> str:
        """The fast-math mode it was measured in; `strict` for records before 1.9 and other precisions."""
        return (self.fpmath or {}).get("mode") or "strict"

    @property
    def env_axes(self) -> str:
        return env_axes_label((self.env or {}).get("env_axes"))

    @property
    def label(self) -> str:
        """backend/precision, and the fast-math mode when not strict: how messages and tables name it."""
        mode = self.fpmath_mode
        return f"{self.backend}/{self.precision}" + (f" fpmath {mode}" if mode != "strict" else "")

    @property
    def shape_label(self) -> str:
        return shape_label(self.input_shape)

    @property
    def is_instance(self) -> bool:
        """One of several processes measured side by side (summarised by their aggregate record)."""
        return (self.instance or {}).get("index") is not None

    def key(self, machine: str | None = None) -> ConfigKey:
        """This record's configuration; `machine` stands in for a record that carries no environment (a
        point whose process died was measured where its run was)."""
        return ConfigKey(self.model, self.task, self.backend, self.precision, self.batch_size, self.threads,
                         self.instances, self.allocator, self.shape_label,
                         (self.scenario or DEFAULT_SCENARIO).get("key") or "latency", self.dataset or "synthetic",
                         self.machine or machine or "unknown", self.fpmath_mode, self.env_axes)


def strict(value):
    """`value` with every float that is not finite replaced by None, at any depth."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: strict(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [strict(v) for v in value]
    return value


def env_axes_label(variables: dict | None) -> str:
    """The env_axes part of a configuration key: `LRU_CACHE_CAPACITY=0,THP_MEM_ALLOC_ENABLE=1`, or `default`."""
    return ",".join(f"{k}={v}" for k, v in sorted((variables or {}).items())) or "default"


def shape_label(input_shape: dict | None) -> str:
    """The shape part of a configuration key: the input shape without the batch, e.g. `input_size=224`."""
    return ",".join(f"{k}={v}" for k, v in sorted((input_shape or {}).items()) if k != "batch_size")


def _scenario_of_old(d: dict) -> dict:
    """The scenario a record written before schema 1.6 was measured in, from the fields it carries."""
    instance = d.get("instance") or {}
    if instance:
        return {"name": "window", "key": "window"}
    if d.get("turns"):
        return {"name": "turns", "key": "latency"}
    return dict(DEFAULT_SCENARIO)


def check_output_dir(path) -> Path:
    """Create the output folder and prove it is writable before anything is measured."""
    if not str(path).strip():
        raise UsageError(f"--output {str(path)!r} is empty; accepted: a folder path (it would otherwise be the "
                         "current folder, often the source tree)")
    out = Path(path)
    try:
        out.mkdir(parents=True, exist_ok=True)
        probe = out / f".write-test-{os.getpid()}"
        probe.write_text("")
        probe.unlink()
    except OSError as exc:
        raise UsageError(f"--output {str(path)!r} is not writable ({exc.strerror}); "
                         "accepted: a folder this user can create and write") from exc
    results = out / "results.jsonl"
    if results.exists() and (not results.is_file() or not os.access(results, os.W_OK)):
        raise UsageError(f"--output {str(path)!r} holds a results.jsonl that is not a writable file; "
                         "accepted: a folder whose results.jsonl, if any, records can be appended to")
    return out


LOCK_FILE = ".aio-examples.lock"


@contextmanager
def lock_output(out_dir: Path, what: str):
    """Hold the results folder for one driver (a sweep, a matrix, a throughput run): a second one into the same
    folder would measure every point again, on the same cores, at the same time as the first. The lock is the
    kernel's (flock): it ends with the process that held it, however it ends."""
    import fcntl
    import socket

    path = Path(out_dir) / LOCK_FILE
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        holder = os.pread(fd, 1000, 0).decode(errors="replace").strip() or "another process"
        os.close(fd)
        raise UsageError(f"--output {str(out_dir)!r} is in use by {holder}; accepted: a folder no other sweep, "
                         "matrix or throughput run is writing to (wait for it, or choose another)") from None
    try:
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{what} (pid {os.getpid()} on {socket.gethostname()}, since "
                      f"{datetime.now(UTC).isoformat(timespec='seconds')})".encode(), 0)
        yield
    finally:
        os.close(fd)            # closing releases the lock


def append(out_dir: Path, result: Result) -> Path:
    """Append one record as one line in one write, flushed to disk: all of it or nothing.

    A write the disk cannot take whole (full, quota) is taken back, so no half line is left for the next
    record to be glued onto; the record is then kept in `$AIO_CACHE_DIR/unsaved/` (or, failing that,
    printed to stderr) and RecordNotSaved says where.
    """
    path = Path(out_dir) / "results.jsonl"
    line = (result.to_json() + "\n").encode()
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    except OSError as exc:
        raise _not_saved(path, result, exc.strerror) from None
    try:
        written = 0
        try:
            written = os.write(fd, line)
            if written == len(line):
                os.fsync(fd)
                return path
            problem = f"only {written} of {len(line)} bytes fit"
        except OSError as exc:          # the write itself, or the flush of a write the disk could not keep
            problem = exc.strerror or str(exc)
        end = os.lseek(fd, 0, os.SEEK_CUR)          # with O_APPEND: where our bytes (if any) ended
        if written and os.fstat(fd).st_size == end:  # nobody appended after us: take our bytes back
            os.ftruncate(fd, end - written)
    finally:
        os.close(fd)
    raise _not_saved(path, result, problem)


class RecordNotSaved(AioError):
    """A measured record could not be appended to its results file (it was kept elsewhere)."""


def _not_saved(path: Path, result: Result, problem: str) -> RecordNotSaved:
    return RecordNotSaved(f"{path}: the record of {result.model} {result.backend}/{result.precision} was not "
                          f"appended ({problem}); {_keep_unsaved(result)}")


def _keep_unsaved(result: Result) -> str:
    """Put a record that could not be appended where it can be recovered; say where."""
    from .paths import cache_dir, safe_name

    try:
        target = cache_dir("unsaved") / safe_name(f"{result.run_id}-{result.model}-{result.backend}-{result.precision}.json")
        target.write_text(result.to_json() + "\n")
        return f"it is kept in {target} (append it to a results.jsonl to use it)"
    except OSError:
        sys.stderr.write(result.to_json() + "\n")
        return "it was printed to stderr above (nothing else could be written either)"


def read(path, since: int = 0) -> list[Result]:
    """Records of a results.jsonl file (or of `results.jsonl` inside a folder), from byte offset `since`.

    A line that is not a record is an error naming the file and line, except a last line cut short (no
    line end: a write that a crash or a full disk tore, before appends were all or nothing), which is
    skipped with a warning: the good records before it are not held hostage by it.
    """
    path = Path(path)
    if path.is_dir():
        path = path / "results.jsonl"
    with open(path, "rb") as fh:
        fh.seek(since)
        lines = fh.read().split(b"\n")
    torn = lines.pop()                  # after the last line end: empty, or a torn last line
    records = []
    for number, line in enumerate(lines, 1):
        if line.strip():
            records.append(_parse(line, _where(path, number, since)))
    if torn.strip():
        where = _where(path, len(lines) + 1, since)
        try:
            records.append(_parse(torn, where))
        except UsageError as exc:
            from .log import logger

            logger.warning("%s: skipped (a line cut short by an interrupted write)", exc)
    return records


def _where(path: Path, number: int, since: int) -> str:
    return f"{path}:{number}" if not since else f"{path}, line {number} after byte {since},"


def _parse(line: bytes, where: str) -> Result:
    try:
        d = json.loads(line)
    except json.JSONDecodeError as exc:
        raise UsageError(f"{where} is not a JSON record ({exc.msg})") from exc
    return Result.from_dict(d, where)


def load_records(paths) -> list[Result]:
    """Records of results.jsonl files or folders (a folder: every results.jsonl below it), in order."""
    records = []
    for p in map(Path, [paths] if isinstance(paths, (str, Path)) else paths):
        files = sorted(p.rglob("results.jsonl")) if p.is_dir() else [p] if p.is_file() else []
        if not files:
            raise UsageError(f"{str(p)!r} is neither a results.jsonl file nor a folder holding one; "
                             "accepted: result files or folders with them")
        for f in files:
            records.extend(read(f))
    return records


def records_in(out_dir, since: int = 0) -> list[Result]:
    """Records in `<out_dir>/results.jsonl` (from byte `since`); none while nothing has been written."""
    path = Path(out_dir) / "results.jsonl"
    return read(path, since) if path.exists() else []


def end_offset(out_dir) -> int:
    """Where the next record of `<out_dir>/results.jsonl` will start: read only what a run adds after it."""
    path = Path(out_dir) / "results.jsonl"
    return path.stat().st_size if path.exists() else 0


CRASH_LINES_SHOWN = 5     # of a crashed configuration's stderr, under the table (the record keeps more)


def format_table(results: list[Result]) -> str:
    """A readable comparison table of results."""
    import pandas as pd

    rows = []
    for r in results:
        lat = r.latency_ms or {}
        rows.append({
            "model": r.model, "backend": r.backend, "precision": r.precision,
            **({"fpmath": r.fpmath_mode} if any(x.fpmath_mode != "strict" for x in results) else {}),
            "batch": r.batch_size,
            "threads": r.threads, "status": r.status,
            "median ms": _fmt(lat.get("median")), "p90 ms": _fmt(lat.get("p90")),
            "+-CI %": _fmt(100 * lat["ci_rel_halfwidth"], 1) if lat.get("ci_rel_halfwidth") not in (None, float("inf")) else "-",
            "throughput": f"{r.throughput['value']:.2f} {r.throughput['unit']}" if r.throughput else "-",
            "vs eager fp32": f"{r.speedup_vs_eager_fp32:.2f}x" if r.speedup_vs_eager_fp32 else "-",
            "check": _check_cell(r), "strategy": r.strategy or "-",
            "n": lat.get("n", 0), "confident": "yes" if r.confidence_met else "no",
            **({"accuracy (vs eager fp32)": _accuracy_cell(r)} if any(x.accuracy for x in results) else {}),
        })
    table = pd.DataFrame(rows).to_string(index=False)
    notes = [f"  {r.label}: {r.status}: {r.reason}" for r in results if r.reason]
    notes += [f"  {r.label}: stderr: {line}" for r in results if r.crash
              for line in (r.crash.get("stderr_tail") or [])[-CRASH_LINES_SHOWN:]]
    notes += [f"  {r.label}: warning: {w}" for r in results for w in r.warnings]
    return table + ("\n" + "\n".join(notes) if notes else "")


def _check_cell(r: Result) -> str:
    """Output check against eager fp32: pass/FAIL and the cosine similarity (probabilities: the largest absolute
    error, which is what judges them)."""
    if not r.check:
        return "-"
    verdict, cosine, error = "pass" if r.check["passed"] else "FAIL", r.check.get("cosine"), r.check.get("max_abs_err")
    if "max_abs_err" in (r.check.get("judged") or []) and error is not None:
        return f"{verdict} err {error:.4f}"
    return verdict + (f" cos {cosine:.4f}" if cosine is not None else "")


def _accuracy_cell(r: Result) -> str:
    """Task metrics in points, each with its change from eager fp32 on the same samples."""
    if not r.accuracy or not r.accuracy.get("metrics"):
        return "-"
    from .scores import UNBOUNDED, shown

    delta = r.accuracy.get("delta_vs_eager_fp32") or {}
    return " ".join(f"{k} {shown(k, v)}" + (f" ({delta[k]:+.3g})" if k in UNBOUNDED and k in delta else
                                            f" ({100 * delta[k]:+.1f})" if k in delta else "")
                    for k, v in r.accuracy["metrics"].items())


def _fmt(value, digits=2) -> str:
    return "-" if value is None else f"{value:.{digits}f}"
