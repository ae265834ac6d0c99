"""The history store: every run's records with their environment, in one SQLite file.

Default path `results/history.sqlite` (`--history PATH` or `AIO_HISTORY` elsewhere). Each `add` is one
transaction, so an interrupted or failed add leaves the store as it was; the same records added twice are
stored once. A file that is not a usable database is never recreated over: the error names it and
nothing in it is touched.
"""

import hashlib
import json
import os
import sqlite3
from datetime import UTC, datetime
from pathlib import Path

import numpy as np

from ..core.errors import UsageError
from ..core.records import KEY_FIELDS, Result, machine_description, strict
from .runs import Run, from_files

DEFAULT_PATH = Path("results") / "history.sqlite"
SCHEMA_VERSION = 1
LOCK_TIMEOUT_S = 10.0
MIN_RUNS_FOR_NOISE = 5          # run-to-run spread is only trusted from this many earlier runs
# What tells a model's configurations apart in its trend: the configuration key but for the model itself
# (and its task) and the machine (history runs are compared on one machine).
TREND_FIELDS = tuple(f for f in KEY_FIELDS if f not in ("model", "task", "machine"))

SCHEMA = """
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS runs (
    id INTEGER PRIMARY KEY,
    digest TEXT NOT NULL UNIQUE,          -- of the records: the same run is stored once
    source TEXT NOT NULL,
    label TEXT,
    added_at TEXT NOT NULL,
    started_at TEXT,                      -- earliest record timestamp
    machine TEXT,                         -- hardware fingerprint (environment.machine_fingerprint)
    machine_desc TEXT,
    git_commit TEXT,
    versions TEXT,                        -- JSON: library versions of the run
    env TEXT                              -- JSON: the full environment of its first record
);
CREATE TABLE IF NOT EXISTS records (
    id INTEGER PRIMARY KEY,
    run_id INTEGER NOT NULL REFERENCES runs(id) ON DELETE CASCADE,
    model TEXT NOT NULL, backend TEXT NOT NULL, precision TEXT NOT NULL,
    batch_size INTEGER NOT NULL, threads INTEGER NOT NULL, instances INTEGER NOT NULL,
    allocator TEXT, shape TEXT, status TEXT NOT NULL,
    median_ms REAL, throughput REAL, unit TEXT, timestamp TEXT,
    record TEXT NOT NULL                  -- JSON: the record as written, samples included
);
CREATE INDEX IF NOT EXISTS records_config ON records (model, backend, precision, batch_size, threads);
CREATE INDEX IF NOT EXISTS runs_machine ON runs (machine, started_at);
"""


def default_path() -> Path:
    return Path(os.environ.get("AIO_HISTORY") or DEFAULT_PATH)


class History:
    """`with History.open(path) as h: h.add(...)`."""

    def __init__(self, conn: sqlite3.Connection, path: Path):
        self.conn, self.path = conn, path

    @classmethod
    def open(cls, path=None, create: bool = True) -> "History":
        path = Path(path) if path else default_path()
        if not path.exists():
            if not create:
                raise UsageError(f"history database {str(path)!r} does not exist; accepted: a file made by "
                                 "'aio-examples history add' (--history PATH or AIO_HISTORY)")
            try:
                path.parent.mkdir(parents=True, exist_ok=True)
            except OSError as exc:
                raise UsageError(f"history database {str(path)!r} cannot be created ({exc.strerror})") from exc
        try:
            conn = sqlite3.connect(path, timeout=LOCK_TIMEOUT_S, isolation_level=None)
            conn.execute("PRAGMA foreign_keys = ON")
            h = cls(conn, path)
            h._migrate()
        except sqlite3.Error as exc:
            raise _db_error(path, exc) from exc
        return h

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.conn.close()

    def _migrate(self):
        tables = {r[0] for r in self.conn.execute("SELECT name FROM sqlite_master WHERE type='table'")}
        if tables and "meta" not in tables:
            raise sqlite3.DatabaseError("it is a SQLite database, but not an aio-examples history")
        if "meta" in tables:
            row = self.conn.execute("SELECT value FROM meta WHERE key='schema_version'").fetchone()
            if row and int(row[0]) > SCHEMA_VERSION:
                raise sqlite3.DatabaseError(f"its schema {row[0]} is newer than this aio-examples ({SCHEMA_VERSION})")
            return
        with self._transaction():
            for statement in filter(str.strip, SCHEMA.split(";")):
                self.conn.execute(statement)
            self.conn.execute("INSERT INTO meta VALUES ('schema_version', ?)", (str(SCHEMA_VERSION),))

    def _transaction(self):
        return _Transaction(self)

    # ------------------------------------------------------------ writing

    def add(self, run: Run, label: str | None = None) -> tuple[int, bool]:
        """Store a run's records in one transaction. Returns (run id, whether it was new)."""
        if label is not None and (not label.strip() or not label.isprintable()):
            raise UsageError(f"--label {label!r} is invalid; accepted: one line of printable text (it is shown "
                             "as a line of 'history list')")
        records = [r.to_dict() for r in run.records]
        digest = hashlib.sha256("\n".join(json.dumps(r, sort_keys=True, default=str) for r in records)
                                .encode()).hexdigest()
        existing = self.conn.execute("SELECT id FROM runs WHERE digest = ?", (digest,)).fetchone()
        if existing:
            return existing[0], False
        machine = run.machine           # the fingerprint compare and the nightly baseline look up
        env = next((r.env for r in run.records if r.machine == machine), {})
        versions = {k: v for k, v in (env.get("versions") or {}).items() if v}
        with self._transaction():
            cur = self.conn.execute(
                "INSERT INTO runs (digest, source, label, added_at, started_at, machine, machine_desc, git_commit, "
                "versions, env) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                (digest, run.label, label, datetime.now(UTC).isoformat(timespec="seconds"), run.started_at, machine,
                 machine_description(env) if env else None, env.get("git_commit"), json.dumps(versions),
                 json.dumps(env, default=str)))
            run_id = cur.lastrowid
            for r, d in zip(run.records, records, strict=True):
                k = r.key(machine)           # the machine is stored once, with the run
                self.conn.execute(
                    "INSERT INTO records (run_id, model, backend, precision, batch_size, threads, instances, "
                    "allocator, shape, status, median_ms, throughput, unit, timestamp, record) "
                    "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                    (run_id, k.model, k.backend, k.precision, k.batch_size, k.threads, k.instances, k.allocator,
                     k.shape, r.status, r.median_ms, (r.throughput or {}).get("value"),
                     (r.throughput or {}).get("unit"), r.timestamp, json.dumps(strict(d), default=str)))
        return run_id, True

    # ------------------------------------------------------------ reading

    def runs(self, machine: str | None = None) -> list[dict]:
        sql = ("SELECT r.id, r.started_at, r.added_at, r.source, r.label, r.machine, r.machine_desc, r.git_commit, "
               "r.versions, COUNT(x.id) FROM runs r LEFT JOIN records x ON x.run_id = r.id")
        args = ()
        if machine:
            sql, args = sql + " WHERE r.machine = ?", (machine,)
        rows = self.conn.execute(sql + " GROUP BY r.id ORDER BY r.started_at, r.id", args).fetchall()
        return [{"id": i, "started_at": s, "added_at": a, "source": src, "label": lab, "machine": m,
                 "machine_desc": md, "git_commit": g, "versions": json.loads(v or "{}"), "records": n}
                for i, s, a, src, lab, m, md, g, v, n in rows]

    def latest(self, machine: str | None, exclude: int | None = None, before: str | None = None) -> int | None:
        """The most recent run on this machine (by when it was measured), other than `exclude`, measured
        before `before` (an ISO timestamp) when given."""
        row = self.conn.execute(
            "SELECT id FROM runs WHERE machine IS ? AND id IS NOT ? AND (? IS NULL OR started_at < ?) "
            "ORDER BY started_at DESC, id DESC LIMIT 1", (machine, exclude, before, before)).fetchone()
        return row[0] if row else None

    def run(self, ref: str) -> Run:
        """`latest` or a run id, as a comparison side."""
        if ref == "latest":
            row = self.conn.execute("SELECT id FROM runs ORDER BY started_at DESC, id DESC LIMIT 1").fetchone()
        elif ref.isdigit():
            row = self.conn.execute("SELECT id FROM runs WHERE id = ?", (int(ref),)).fetchone()
        else:
            raise UsageError(f"history run {ref!r} is invalid; accepted: history:ID (see 'aio-examples history "
                             "list') or history:latest")
        if not row:
            raise UsageError(f"history run {ref!r} is not in {str(self.path)!r}; accepted: an id from "
                             "'aio-examples history list'")
        records = [Result.from_dict(json.loads(t), f"history:{row[0]} record {i}") for i, (t,) in enumerate(
            self.conn.execute("SELECT record FROM records WHERE run_id = ? ORDER BY id", (row[0],)))]
        return Run(f"history:{row[0]}", records)

    def series(self, model: str, **where) -> list[dict]:
        """One row per stored record of `model` (filtered by backend, precision, ...), oldest run first: its
        configuration (the fields of `Result.key`), status, median with its interval, and throughput."""
        sql = ("SELECT r.id, r.started_at, r.git_commit, r.versions, r.machine, x.record "
               "FROM records x JOIN runs r ON r.id = x.run_id WHERE x.model = ?")
        args = [model]
        for column, value in where.items():
            if value is not None:
                sql += f" AND x.{column} = ?"
                args.append(value)
        rows = []
        for run_id, started, commit, versions, machine, record in self.conn.execute(
                sql + " ORDER BY r.started_at, r.id", args):
            r = Result.from_dict(json.loads(record), f"history:{run_id} record")
            if r.is_instance:
                continue
            key = {k: v for k, v in r.key(machine)._asdict().items() if k in TREND_FIELDS}
            lat = r.latency_ms or {}
            rows.append({"run": run_id, "started_at": started, "git": (commit or "")[:10],
                         "torch": json.loads(versions or "{}").get("torch"), **key, "status": r.status,
                         "median_ms": r.median_ms, "ci_low": lat.get("ci_low"), "ci_high": lat.get("ci_high"),
                         "throughput": (r.throughput or {}).get("value"), "unit": (r.throughput or {}).get("unit")})
        return rows

    def run_noise(self, machine: str | None, keys, before: int | None = None) -> dict:
        """key -> (standard deviation of log median between consecutive earlier runs, its degrees of
        freedom), from MIN_RUNS_FOR_NOISE runs on.

        This is how much a configuration moves from one run to the next on this machine, which the passes
        within one run cannot show. A run with repeats counts with the median of its processes, as a
        comparison judges it. Differences of consecutive runs, over sqrt(2), so a real step change in the
        past inflates it less than a plain standard deviation would.
        """
        wanted, by_key = set(keys), {}
        for model in sorted({k.model for k in wanted}):
            for run_id, record in self.conn.execute(
                    "SELECT r.id, x.record FROM records x JOIN runs r ON r.id = x.run_id WHERE r.machine IS ? "
                    "AND x.model = ? AND x.status = 'ok' AND x.median_ms > 0 AND r.id IS NOT ? "
                    "ORDER BY r.started_at, r.id", (machine, model, before)):
                r = Result.from_dict(json.loads(record), f"history:{run_id} record")
                if not r.is_instance and (key := r.key(machine)) in wanted:
                    by_key.setdefault(key, {}).setdefault(run_id, []).append(r.median_ms)
        out = {}
        for key, by_run in by_key.items():
            if len(by_run) >= MIN_RUNS_FOR_NOISE:
                steps = np.diff(np.log([np.median(m) for m in by_run.values()]))
                out[key] = (float(np.std(steps, ddof=1) / np.sqrt(2)), float(steps.size - 1))
        return out

    def trend(self, model: str, **where):
        """`series` as a table, with each configuration's change from its previous run (`vs_previous`)."""
        import pandas as pd

        rows = self.series(model, **where)
        if not rows:
            raise UsageError(f"no stored records of {model!r} with those filters in {str(self.path)!r}; accepted: "
                             "a model and filters of a stored run (see 'aio-examples history list')")
        df = pd.DataFrame(rows).sort_values([*TREND_FIELDS, "started_at", "run"], kind="stable")
        df["vs_previous"] = df.groupby(list(TREND_FIELDS), dropna=False)["median_ms"].pct_change(fill_method=None)
        return df, rows


def load_run(ref, history_path=None) -> Run:
    """A comparison side: a results folder (every results.jsonl below it), a results.jsonl file, or
    `history:ID` / `history:latest` from the history store."""
    if str(ref).startswith("history:"):
        with History.open(history_path, create=False) as h:
            return h.run(str(ref).split(":", 1)[1])
    try:
        return from_files(ref)
    except UsageError as exc:
        if Path(ref).exists():
            raise
        raise UsageError(f"{exc}, or history:ID / history:latest") from None


class _Transaction:
    """BEGIN IMMEDIATE ... COMMIT, or ROLLBACK on any error (nothing half-written stays)."""

    def __init__(self, history: History):
        self.h = history

    def __enter__(self):
        try:
            self.h.conn.execute("BEGIN IMMEDIATE")
        except sqlite3.Error as exc:
            raise _db_error(self.h.path, exc) from exc

    def __exit__(self, kind, exc, tb):
        if kind is None:
            try:
                self.h.conn.execute("COMMIT")
                return False
            except sqlite3.Error as commit_exc:
                self.h.conn.execute("ROLLBACK")
                raise _db_error(self.h.path, commit_exc) from commit_exc
        self.h.conn.execute("ROLLBACK")
        if isinstance(exc, sqlite3.Error):
            raise _db_error(self.h.path, exc) from exc
        return False


def _db_error(path: Path, exc: sqlite3.Error) -> UsageError:
    text = str(exc)
    if "locked" in text or "busy" in text:
        return UsageError(f"history database {str(path)!r} is locked by another process (waited "
                          f"{LOCK_TIMEOUT_S:.0f} s); nothing was changed: retry when it is done")
    return UsageError(f"history database {str(path)!r} cannot be used ({text}); nothing in it was changed: "
                      "move it aside to start a new history")
