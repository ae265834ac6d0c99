"""Reports from result records: summary.csv / summary.md, PNG plots and a self-contained report.html.

Inputs are results.jsonl files or folders holding them, from one or many runs or machines. Speed is
only ever plotted for `ok` rows; every other status is listed as such with its reason. The speedup
compares a configuration with eager fp32 of the same model, batch, threads, instances and allocator
on the same machine, and the suite view normalises every model to eager fp32 = 1.0 with the
geometric mean over the models that ran.
"""

import base64
import html
import math
from datetime import UTC, datetime
from pathlib import Path

from ..core import records as res
from ..core.errors import UsageError

KEYS = ["model", "backend", "precision", "batch_size", "threads", "instances", "allocator"]
SAME_SETTING = ["model", "batch_size", "threads", "instances", "allocator", "machine"]
COLUMNS = [*KEYS, "status", "median_ms", "p90_ms", "p99_ms", "throughput", "unit", "speedup_vs_eager_fp32",
           "check", "strategy", "achieved_gflops", "peak_pct", "prepare_s", "measured_s", "machine", "reason"]


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


def _machine(r: dict) -> str:
    env = r.get("env") or {}
    return env.get("hostname") or "unknown"


def summary_frame(records: list[dict], peaks: dict | None = None):
    """One row per configuration and machine (the latest record wins), with speedup and % of peak.

    `peaks`: {machine: {precision: {threads(str): gflops}}}; by default this machine's cached peaks.
    """
    import pandas as pd

    rows = []
    for r in records:
        if (r.get("instance") or {}).get("index") is not None:
            continue                 # a multi-instance run is summarised by its aggregate record
        lat, tp, check = r.get("latency_ms") or {}, r.get("throughput") or {}, r.get("check") or {}
        metrics = r.get("metrics") or {}
        flops, units = metrics.get("flops_per_pass"), metrics.get("units_per_pass")
        achieved = (flops / units * tp["value"] / 1e9 if r["status"] == "ok" and flops and units and tp.get("value")
                    else None)
        rows.append({
            "model": r["model"], "backend": r["backend"], "precision": r["precision"],
            "batch_size": r["batch_size"], "threads": r["threads"], "instances": r.get("instances", 1),
            "allocator": (r.get("env") or {}).get("allocator", "default"), "status": r["status"],
            "median_ms": lat.get("median"), "p90_ms": lat.get("p90"), "p99_ms": lat.get("p99"),
            "throughput": tp.get("value"), "unit": tp.get("unit"),
            "check": ("pass" if check.get("passed") else "FAIL") if check else "",
            "strategy": r.get("strategy"), "achieved_gflops": achieved, "prepare_s": r.get("prepare_s"),
            "measured_s": r.get("measured_s"), "machine": _machine(r), "reason": r.get("reason") or "",
            "timestamp": r.get("timestamp", ""),
        })
    if not rows:
        return pd.DataFrame(columns=COLUMNS)
    df = pd.DataFrame(rows).sort_values("timestamp", kind="stable").drop_duplicates([*KEYS, "machine"], keep="last")
    eager = df[(df.backend == "eager") & (df.precision == "fp32") & (df.status == "ok")]
    ref = {tuple(row[k] for k in SAME_SETTING): row["median_ms"] for _, row in eager.iterrows()}
    keys = [tuple(row[k] for k in SAME_SETTING) for _, row in df.iterrows()]
    df["speedup_vs_eager_fp32"] = [ref[k] / m if s == "ok" and k in ref and m else None
                                   for k, m, s in zip(keys, df.median_ms, df.status)]
    if peaks is None:
        from ..machine import peak

        here = peak.cached().get("peaks") or {}
        peaks = {m: {p: {t: e["gflops"] for t, e in by_t.items() if e.get("gflops")} for p, by_t in here.items()}
                 for m in df.machine.unique()} if here else {}
    df["peak_pct"] = [
        100 * row["achieved_gflops"] / pk if row["achieved_gflops"] and (
            pk := (peaks.get(row["machine"]) or {}).get(row["precision"], {}).get(str(row["threads"] * row["instances"])))
        else None for _, row in df.iterrows()]
    return df.sort_values(KEYS).reset_index(drop=True)[COLUMNS]


def geomean_speedups(df):
    """Per (backend, precision): geometric mean over models of the speedup vs eager fp32 (ok rows only)."""
    ok = df[df.status == "ok"].dropna(subset=["speedup_vs_eager_fp32"])
    return {key: math.exp(sum(math.log(v) for v in g.speedup_vs_eager_fp32) / len(g))
            for key, g in ok.groupby(["backend", "precision"])}


def suite_setting(df) -> dict | None:
    """The one setting the suite view compares models at: batch 1 (or the smallest), the most threads
    measured at it, a single instance, the default allocator, the first machine."""
    single = df[(df.instances == 1) & (df.allocator == "default")]
    if single.empty:
        return None
    batch = int(single.batch_size.min())
    threads = int(single[single.batch_size == batch].threads.max())
    return {"batch_size": batch, "threads": threads, "machine": min(single.machine.unique())}


def suite_frame(df):
    """Speedup vs eager fp32 per model x (backend, precision) at the suite setting, plus the geomean row."""
    import pandas as pd

    setting = suite_setting(df)
    if setting is None:
        return pd.DataFrame(), None
    sel = df[(df.batch_size == setting["batch_size"]) & (df.threads == setting["threads"]) & (df.instances == 1)
             & (df.allocator == "default") & (df.machine == setting["machine"])]
    table = sel.pivot_table(index="model", columns=["backend", "precision"], values="speedup_vs_eager_fp32",
                            aggfunc="first")
    geo = geomean_speedups(sel)
    if not table.empty:
        table.loc["geomean"] = [geo.get(col) for col in table.columns]
    return table, setting


# ---------------------------------------------------------------- plots

def _figure(width=8.0, height=4.0):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt.subplots(figsize=(width, height), dpi=110)


def _save(fig, path: Path) -> Path:
    import matplotlib.pyplot as plt

    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    return path


def plot_suite(table, setting, path: Path) -> Path | None:
    if table is None or table.empty:
        return None
    import numpy as np

    series = [c for c in table.columns if not table[c].isna().all()]
    fig, ax = _figure(max(8.0, 1.2 * len(table.index)), 4.5)
    x = np.arange(len(table.index))
    width = 0.8 / max(1, len(series))
    for i, col in enumerate(series):
        ax.bar(x + i * width - 0.4 + width / 2, table[col].fillna(0).values, width, label=f"{col[0]} {col[1]}")
    ax.axhline(1.0, color="black", linewidth=0.8)
    ax.set_xticks(x, table.index, rotation=30, ha="right")
    ax.set_ylabel("speedup vs eager fp32 (eager = 1.0)")
    ax.set_title(f"speedup per model, batch {setting['batch_size']}, {setting['threads']} thread(s); "
                 "missing bar = did not run ok")
    ax.legend(fontsize=7, ncol=3)
    return _save(fig, path)


def _line_plot(rows, x: str, y: str, ylabel: str, title: str, path: Path) -> Path | None:
    """One line per backend x precision of `y` against `x`; nothing when `x` has a single value."""
    if rows[x].nunique() < 2:
        return None
    fig, ax = _figure()
    for (backend, precision), g in rows.groupby(["backend", "precision"]):
        g = g.sort_values(x)
        ax.plot(g[x], g[y], marker="o", label=f"{backend} {precision}")
    ax.set_xlabel(x.replace("_", " "))
    ax.set_ylabel(ylabel)
    ax.set_xticks(sorted(rows[x].unique()))
    ax.set_title(title)
    ax.legend(fontsize=7)
    return _save(fig, path)


def plot_model(df, model: str, folder: Path) -> dict:
    """Latency vs threads, throughput vs batch size, and precisions, for one model (ok rows only)."""
    ok = df[(df.model == model) & (df.status == "ok") & (df.instances == 1) & (df.allocator == "default")]
    if ok.empty:
        return {}
    batch, threads = ok.batch_size.min(), ok.threads.max()
    plots = {}
    path = _line_plot(ok[ok.batch_size == batch], "threads", "median_ms", "median latency (ms)",
                      f"{model}: latency vs threads, batch {batch}", folder / f"{model}-threads.png")
    if path:
        plots["latency vs threads"] = path
    path = _line_plot(ok[ok.threads == threads], "batch_size", "throughput", f"throughput ({ok.unit.iloc[0]})",
                      f"{model}: throughput vs batch size, {threads} thread(s)", folder / f"{model}-batch.png")
    if path:
        plots["throughput vs batch size"] = path
    at = ok[(ok.batch_size == batch) & (ok.threads == threads)]
    if at.precision.nunique() > 1:
        pivot = at.pivot_table(index="backend", columns="precision", values="median_ms", aggfunc="first")
        fig, ax = _figure()
        pivot.plot.bar(ax=ax, rot=0)
        ax.set_ylabel("median latency (ms)")
        ax.set_title(f"{model}: precisions, batch {batch}, {threads} thread(s)")
        plots["precisions"] = _save(fig, folder / f"{model}-precisions.png")
    return plots


def plot_instances(df, path: Path) -> Path | None:
    """Aggregate throughput per instance layout (N instances x T threads), per model and backend."""
    ok = df[(df.status == "ok")]
    groups = [(k, g) for k, g in ok.groupby(["model", "backend", "precision", "batch_size"])
              if (g.instances > 1).any()]
    if not groups:
        return None
    fig, ax = _figure(8.0, 1.0 + 0.5 * sum(len(g) for _, g in groups))
    labels, values = [], []
    for (model, backend, precision, batch), g in groups:
        for _, row in g.sort_values(["instances", "threads"]).iterrows():
            labels.append(f"{model} {backend} {precision} b{batch}: {row.instances} x {row.threads} thr")
            values.append(row.throughput)
    ax.barh(range(len(values)), values)
    ax.set_yticks(range(len(values)), labels, fontsize=7)
    ax.invert_yaxis()
    ax.set_xlabel(f"throughput, summed over instances ({ok.unit.iloc[0]})")
    ax.set_title("multi-instance scaling")
    return _save(fig, path)


# ---------------------------------------------------------------- outputs

def _fmt_frame(df):
    import pandas as pd

    shown = df.copy()
    for col in ("median_ms", "p90_ms", "p99_ms", "throughput", "prepare_s", "measured_s", "achieved_gflops"):
        shown[col] = shown[col].map(lambda v: "" if pd.isna(v) else f"{v:.2f}")
    shown["speedup_vs_eager_fp32"] = shown["speedup_vs_eager_fp32"].map(lambda v: "" if pd.isna(v) else f"{v:.2f}x")
    shown["peak_pct"] = shown["peak_pct"].map(lambda v: "" if pd.isna(v) else f"{v:.1f}%")
    return shown


def write_summary(df, out: Path) -> dict:
    csv, md = out / "summary.csv", out / "summary.md"
    df.to_csv(csv, index=False)
    md.write_text(_fmt_frame(df).drop(columns=["machine"]).to_markdown(index=False) + "\n")
    return {"csv": csv, "md": md}


def _environments(records: list[dict]) -> list[dict]:
    seen = {}
    for r in records:
        env = r.get("env") or {}
        if "cpu_model" in env:
            seen[_machine(r)] = env
    return [{"machine": m, "cpu": e.get("cpu_model"), "isa": " ".join(e.get("isa") or []),
             "cores": e.get("physical_cores_available"), "logical CPUs": e.get("logical_cpus"),
             "NUMA nodes": e.get("numa_nodes"), "kernel": e.get("kernel"), "python": e.get("python"),
             "versions": ", ".join(f"{k} {v}" for k, v in (e.get("versions") or {}).items() if v),
             "git": (e.get("git_commit") or "")[:10]} for m, e in seen.items()]


def _img(path: Path | None, alt: str) -> str:
    if path is None:
        return ""
    data = base64.b64encode(path.read_bytes()).decode()
    return f'<figure><img alt="{html.escape(alt)}" src="data:image/png;base64,{data}"><figcaption>' \
           f'{html.escape(alt)}</figcaption></figure>'


STYLE = """body{font-family:system-ui,sans-serif;margin:2em;max-width:1200px}table{border-collapse:collapse;display:block;overflow-x:auto;
font-size:12px;margin:1em 0}td,th{border:1px solid #ccc;padding:3px 6px;text-align:right}th{background:#f3f3f3}
td:first-child{text-align:left}img{max-width:100%}.bad{color:#a00}figure{margin:1em 0}"""


def write_html(records, df, suite, setting, plots: dict, out: Path) -> Path:
    import pandas as pd

    parts = [(f"<!doctype html><html><head><meta charset='utf-8'><title>aio-examples report</title>"
             f"<style>{STYLE}</style></head><body>"),
             "<h1>aio-examples report</h1>",
             (f"<p>{len(records)} records, {len(df)} configurations; generated "
             f"{datetime.now(UTC).isoformat(timespec='seconds')}. Speed is shown only for configurations "
             "whose status is ok; the others are listed with their status and reason.</p>"),
             "<h2 id='environment'>Environment</h2>", pd.DataFrame(_environments(records)).to_html(index=False)]
    parts.append("<h2 id='suite'>Speedup vs eager fp32 (suite view)</h2>")
    if suite is not None and not suite.empty:
        parts.append(f"<p>Batch {setting['batch_size']}, {setting['threads']} thread(s), one instance, default "
                     f"allocator, machine {html.escape(setting['machine'])}. Eager fp32 = 1.0; the last row is the "
                     "geometric mean over the models that ran ok.</p>")
        parts.append(_img(plots.get("suite"), "speedup vs eager fp32 per model, with geometric mean"))
        shown = suite.map(lambda v: "" if pd.isna(v) else f"{v:.2f}x")
        shown.columns = [f"{b} {p}" for b, p in shown.columns]
        parts.append(shown.to_html())
    else:
        parts.append("<p>No eager fp32 reference and single-instance results to compare against.</p>")
    parts.append("<h2 id='models'>Per model</h2>")
    shown_all = _fmt_frame(df)
    for model in sorted(df.model.unique()):
        parts.append(f"<h3>{html.escape(model)}</h3>")
        for name, path in (plots.get("models", {}).get(model) or {}).items():
            parts.append(_img(path, f"{model}: {name}"))
        rows = shown_all[shown_all.model == model].drop(columns=["model", "machine"])
        parts.append(rows.to_html(index=False, classes="results"))
    if plots.get("instances"):
        parts.append("<h2 id='instances'>Multi-instance scaling</h2>")
        parts.append(_img(plots["instances"], "aggregate throughput per instance layout"))
    not_ok = df[df.status != "ok"]
    parts.append("<h2 id='not-ok'>Did not run ok</h2>")
    parts.append(not_ok[["model", "backend", "precision", "batch_size", "threads", "status", "reason"]]
                 .to_html(index=False) if not not_ok.empty else "<p>Every configuration ran ok.</p>")
    parts.append("<h2 id='peak'>Machine peak</h2>")
    if df.peak_pct.notna().any():
        parts.append("<p>Achieved FLOP/s (FLOPs of one pass counted with torch.utils.flop_counter, times passes "
                     "per second) as a share of this machine's measured matrix-multiply peak at the same precision "
                     "and total thread count (<code>aio-examples peak</code>): the <code>peak_pct</code> column "
                     "above.</p>")
    else:
        parts.append("<p>No peak measured for these machines: run <code>aio-examples peak</code> to add "
                     "<code>peak_pct</code> to every configuration with a FLOP count.</p>")
    parts.append("</body></html>")
    path = out / "report.html"
    path.write_text("\n".join(parts))
    return path


def build_report(paths, out_dir) -> dict:
    """Everything: summary.csv/md, PNG plots under plots/, report.html. Returns the paths written."""
    records = load_records(paths)
    out = res.check_output_dir(out_dir)
    plot_dir = out / "plots"
    plot_dir.mkdir(exist_ok=True)
    df = summary_frame(records)
    written = write_summary(df, out)
    suite, setting = suite_frame(df)
    plots = {"suite": plot_suite(suite, setting, plot_dir / "suite-speedup.png"),
             "models": {m: plot_model(df, m, plot_dir) for m in sorted(df.model.unique())},
             "instances": plot_instances(df, plot_dir / "instances.png")}
    written["html"] = write_html(records, df, suite, setting, plots, out)
    written["records"] = len(records)
    return written
