"""PNG plots of reports, the history and notebooks (matplotlib, no display needed)."""

from pathlib import Path

import numpy as np

from ..core.paths import safe_name


def figure(width=8.0, height=4.0):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt.subplots(figsize=(width, height), dpi=110)


def save(fig, path: Path) -> Path:
    import matplotlib.pyplot as plt

    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    return path


def plot_suite(table, setting, path: Path) -> Path | None:
    if table is None or table.empty:
        return None
    series = [c for c in table.columns if not table[c].isna().all()]
    fig, ax = figure(max(8.0, 1.2 * len(table.index)), 4.5)
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
    return save(fig, path)


def _line_plot(rows, x: str, y: str, ylabel: str, title: str, path: Path) -> Path | None:
    """One line per backend x precision of `y` against `x`; nothing when `x` has a single value."""
    if rows[x].nunique() < 2:
        return None
    fig, ax = figure()
    for (backend, precision), g in rows.groupby(["backend", "precision"]):
        g = g.sort_values(x)
        ax.plot(g[x], g[y], marker="o", label=f"{backend} {precision}")
    ax.set_xlabel(x.replace("_", " "))
    ax.set_ylabel(ylabel)
    ax.set_xticks(sorted(rows[x].unique()))
    ax.set_title(title)
    ax.legend(fontsize=7)
    return save(fig, path)


def default_runtime(df):
    """The rows measured as a plain run is: the default allocator, strict fp32 math, torch's runtime variables
    unset (the suite view and the charts compare backends and precisions there)."""
    return (df.allocator == "default") & (df.fpmath == "strict") & (df.env_axes == "default")


def plot_model(df, model: str, folder: Path) -> dict:
    """Latency vs threads, throughput vs batch size, and precisions, for one model (ok rows only)."""
    ok = df[(df.model == model) & (df.status == "ok") & (df.instances == 1) & default_runtime(df)]
    if ok.empty:
        return {}
    batch, threads = ok.batch_size.min(), ok.threads.max()
    plots = {}
    path = _line_plot(ok[ok.batch_size == batch], "threads", "median_ms", "median latency (ms)",
                      f"{model}: latency vs threads, batch {batch}", folder / f"{safe_name(model)}-threads.png")
    if path:
        plots["latency vs threads"] = path
    path = _line_plot(ok[ok.threads == threads], "batch_size", "throughput", f"throughput ({ok.unit.iloc[0]})",
                      f"{model}: throughput vs batch size, {threads} thread(s)", folder / f"{safe_name(model)}-batch.png")
    if path:
        plots["throughput vs batch size"] = path
    at = ok[(ok.batch_size == batch) & (ok.threads == threads)]
    if at.precision.nunique() > 1:
        pivot = at.pivot_table(index="backend", columns="precision", values="median_ms", aggfunc="first")
        fig, ax = figure()
        pivot.plot.bar(ax=ax, rot=0)
        ax.set_ylabel("median latency (ms)")
        ax.set_title(f"{model}: precisions, batch {batch}, {threads} thread(s)")
        plots["precisions"] = save(fig, folder / f"{safe_name(model)}-precisions.png")
    return plots


def plot_accuracy(rows, metric: str, title: str, path: Path) -> Path:
    """A task metric (points) against the speedup over eager fp32, a point per backend x precision, the Pareto
    front (the `pareto` column) joined: what each step up in speed costs in accuracy."""
    fig, ax = figure(8.0, 4.5)
    front = rows[rows.pareto].sort_values("speedup_vs_eager_fp32")
    ax.plot(front.speedup_vs_eager_fp32, front[metric], color="tab:red", linewidth=1, zorder=1, label="Pareto front")
    ax.scatter(rows.speedup_vs_eager_fp32, rows[metric], zorder=2,
               c=["tab:red" if p else "tab:blue" for p in rows.pareto])
    for row in rows.itertuples():
        ax.annotate(f"{row.backend}/{row.precision}", (row.speedup_vs_eager_fp32, getattr(row, metric)),
                    textcoords="offset points", xytext=(4, 4), fontsize=7)
    ax.axvline(1.0, color="black", linewidth=0.8)
    ax.set_xlabel("speedup over eager fp32 (eager = 1.0)")
    ax.set_ylabel(f"{metric} (points)")
    ax.set_title(title, fontsize=9)
    ax.legend(fontsize=7)
    return save(fig, path)


def plot_decode_roofline(rows, title: str, path: Path) -> Path:
    """Decode tokens/s, a bar per backend grouped by precision, each labelled with its share of the roofline;
    over each precision a dashed line at its bandwidth-bound tokens/s (`bound_tokens_per_s`). A logarithmic
    axis when that bound is far above the bars, so both read."""
    from ..core.precision import PRECISIONS

    precisions = sorted(rows.precision.unique(), key=lambda p: (PRECISIONS.index(p) if p in PRECISIONS else 99, p))
    backends = sorted(rows.backend.unique())
    fig, ax = figure(max(8.0, 1.4 * len(precisions) * max(1, len(backends)) ** 0.5), 4.5)
    width = 0.8 / len(backends)
    labelled = set()
    for j, backend in enumerate(backends):
        for i, precision in enumerate(precisions):
            sel = rows[(rows.backend == backend) & (rows.precision == precision)]
            if sel.empty:
                continue
            row = sel.iloc[0]
            x = i - 0.4 + width * (j + 0.5)
            ax.bar(x, row.decode_tokens_per_s, width, color=f"C{j % 10}",
                   label=None if backend in labelled else backend)
            labelled.add(backend)
            if _finite(row.roofline_share_pct):
                ax.annotate(f"{row.roofline_share_pct:.1f}%", (x, row.decode_tokens_per_s), ha="center",
                            va="bottom", fontsize=7, textcoords="offset points", xytext=(0, 2))
    bounds = []
    for i, precision in enumerate(precisions):
        bound = rows[rows.precision == precision].bound_tokens_per_s.dropna()
        if bound.empty:
            continue
        bounds.append(bound.median())
        ax.hlines(bounds[-1], i - 0.45, i + 0.45, colors="black", linestyles="--",
                  label="memory-bandwidth bound" if len(bounds) == 1 else None)
        ax.annotate(f"{bounds[-1]:.0f}", (i + 0.45, bounds[-1]), ha="right", va="bottom", fontsize=7)
    lowest = rows.decode_tokens_per_s[rows.decode_tokens_per_s > 0]
    if bounds and not lowest.empty and max(bounds) / lowest.min() > 30:
        from matplotlib.ticker import NullFormatter, ScalarFormatter

        ax.set_yscale("log")
        ax.yaxis.set_major_formatter(ScalarFormatter())
        ax.yaxis.set_minor_formatter(NullFormatter())
    modes = dict(zip(rows.precision, rows.precision_mode))
    ax.set_xticks(range(len(precisions)),
                  [p + (f"\n{modes[p]}" if modes.get(p) and modes[p] != p else "") for p in precisions])
    ax.set_ylabel("decode tokens/s (labels: % of roofline)")
    ax.set_title(title, fontsize=9)
    ax.legend(fontsize=7)
    return save(fig, path)


def plot_decode_lines(rows, x: str, series: list[str], title: str, path: Path) -> Path:
    """Decode tokens/s against `x` (prompt tokens, batch size), one line per value of the `series` columns."""
    fig, ax = figure()
    for key, g in rows.groupby(series, dropna=False):
        g = g.sort_values(x)
        label = " ".join(f"{name.replace('_tokens', '')}={v}" if name not in ("backend", "precision") else str(v)
                         for name, v in zip(series, key if isinstance(key, tuple) else (key,)))
        ax.plot(g[x], g.decode_tokens_per_s, marker="o", label=label)
    ax.set_xscale("log", base=2)
    ticks = sorted(rows[x].unique())
    ax.set_xticks(ticks, [str(int(t)) for t in ticks])
    ax.minorticks_off()
    ax.set_xlabel({"prompt_tokens": "prompt length (tokens)", "batch_size": "batch size"}.get(x, x))
    ax.set_ylabel("decode tokens/s")
    ax.set_title(title, fontsize=9)
    ax.legend(fontsize=7)
    return save(fig, path)


def plot_profile_categories(labels: list[str], shares: list[dict], names: list[str], path: Path) -> Path:
    """Stacked bars: each profiled configuration's time by op category (shares of its profiled time)."""
    fig, ax = figure(8.0, 1.2 + 0.45 * len(labels))
    draw_profile_categories(ax, labels, shares, names)
    return save(fig, path)


def draw_profile_categories(ax, labels: list[str], shares: list[dict], names: list[str]) -> None:
    """The bars of `plot_profile_categories` on a given axis (the notebooks draw them inline)."""
    left = np.zeros(len(labels))
    for name in names:
        values = np.array([100 * s.get(name, 0.0) for s in shares])
        ax.barh(range(len(labels)), values, left=left, label=name)
        left += values
    ax.set_yticks(range(len(labels)), labels, fontsize=8)
    ax.invert_yaxis()
    ax.set_xlim(0, 100)
    ax.set_xlabel("share of profiled time (%)")
    ax.set_title("where the time goes, by op category")
    ax.legend(fontsize=7, loc="center left", bbox_to_anchor=(1.0, 0.5))


def plot_knee(rows, title: str, path: Path) -> Path:
    """p99 latency against the offered Server rate, one line per backend x precision x batch x layout; VALID
    points filled, INVALID ones crosses, each line's latency bound dashed."""
    fig, ax = figure()
    for key, g in rows.groupby(["backend", "precision", "batch_size", "layout"]):
        g = g.sort_values("target_qps")
        line = ax.plot(g.target_qps, g.p99_ms, label=f"{key[0]} {key[1]} b{key[2]} {key[3]}")[0]
        valid = g.validity == "VALID"
        ax.scatter(g.target_qps[valid], g.p99_ms[valid], color=line.get_color(), marker="o", zorder=3)
        ax.scatter(g.target_qps[~valid], g.p99_ms[~valid], color=line.get_color(), marker="x", zorder=3)
        for bound in g.latency_bound_ms.dropna().unique():
            ax.axhline(bound, color=line.get_color(), linestyle="--", linewidth=0.8)
    ax.set_xlabel("offered load (queries/s)")
    ax.set_ylabel("p99 latency (ms)")
    ax.set_yscale("log")
    ax.set_title(title + " (o VALID, x INVALID; dashed: the bound)", fontsize=9)
    ax.legend(fontsize=7)
    return save(fig, path)


def plot_instances(df, path: Path) -> Path | None:
    """Aggregate throughput per instance layout (N instances x T threads), per model and backend."""
    ok = df[(df.status == "ok") & ~df.scenario.astype(str).str.startswith("loadgen")]     # LoadGen: its own view
    groups = [(k, g) for k, g in ok.groupby(["model", "backend", "precision", "batch_size"])
              if (g.instances > 1).any()]
    if not groups:
        return None
    fig, ax = figure(8.0, 1.0 + 0.5 * sum(len(g) for _, g in groups))
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
    return save(fig, path)


def plot_history(rows: list[dict], title: str, path: Path) -> Path:
    """Median latency per run with its confidence interval, one line per configuration."""

    fig, ax = figure(9.0, 4.0)
    groups = {}
    for r in rows:
        if r["status"] == "ok" and r["median_ms"]:
            label = f"{r['backend']} {r['precision']} b{r['batch_size']} t{r['threads']}" + \
                    (f" x{r['instances']}" if r["instances"] > 1 else "")
            groups.setdefault(label, []).append(r)
    for label, rs in sorted(groups.items()):
        x = [r["run"] for r in rs]
        y = [r["median_ms"] for r in rs]
        lo = [r["median_ms"] - (r["ci_low"] if _finite(r["ci_low"]) else r["median_ms"]) for r in rs]
        hi = [(r["ci_high"] if _finite(r["ci_high"]) else r["median_ms"]) - r["median_ms"] for r in rs]
        ax.errorbar(x, y, yerr=[lo, hi], marker="o", capsize=3, label=label)
    from matplotlib.ticker import MaxNLocator

    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_xlabel("history run")
    ax.set_ylabel("median latency (ms)")
    ax.set_title(title)
    if groups:
        ax.legend(fontsize=7)
    return save(fig, path)


def _finite(v) -> bool:
    return isinstance(v, (int, float)) and np.isfinite(v)
