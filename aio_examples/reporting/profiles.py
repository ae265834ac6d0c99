"""The report's view of `--profile` runs: where each profiled configuration's time goes, by op category, and
its top ops (measurement/profile.py). Only reports with such records get the section."""

import html
from pathlib import Path

from ..core.records import Result
from ..measurement.profile import NAMES
from .page import img
from .plots import plot_profile_categories

INTRO = ("<p>Profiled passes run after the timed ones (the timings above are unprofiled). Self time per pass "
         "by op category, as a share of the configuration's profiled time, then each one's top ops: torch "
         "backends through torch.profiler, ONNX Runtime through its session profiling, OpenVINO through its "
         "performance counters (with the kernel it chose).</p>")


def profiled(records) -> list[Result]:
    """The latest profiled record per configuration."""
    latest = {}
    for r in records:
        r = r if isinstance(r, Result) else Result.from_dict(r)
        if (r.metrics or {}).get("profile"):
            latest[r.key()] = r
    return list(latest.values())


def plot(rows: list[Result], path: Path) -> Path:
    """The category bars of the profiled configurations (also for notebooks)."""
    labels = [f"{r.model} {r.backend} {r.precision} b{r.batch_size}" for r in rows]
    return plot_profile_categories(labels, [r.metrics["profile"]["categories_share"] for r in rows], NAMES, path)


def section(records, plot_dir: Path | None = None) -> str:
    rows = profiled(records)
    if not rows:
        return ""
    head = "".join(f"<th>{html.escape(n)}</th>" for n in NAMES)
    parts = ["<h2 id='profiles'>Where the time goes (profiles)</h2>", INTRO,
             (f"<table><tr><th>model</th><th>backend</th><th>precision</th><th>batch</th><th>tool</th>{head}"
             "<th>profiled ms a pass</th><th>op calls a pass</th></tr>")]
    if plot_dir is not None:
        parts.insert(2, img(plot(rows, plot_dir / "profile-categories.png"), "time by op category per configuration"))
    for r in rows:
        p = r.metrics["profile"]
        cells = "".join(f"<td>{100 * p['categories_share'].get(n, 0):.1f}%</td>" for n in NAMES)
        parts.append(f"<tr><td>{html.escape(r.model)}</td><td>{html.escape(r.backend)}</td><td>{r.precision}</td>"
                     f"<td>{r.batch_size}</td><td>{html.escape(p['tool'])}</td>{cells}<td>{p['total_ms']:.2f}</td>"
                     f"<td>{p['op_calls']}</td></tr>")
    parts.append("</table>")
    for r in rows:
        p = r.metrics["profile"]
        parts.append(f"<h3>Top ops: {html.escape(r.model)} {html.escape(r.backend)} {r.precision} "
                     f"b{r.batch_size}</h3><table><tr><th>op</th><th>category</th><th>ms a pass</th><th>share</th>"
                     "<th>calls a pass</th></tr>")
        parts += [f"<tr><td>{html.escape(o['op'])}</td><td>{o['category']}</td><td>{o['self_ms']:.3f}</td>"
                  f"<td>{100 * o['share']:.1f}%</td><td>{o['calls']}</td></tr>" for o in p["top"]]
        parts.append("</table>")
    return "\n".join(parts)
