"""The report's view of serving under MLPerf LoadGen: every LoadGen test, the Server knee and the peak rates.

Records of `aio-examples loadgen` (drivers/loadgen.py) have the scenario name `loadgen`, LoadGen's settings
in `scenario` and its verdict and figures in `metrics.loadgen`. Every Server test is a point of its
configuration's latency-against-offered-load curve, so unlike the summary (the latest record per
configuration) this view keeps them all. Only reports with such records get the section.
"""

import html
import math
from pathlib import Path

from ..core.paths import safe_name
from ..core.records import Result
from .plots import plot_knee

INTRO = ("<p>Each row is one LoadGen test: LoadGen issued the queries and judged the run by its own rules "
         "(VALID or INVALID, with the reasons). Server rows are points of the knee below: p99 latency against "
         "the offered rate, for each backend, precision and instance layout; a peak is the highest rate "
         "LoadGen judged VALID under the latency bound.</p>")


def frame(records):
    """One row per LoadGen test (`kind` "test") or peak search (`kind` "peak"), in time order."""
    import pandas as pd

    rows = []
    for r in records:
        r = r if isinstance(r, Result) else Result.from_dict(r)
        sc = r.scenario or {}
        if sc.get("name") != "loadgen":
            continue
        lg = (r.metrics or {}).get("loadgen") or {}
        lat = lg.get("latency_ms") or {}
        peak = sc.get("key", "").endswith("-peak")
        rows.append({"model": r.model, "backend": r.backend, "precision": r.precision, "batch_size": r.batch_size,
                     "layout": f"{r.instances}x{r.threads}", "kind": "peak" if peak else "test",
                     "scenario": sc.get("scenario"), "mode": sc.get("mode", "performance"), "status": r.status,
                     "target_qps": sc.get("target_qps"), "latency_bound_ms": sc.get("latency_ms"),
                     "validity": lg.get("validity"), "samples_per_s": lg.get("samples_per_s"),
                     "p50_ms": lat.get("p50"), "p90_ms": lat.get("p90"), "p99_ms": lat.get("p99"),
                     "peak_qps": lg.get("peak_qps") if peak else None, "offline_qps": lg.get("offline_qps"),
                     "reasons": "; ".join(lg.get("reasons") or []) or (r.reason or ""),
                     "timestamp": r.timestamp})
    return pd.DataFrame(rows)


def table(df) -> str:
    tests = df[df.kind == "test"].drop(columns=["kind", "peak_qps", "offline_qps", "timestamp"])
    parts = [INTRO, _html(tests)]
    peaks = df[df.kind == "peak"]
    if not peaks.empty:
        parts.append("<h3>Peak Server rate under the latency bound</h3>")
        parts.append(_html(peaks[["model", "backend", "precision", "batch_size", "layout", "latency_bound_ms",
                                  "peak_qps", "offline_qps", "status", "reasons"]]))
    return "\n".join(parts)


def _html(df) -> str:
    shown = df.copy()
    for c in shown.columns:
        if shown[c].dtype.kind == "f":
            shown[c] = shown[c].map(lambda v: "" if math.isnan(v) else f"{v:.2f}")
    return shown.fillna("").to_html(index=False, escape=True)


def plots(df, model: str, out: Path) -> dict:
    """The knee chart of `model`'s Server tests, when it has any."""
    server = df[(df.kind == "test") & (df.scenario == "Server") & (df.model == model) & (df.status == "ok")]
    if server.empty:
        return {}
    return {"serving": plot_knee(server, f"{html.unescape(model)}: p99 latency against offered load (LoadGen Server)",
                                 out / f"{safe_name(model)}-serving-knee.png")}
