"""Summaries of result records: one row per configuration, as CSV and Markdown.

Inputs are results.jsonl files or folders holding them (from one or many runs). The speedup column
compares each ok configuration with eager fp32 of the same model, batch, threads, instances and
allocator on the same machine; rows that did not run are kept with their status and reason, never
shown as a speed.
"""

from pathlib import Path

from . import results as res
from .errors import UsageError

KEYS = ["model", "backend", "precision", "batch_size", "threads", "instances", "allocator"]
COLUMNS = [*KEYS, "status", "median_ms", "p90_ms", "p99_ms", "throughput", "unit", "speedup_vs_eager_fp32",
           "check", "strategy", "prepare_s", "measured_s", "hostname", "reason"]


def load_records(paths) -> list[dict]:
    """Records from files or folders (a folder: every results.jsonl below it)."""
    records = []
    for p in map(Path, paths):
        files = sorted(p.rglob("results.jsonl")) if p.is_dir() else [p]
        if not files or not all(f.is_file() for f in files):
            raise UsageError(f"{str(p)!r} holds no results.jsonl; accepted: result files or folders with them")
        for f in files:
            records.extend(res.load(f))
    return records


def summary_frame(records: list[dict]):
    """One row per configuration (the latest record wins), with the speedup over eager fp32."""
    import pandas as pd

    rows = []
    for r in records:
        if (r.get("instance") or {}).get("index") is not None:
            continue                 # a multi-instance run is summarised by its aggregate record
        lat = r.get("latency_ms") or {}
        tp = r.get("throughput") or {}
        check = r.get("check") or {}
        rows.append({
            "model": r["model"], "backend": r["backend"], "precision": r["precision"],
            "batch_size": r["batch_size"], "threads": r["threads"], "instances": r.get("instances", 1),
            "allocator": (r.get("env") or {}).get("allocator", "default"), "status": r["status"],
            "median_ms": lat.get("median"), "p90_ms": lat.get("p90"), "p99_ms": lat.get("p99"),
            "throughput": tp.get("value"), "unit": tp.get("unit"),
            "check": ("pass" if check.get("passed") else "FAIL") if check else "",
            "strategy": r.get("strategy"), "prepare_s": r.get("prepare_s"), "measured_s": r.get("measured_s"),
            "hostname": (r.get("env") or {}).get("hostname"), "reason": r.get("reason") or "",
            "timestamp": r.get("timestamp", ""),
        })
    if not rows:
        return pd.DataFrame(columns=COLUMNS)
    df = pd.DataFrame(rows).sort_values("timestamp").drop_duplicates([*KEYS, "hostname"], keep="last")
    eager = df[(df.backend == "eager") & (df.precision == "fp32") & (df.status == "ok")]
    ref = eager.set_index([k for k in KEYS if k not in ("backend", "precision")] + ["hostname"])["median_ms"]
    keys = [k for k in KEYS if k not in ("backend", "precision")] + ["hostname"]
    base = [ref.get(tuple(row[k] for k in keys)) for _, row in df.iterrows()]
    df["speedup_vs_eager_fp32"] = [b / m if s == "ok" and b and m else None
                                   for b, m, s in zip(base, df.median_ms, df.status)]
    return df.sort_values(KEYS).reset_index(drop=True)[COLUMNS]


def write_summary(records: list[dict], out_dir: Path) -> dict:
    """summary.csv and summary.md in out_dir; returns their paths."""
    import pandas as pd

    out = res.check_output_dir(out_dir)
    df = summary_frame(records)
    csv, md = out / "summary.csv", out / "summary.md"
    df.to_csv(csv, index=False)
    shown = df.drop(columns=["hostname"]).copy()
    for col in ("median_ms", "p90_ms", "p99_ms", "throughput", "prepare_s", "measured_s"):
        shown[col] = shown[col].map(lambda v: "" if pd.isna(v) else f"{v:.2f}")
    shown["speedup_vs_eager_fp32"] = shown["speedup_vs_eager_fp32"].map(lambda v: "" if pd.isna(v) else f"{v:.2f}x")
    md.write_text(shown.to_markdown(index=False) + "\n")
    return {"csv": csv, "md": md}
