"""The nightly step after a run: store it in the history, compare it with its baseline, write the report.

The baseline is the latest run stored for the same machine that was measured before this one, unless one
is given. The run is stored whatever the verdict, so the history holds every night.
"""

from pathlib import Path

from ..analysis import compare as cmp
from ..analysis.history import History, load_run
from . import regression


def nightly(results, baseline: str | None = None, history_path=None, threshold: float = cmp.DEFAULT_THRESHOLD,
            out_dir=None, accuracy_tolerance: dict | None = None) -> tuple[int, dict]:
    """Returns (exit code: 1 on any regression, of timing or of accuracy, else 0; {format: path written} plus
    what happened). `accuracy_tolerance`: as compare's (cmp.parse_accuracy_tolerance; default 0.5 points)."""
    new = load_run(results)
    out = Path(out_dir) if out_dir else Path(results) / "regression"
    out.mkdir(parents=True, exist_ok=True)
    with History.open(history_path) as h:
        run_id, fresh = h.add(new, label=f"nightly {Path(results).name}")
        machine = new.machine
        if baseline:
            base = load_run(baseline, h.path)
        else:
            base_id = h.latest(machine, exclude=run_id, before=new.started_at)
            base = h.run(str(base_id)) if base_id else None
        info = {"run_id": run_id, "stored": fresh, "history": str(h.path),
                "baseline": base.label if base else None}
        if base is None:
            text = (f"No baseline yet for this machine ({'; '.join(new.machines().values()) or 'unknown'}): "
                    f"this run is stored as history:{run_id} and becomes the next night's baseline.\n")
            (out / "regression.md").write_text(text)
            return 0, {**info, "md": out / "regression.md", "text": text}
        keys = new.configurations().keys()
        noise = h.run_noise(machine, keys, before=run_id)
    comparison = cmp.compare(base, new, threshold, run_noise=noise, accuracy_tolerance=accuracy_tolerance)
    written = {}
    for fmt in regression.FORMATS:
        written[fmt] = out / f"regression.{fmt}"
        written[fmt].write_text(regression.render(comparison, fmt))
    return comparison.exit_code, {**info, **written, "summary": regression.summary_line(comparison),
                                  "noise_known": len(noise)}
