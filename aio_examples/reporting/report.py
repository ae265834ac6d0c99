"""Reports from result records: summary.csv / summary.md, PNG plots and a self-contained report.html.

Inputs are results.jsonl files or folders holding them, from one or many runs or machines. A row is one
configuration (`Result.key`: input shapes and scenarios apart, machines by hardware fingerprint with the
hostname shown); the latest record of a configuration wins. Speed is only ever plotted for `ok` rows;
every other status is listed as such with its reason.

The speedup over eager fp32 is the one measured in the same process when eager fp32 ran beside the
configuration (`--backend all`, several precisions): those passes shared the machine's state. Otherwise it
compares with the strict eager fp32 record of the same setting (model, task, batch, threads, instances, allocator,
torch's runtime variables, shape, scenario, dataset, machine). The suite view normalises every model to eager fp32 = 1.0 with the
geometric mean over the models that ran; configurations measured while other processes held their cores
(`contention`) are marked and left out of it unless asked.

Records that scored a labelled dataset (`accuracy`) add, and only then, a column per task metric in points
with its change against eager fp32 on the same samples, the table "accuracy and speed" and, per model, the
accuracy of each backend x precision against its speedup with the Pareto front: what a faster configuration
costs in accuracy is read off one chart.

Records of text generation (`metrics.generation`) add, and only then, per-token columns beside the throughput
(TTFT, TPOT, ITL, prefill and decode tokens/s, roofline share, KV cache), the table "Generation" and, per
model, decode tokens/s against the memory-bandwidth roofline (reporting/generation.py).
"""

import html
import math
from datetime import UTC, datetime
from pathlib import Path

from ..core import records as res
from ..core import scores
from ..core.paths import safe_name
from ..core.records import KEY_FIELDS, Result
from . import fleet, generation, profiles, serving
from .page import STYLE, img
from .plots import default_runtime, plot_accuracy, plot_instances, plot_model, plot_suite

KEYS = ["model", "backend", "precision", "fpmath", "batch_size", "threads", "instances", "allocator", "env_axes", "shape"]
COLUMNS = [*KEYS, "task", "scenario", "dataset", "status", "median_ms", "p90_ms", "p99_ms", "throughput", "unit",
           "speedup_vs_eager_fp32", "check", "strategy", "achieved_gflops", "peak_pct", "contention", "contended",
           "prepare_s", "measured_s", "machine", "host", "reason"]

VS_EAGER = "_vs_eager_fp32"            # a metric's column of its change against eager fp32 (in points)
# A configuration's setting: everything but backend, precision and fast-math mode (ConfigKey.setting), as columns.
SETTING = [f for f in KEY_FIELDS if f not in ("backend", "precision", "fpmath")]

load_records = res.load_records        # the notebooks' name for it


def _as_result(r) -> Result:
    return r if isinstance(r, Result) else Result.from_dict(r)


def _contention(r: Result) -> tuple[float | None, bool]:
    """Cores other processes kept busy of this run's while it measured, and whether that passed its limit."""
    c = r.contention or {}
    busy = c.get("busy_elsewhere_cores")
    if busy is None:
        return None, False
    return busy, bool(c.get("contended", busy > c.get("threshold_cores", 0.25)))


def summary_frame(records, peaks: dict | None = None):
    """One row per configuration (the latest record wins), with speedup, % of peak and contention.

    `records`: Result objects (or their dicts). `peaks`: {machine fingerprint: {precision: {threads(str):
    gflops}}}; by default this machine's cached peaks.
    """
    import pandas as pd

    rows = []
    for r in map(_as_result, records):
        if r.is_instance:
            continue                 # a multi-instance run is summarised by its aggregate record
        key = r.key()
        lat, tp, check = r.latency_ms or {}, r.throughput or {}, r.check or {}
        flops, units = r.metrics.get("flops_per_pass"), r.metrics.get("units_per_pass")
        achieved = (flops / units * tp["value"] / 1e9 if r.status == "ok" and flops and units and tp.get("value")
                    else None)
        busy, contended = _contention(r)
        rows.append({
            **key._asdict(), "status": r.status,
            "median_ms": lat.get("median"), "p90_ms": lat.get("p90"), "p99_ms": lat.get("p99"),
            "throughput": tp.get("value"), "unit": tp.get("unit"),
            "check": ("pass" if check.get("passed") else "FAIL") if check else "",
            "strategy": r.strategy, "achieved_gflops": achieved, "contention": busy, "contended": contended,
            "prepare_s": r.prepare_s, "measured_s": r.measured_s, "host": (r.env or {}).get("hostname") or "unknown",
            "reason": r.reason or "", "timestamp": r.timestamp, "own_speedup": r.speedup_vs_eager_fp32,
            "setting": key.setting, "accuracy": r.accuracy, "generation": generation.block_of(r),
        })
    if not rows:
        return pd.DataFrame(columns=COLUMNS)
    df = pd.DataFrame(rows).sort_values("timestamp", kind="stable").drop_duplicates(list(KEY_FIELDS), keep="last")
    eager = df[(df.backend == "eager") & (df.precision == "fp32") & (df.fpmath == "strict") & (df.status == "ok")]
    ref = dict(zip(eager.setting, eager.median_ms))
    df["speedup_vs_eager_fp32"] = [
        None if s != "ok" else own if own is not None and not pd.isna(own) else ref[k] / m if k in ref and m else None
        for k, m, s, own in zip(df.setting, df.median_ms, df.status, df.own_speedup)]
    if peaks is None:
        peaks = _this_machines_peaks()
    df["peak_pct"] = [
        100 * row["achieved_gflops"] / pk if row["achieved_gflops"] and (
            pk := (peaks.get(row["machine"]) or {}).get(row["precision"], {}).get(str(row["threads"] * row["instances"])))
        else None for _, row in df.iterrows()]
    accuracy = _accuracy_columns(df.accuracy)
    tokens = generation.summary_columns(df.generation)
    at = COLUMNS.index("speedup_vs_eager_fp32") + 1             # beside the speedup: what it costs
    unit = COLUMNS.index("unit") + 1                            # beside the throughput: per token
    df = df.assign(**accuracy, **tokens)
    return df.sort_values(KEYS).reset_index(drop=True)[[*COLUMNS[:unit], *tokens, *COLUMNS[unit:at], *accuracy,
                                                        *COLUMNS[at:]]]


def _accuracy_columns(blocks) -> dict:
    """Each task metric in points (perplexity as it is) and its change against eager fp32, then the samples scored; no
    column at all when no record scored a labelled dataset, so those reports keep their columns."""
    blocks = [b or {} for b in blocks]
    names = list(dict.fromkeys(m for b in blocks for m in b.get("metrics") or {}))

    def points(part, name):
        scale = 1 if name in scores.UNBOUNDED else 100          # a perplexity is shown as it is
        return [None if (v := (b.get(part) or {}).get(name)) is None else round(scale * v, 4) for b in blocks]

    columns = {}
    for name in names:
        columns[name] = points("metrics", name)
        columns[name + VS_EAGER] = points("delta_vs_eager_fp32", name)
    if names:
        columns["accuracy_samples"] = [b.get("samples") for b in blocks]
    return columns


def accuracy_metrics(df) -> list[str]:
    """The task metrics with columns in a summary frame, in the order of the records."""
    return [c[:-len(VS_EAGER)] for c in df.columns if c.endswith(VS_EAGER) and c != "speedup" + VS_EAGER]


def primary_metrics(records) -> dict:
    """model -> its first task metric, the one its accuracy chart plots."""
    return {r.model: next(iter(r.accuracy["metrics"])) for r in map(_as_result, records)
            if r.accuracy and r.accuracy.get("metrics")}


def pareto_front(points) -> list[int]:
    """Indices of the (speedup, metric) points no other point dominates (at least as fast and as accurate, and
    better in one), in the order given: for any configuration off the front another is as good or better on both."""
    return [i for i, (x, y) in enumerate(points)
            if not any(u >= x and v >= y and (u > x or v > y) for u, v in points)]


def accuracy_frame(df, primary: dict):
    """One row per configuration with task metrics, and whether it is on the Pareto front of speedup against
    its model's primary metric among the configurations of its setting that ran ok."""
    metrics = accuracy_metrics(df)
    rows = df[df[metrics].notna().any(axis=1)] if metrics else df.iloc[:0]
    rows = rows.assign(pareto=False)
    for _, g in rows[rows.status == "ok"].groupby(SETTING, dropna=False):
        metric = primary.get(g.model.iloc[0])
        g = g.dropna(subset=["speedup_vs_eager_fp32", metric])
        front = pareto_front(list(zip(g.speedup_vs_eager_fp32, g[metric])))
        rows.loc[g.index[front], "pareto"] = True
    return rows.sort_values(["model", "speedup_vs_eager_fp32"], ascending=[True, False], na_position="last")


def accuracy_plots(acc, model: str, metric: str, folder: Path) -> dict:
    """{name: path} of the model's accuracy-vs-speedup charts (one per input shape and dataset it scored), at
    the setting the suite view would pick among its configurations with metrics (batch 1, the most threads)."""
    setting = suite_setting(acc[(acc.model == model) & (acc.status == "ok")])
    if setting is None:
        return {}
    sel = at_setting(acc[acc.model == model], setting).dropna(subset=["speedup_vs_eager_fp32", metric])
    groups = sel.groupby(["shape", "dataset"])
    plots = {}
    for (shape, dataset), g in groups:
        several = groups.ngroups > 1
        title = (f"{model}{' ' + shape if shape else ''}: {metric} vs speedup over eager fp32, "
                 f"batch {setting['batch_size']}, {setting['threads']} thread(s)")
        path = folder / safe_name(f"{model}-accuracy" + (f"-{shape}-{dataset}" if several else "") + ".png")
        plots[f"{metric} vs speedup" + (f" ({shape} {dataset})" if several else "")] = plot_accuracy(
            g, metric, title, path)
    return plots


def _this_machines_peaks() -> dict:
    """{fingerprint: {precision: {threads: gflops}}} of this machine's cached peak (aio-examples peak)."""
    from ..machine import peak
    from ..machine.environment import capture

    here = peak.cached().get("peaks") or {}
    if not here:
        return {}
    return {res.machine_fingerprint(capture()): {p: {t: e["gflops"] for t, e in by_t.items() if e.get("gflops")}
                                                 for p, by_t in here.items()}}


def geomean_speedups(df, include_contended: bool = False):
    """Per (backend, precision): geometric mean over models of the speedup vs eager fp32 (ok rows only,
    without contended rows unless asked)."""
    ok = df[(df.status == "ok") & (include_contended | ~df.contended.astype(bool))]
    ok = ok.dropna(subset=["speedup_vs_eager_fp32"])
    return {key: math.exp(sum(math.log(v) for v in g.speedup_vs_eager_fp32) / len(g))
            for key, g in ok.groupby(["backend", "precision"])}


def suite_setting(df) -> dict | None:
    """The one setting the suite view compares models at: batch 1 (or the smallest), the most threads
    measured at it, a single instance, the default allocator and scenario, the first machine."""
    single = df[(df.instances == 1) & default_runtime(df) & (df.scenario == "latency")]
    if single.empty:
        return None
    batch = int(single.batch_size.min())
    threads = int(single[single.batch_size == batch].threads.max())
    machine = min(single.machine.unique())
    host = single[single.machine == machine].host.iloc[0]
    return {"batch_size": batch, "threads": threads, "machine": machine, "host": host}


def at_setting(df, setting: dict):
    """The rows at a suite setting (suite_setting): its batch, threads and machine, one instance, the default
    allocator, the latency scenario."""
    return df[(df.batch_size == setting["batch_size"]) & (df.threads == setting["threads"]) & (df.instances == 1)
              & default_runtime(df) & (df.scenario == "latency") & (df.machine == setting["machine"])]


def suite_frame(df, include_contended: bool = False):
    """Speedup vs eager fp32 per model x (backend, precision) at the suite setting, plus the geomean row.
    A model measured at several input shapes has a row per shape."""
    import pandas as pd

    setting = suite_setting(df)
    if setting is None:
        return pd.DataFrame(), None
    sel = at_setting(df, setting)
    if not include_contended:
        sel = sel[~sel.contended.astype(bool)]
    shapes = sel.groupby("model").shape.nunique()
    sel = sel.assign(row=[m if shapes[m] < 2 else f"{m} {s}" for m, s in zip(sel.model, sel["shape"])])
    table = sel.pivot_table(index="row", columns=["backend", "precision"], values="speedup_vs_eager_fp32",
                            aggfunc="first")
    table.index.name = "model"
    geo = geomean_speedups(sel, include_contended=True)
    if not table.empty:
        table.loc["geomean"] = [geo.get(col) for col in table.columns]
    return table, setting


def _contended_note(df, setting) -> str:
    left_out = df[df.contended.astype(bool) & (df.machine == setting["machine"])]
    if left_out.empty:
        return ""
    return (f"; {len(left_out)} configuration(s) measured while other processes held their cores are left out "
            "(column contention)")


# ---------------------------------------------------------------- outputs

def _fmt_frame(df):
    import pandas as pd

    shown = df.copy()
    for col in ("median_ms", "p90_ms", "p99_ms", "throughput", "prepare_s", "measured_s", "achieved_gflops"):
        shown[col] = shown[col].map(lambda v: "" if pd.isna(v) else f"{v:.2f}")
    shown["speedup_vs_eager_fp32"] = shown["speedup_vs_eager_fp32"].map(lambda v: "" if pd.isna(v) else f"{v:.2f}x")
    shown["contention"] = shown["contention"].map(lambda v: "" if pd.isna(v) else f"{v:.2f} cores")
    shown["peak_pct"] = shown["peak_pct"].map(lambda v: "" if pd.isna(v) else f"{v:.1f}%")
    for name in accuracy_metrics(df):                  # points, one decimal; the change signed
        shown[name] = shown[name].map(lambda v: "" if pd.isna(v) else f"{v:.1f}")
        shown[name + VS_EAGER] = shown[name + VS_EAGER].map(lambda v: "" if pd.isna(v) else f"{v:+.1f}")
    if "accuracy_samples" in shown:
        shown["accuracy_samples"] = shown["accuracy_samples"].map(lambda v: "" if pd.isna(v) else f"{v:.0f}")
    return generation.fmt(shown)


def _accuracy_table(acc) -> str:
    """The table "accuracy and speed": one row per configuration with task metrics (HTML)."""
    metrics = [m for m in accuracy_metrics(acc) if acc[m].notna().any()]
    columns = ["model", "backend", "precision", "batch_size", "threads", "shape", "status",
               *(c for m in metrics for c in (m, m + VS_EAGER)), "speedup_vs_eager_fp32", "pareto", "accuracy_samples"]
    shown = _fmt_frame(acc)[columns].assign(pareto=["yes" if p else "" for p in acc.pareto])
    return shown.rename(columns={m + VS_EAGER: f"{m} vs eager fp32 (pt)" for m in metrics}
                        | {"pareto": "Pareto front", "accuracy_samples": "samples"}).to_html(index=False)


def write_summary(df, out: Path) -> dict:
    csv, md = out / "summary.csv", out / "summary.md"
    df.to_csv(csv, index=False)
    # tabulate would reparse "71.0" as 71 and "+0.0" as 0: points (and per-token figures) keep their decimals.
    md.write_text(_fmt_frame(df).drop(columns=["machine", "contended"])
                  .to_markdown(index=False, disable_numparse=bool(accuracy_metrics(df))
                               or any(c in df for c in generation.NAMES)) + "\n")
    return {"csv": csv, "md": md}


def _environments(records: list[Result]) -> list[dict]:
    seen = {}
    for r in records:
        if (r.env or {}).get("cpu_model"):
            seen[r.machine] = r.env
    return [{"machine": m, "host": e.get("hostname"), "cpu": e.get("cpu_model"), "isa": " ".join(e.get("isa") or []),
             "cores": e.get("physical_cores_available"), "logical CPUs": e.get("logical_cpus"),
             "NUMA nodes": e.get("numa_nodes"), "kernel": e.get("kernel"), "python": e.get("python"),
             "versions": ", ".join(f"{k} {v}" for k, v in (e.get("versions") or {}).items() if v),
             "git": (e.get("git_commit") or "")[:10]} for m, e in seen.items()]


def write_html(records, df, suite, setting, plots: dict, out: Path, acc=None, gen=None, serve=None,
               machines=None) -> Path:
    """`acc`: the accuracy frame (accuracy_frame), `gen` the generation frame (generation.frame); each section
    only when its frame has rows. `machines`: the fleet.Fleet, its section only when it is shown."""
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
                     f"allocator, machine {html.escape(setting['host'])} ({setting['machine']}). Eager fp32 = 1.0; the last "
                     "row is the geometric mean over the models that ran ok" + _contended_note(df, setting) + ".</p>")
        parts.append(img(plots.get("suite"), "speedup vs eager fp32 per model, with geometric mean"))
        shown = suite.map(lambda v: "" if pd.isna(v) else f"{v:.2f}x")
        shown.columns = [f"{b} {p}" for b, p in shown.columns]
        parts.append(shown.to_html())
    elif df.contended.astype(bool).any():
        parts.append("<p>Nothing to compare: every single-instance configuration with an eager fp32 reference was "
                     "measured while other processes held its cores (column contention); "
                     "<code>--include-contended</code> shows them.</p>")
    else:
        parts.append("<p>No eager fp32 reference and single-instance results to compare against.</p>")
    if machines is not None and machines.shown:
        parts.append("<h2 id='fleet'>Machines side by side</h2>")
        parts.append(fleet.table(machines))
    if acc is not None and not acc.empty:
        parts.append("<h2 id='accuracy'>Accuracy and speed</h2>")
        parts.append("<p>Task metrics on a labelled dataset, in points, and their change against eager fp32 on the "
                     "same samples; the speedup over eager fp32 for configurations that ran ok. On the Pareto front: no "
                     "other configuration of the same setting is at least as fast and as accurate (in its model's "
                     "first metric) and better in one; each model's chart under Per model plots them.</p>")
        parts.append(_accuracy_table(acc))
    if gen is not None and not gen.empty:
        parts.append("<h2 id='generation'>Generation</h2>")
        parts.append(generation.INTRO)
        parts.append(generation.table(gen))
    parts.append("<h2 id='models'>Per model</h2>")
    shown_all = _fmt_frame(df)
    scored = [c for m in accuracy_metrics(df) for c in (m, m + VS_EAGER)] + ["accuracy_samples"] * ("accuracy_samples" in df)
    scored += [c for c in generation.NAMES if c in df]        # columns other models may have none of
    for model in sorted(df.model.unique()):
        parts.append(f"<h3>{html.escape(model)}</h3>")
        for name, path in (plots.get("models", {}).get(model) or {}).items():
            parts.append(img(path, f"{model}: {name}"))
        rows = shown_all[shown_all.model == model].drop(columns=["model", "task", "machine"])
        rows = rows.drop(columns=[c for c in scored if (rows[c] == "").all()])       # other models' metrics
        parts.append(rows.to_html(index=False, classes="results"))
    parts.append(profiles.section(records, out / "plots"))
    if serve is not None and not serve.empty:
        parts.append("<h2 id='serving'>Serving (MLPerf LoadGen)</h2>")
        parts.append(serving.table(serve))
        for model, charts in plots.get("serving", {}).items():
            for name, path in charts.items():
                parts.append(img(path, f"{model}: {name}"))
    if plots.get("instances"):
        parts.append("<h2 id='instances'>Multi-instance scaling</h2>")
        parts.append(img(plots["instances"], "aggregate throughput per instance layout"))
    not_ok = df[df.status != "ok"]
    parts.append("<h2 id='not-ok'>Did not run ok</h2>")
    parts.append(not_ok[["model", "backend", "precision", "batch_size", "threads", "shape", "status", "reason"]]
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


def build_report(paths, out_dir, include_contended: bool = False, prices=None, latency_ms: float | None = None) -> dict:
    """Everything: summary.csv/md, PNG plots under plots/, report.html, and with records from several machines (or
    `prices`, a prices TOML file, or `latency_ms`, a p99 bound) fleet.csv/md. Returns the paths written, and
    with prices `cheapest`: a line per model naming its cheapest machine."""
    records = res.load_records(paths)
    machines = fleet.Fleet.of(records, prices, latency_ms)       # bad prices stop it before anything is written
    out = res.check_output_dir(out_dir)
    plot_dir = out / "plots"
    plot_dir.mkdir(exist_ok=True)
    df = summary_frame(records)
    written = write_summary(df, out)
    suite, setting = suite_frame(df, include_contended)
    primary = primary_metrics(records)
    acc = accuracy_frame(df, primary)
    gen = generation.frame(records)
    serve = serving.frame(records)
    plots = {"suite": plot_suite(suite, setting, plot_dir / "suite-speedup.png"),
             "models": {m: {**plot_model(df, m, plot_dir),
                            **(accuracy_plots(acc, m, primary[m], plot_dir) if m in primary else {}),
                            **generation.plots(gen, m, plot_dir)}
                        for m in sorted(df.model.unique())},
             "instances": plot_instances(df, plot_dir / "instances.png"),
             "serving": {m: serving.plots(serve, m, plot_dir) for m in sorted(serve.model.unique())} if not serve.empty else {}}
    written["html"] = write_html(records, df, suite, setting, plots, out, acc, gen, serve, machines)
    if machines.shown:
        written |= fleet.write(machines, out)
        written["cheapest"] = machines.cheapest_lines()
    written["records"] = len(records)
    return written
