"""The regression report of a comparison (analysis/compare.py): Markdown, HTML and JSON."""

import html
import json
import math
from collections import Counter
from datetime import UTC, datetime

from ..analysis.compare import Comparison, accuracy_line, pct
from ..core.errors import UsageError
from ..core.records import strict
from .page import STYLE


def _table_rows(rows: list[dict]) -> list[dict]:
    shown = []
    for r in rows:
        lat, tp = r["latency_change"], r["throughput_change"]
        shown.append({
            "model": r["model"], "backend": r["backend"], "precision": r["precision"], "batch": r["batch_size"],
            "threads": r["threads"], "inst": r["instances"],
            "baseline ms": f"{r['baseline_ms']:.2f}" if r["baseline_ms"] else r["baseline_status"],
            "new ms": f"{r['new_ms']:.2f}" if r["new_ms"] else r["new_status"],
            "latency": pct(lat["rel"]) if lat else "-",
            f"{round(100 * (lat or tp or {}).get('confidence', 0.95))}% CI":
                f"{pct(lat['low'])} .. {pct(lat['high'])}" if lat and math.isfinite(lat["low"]) else "-",
            "throughput": pct(tp["rel"]) if tp else "-",
            "run noise": f"{100 * r['noise']['se']:.1f}% ({r['noise']['kind']})" if r.get("noise") else "-",
            "verdict": r["verdict"], "why": r["why"],
        })
    return shown


def _accuracy_rows(rows: list[dict]) -> list[dict]:
    return [{"model": r["model"], "backend": r["backend"], "precision": r["precision"], "batch": r["batch_size"],
             "threads": r["threads"], "inst": r["instances"], "dataset": r["dataset"],
             "samples": " -> ".join(str(n) for n in r["accuracy"]["samples"]),
             "metrics": "; ".join(accuracy_line(m, x) for m, x in r["accuracy"]["metrics"].items()),
             "verdict": r["accuracy"]["verdict"], "why": r["accuracy"]["why"]} for r in rows]


SECTIONS = (("regression", "Regressions"), ("suspicious", "Suspicious"), ("improvement", "Improvements"),
            ("unchanged", "Unchanged"))


def _sections(c: Comparison):
    """(prefix, verdict, title, table rows): the timing verdicts, then the accuracy verdicts (judged apart)."""
    for prefix, verdict_of, table in (("", lambda r: r["verdict"], _table_rows),
                                      ("accuracy ", lambda r: (r.get("accuracy") or {}).get("verdict"), _accuracy_rows)):
        for verdict, title in SECTIONS:
            rows = [r for r in c.rows if verdict_of(r) == verdict]
            if rows:
                yield prefix, verdict, (prefix + title.lower()).capitalize(), table(rows)


def accuracy_summary(c: Comparison) -> str:
    """The accuracy verdicts and tolerances in one clause; empty when no configuration was judged on accuracy."""
    n = c.accuracy_counts
    if not sum(n.values()):
        return ""
    tolerances = c.tolerances
    named = ", ".join(f"{m} {100 * t:g}" for m, t in sorted(tolerances.items()) if m != "default")
    return (f"; accuracy: {n['regression']} regression(s), {n['suspicious']} suspicious, "
            f"{n['improvement']} improvement(s), {n['unchanged']} unchanged, tolerance "
            f"{100 * tolerances['default']:g} pt" + (f" ({named} pt)" if named else ""))


def summary_line(c: Comparison) -> str:
    n = c.counts
    return (f"{n['regression']} regression(s), {n['suspicious']} suspicious, {n['improvement']} improvement(s), "
            f"{n['unchanged']} unchanged, {n['missing']} missing, {n['new']} new; threshold {100 * c.threshold:g}%, "
            f"{100 * c.confidence:g}% intervals of the change (passes and between-run noise)"
            + (f"; ignoring {', '.join(c.ignore)}" if c.ignore else "") + accuracy_summary(c))


def noise_line(c: Comparison) -> str:
    """Where the between-run term of the intervals came from, over the configurations judged on timings."""
    kinds = Counter((r["noise"] or {}).get("kind") for r in c.rows if r["latency_change"] or r["throughput_change"])
    if not kinds:
        return ""
    said = {"repeats": "repeated processes", "history": "the history's run-to-run spread",
            "turns": "the spread of the processes' turns",
            "spread": "the spread of the other configurations' changes", "machine": "the machine slopes' error only"}
    parts = [f"{said[k]} for {n}" for k, n in kinds.items() if k]
    if kinds.get(None):
        parts.append(f"nothing for {kinds[None]} (their intervals cover the passes only)")
    return "Between-run noise in the intervals: " + "; ".join(parts) + "."


READING_SAID = {
    "reference": "the machine reference (one core's speed at numpy matmuls: no framework code in it)",
    "probe": "the machine probe (how fast the cores hand work over, on the framework's own threads; a build "
             "that changes how its threads synchronise moves it too: compare its change with the raw one)",
}


def machine_line(c: Comparison) -> str:
    """What the machine readings took out, over the configurations that carried them on both sides."""
    rows = [r for r in c.rows if r.get("machine_readings")]
    if not rows:
        return ""
    moved = [r["machine_readings"]["raw_change"] - (r["latency_change"] or {}).get("rel", r["machine_readings"]["raw_change"])
             for r in rows]
    parts = []
    for name, said in READING_SAID.items():
        read = [r["machine_readings"]["readings"][name] for r in rows if name in r["machine_readings"]["readings"]]
        if read:
            changes = [x["change"] for x in read]
            parts.append(f"{said} on both sides of {len(read)}: it changed {pct(min(changes))} .. "
                         f"{pct(max(changes))}, and {sum(x['slope'] > 0 for x in read)} followed it")
    return (f"Machine readings beside every second of passes: {'; '.join(parts)}. The changes judged are with "
            f"the machine's share taken out ({pct(min(moved))} .. {pct(max(moved))} of raw change).")


def to_markdown(c: Comparison) -> str:
    import pandas as pd

    lines = [f"## Performance comparison: `{c.new.label}` vs baseline `{c.baseline.label}`", ""]
    lines += [f"> **{note}**" for note in c.notes] + ([""] if c.notes else [])
    lines += [f"**{summary_line(c)}**", ""] + [x for line in (noise_line(c), machine_line(c)) if line
                                                for x in (line, "")]
    for _, verdict, title, rows in _sections(c):
        table = pd.DataFrame(rows).to_markdown(index=False)
        if verdict == "unchanged":
            lines += [f"<details><summary>{title} ({len(rows)})</summary>", "", table, "", "</details>", ""]
        else:
            lines += [f"### {title} ({len(rows)})", "", table, ""]
    for items, title in ((c.missing, "Missing (baseline only)"), (c.added, "New (new run only)")):
        if items:
            lines += [f"### {title} ({len(items)})", "",
                      pd.DataFrame(items).drop(columns=["machine"]).to_markdown(index=False), ""]
    return "\n".join(lines)


def to_html(c: Comparison) -> str:
    import pandas as pd

    esc = html.escape
    parts = [(f"<!doctype html><html><head><meta charset='utf-8'><title>aio-examples comparison</title>"
             f"<style>{STYLE}.regression{{color:#a00;font-weight:bold}}.improvement{{color:#070}}"
             f".suspicious{{color:#a60}}</style></head><body>"),
             (f"<h1>Performance comparison</h1><p>New <code>{esc(c.new.label)}</code> against baseline "
             f"<code>{esc(c.baseline.label)}</code>; generated {datetime.now(UTC).isoformat(timespec='seconds')}.</p>")]
    parts += [f"<p class='bad'><b>{esc(note)}</b></p>" for note in c.notes]
    parts.append(f"<p><b>{esc(summary_line(c))}</b></p><p>{esc(noise_line(c))}</p><p>{esc(machine_line(c))}</p>")
    for prefix, verdict, _, rows in _sections(c):
        table = pd.DataFrame(rows).to_html(index=False, escape=True)
        parts.append(f"<h2 class='{verdict}'>{prefix}{verdict} ({len(rows)})</h2>{table}")
    for items, title in ((c.missing, "Missing (baseline only)"), (c.added, "New (new run only)")):
        if items:
            parts.append(f"<h2>{title} ({len(items)})</h2>"
                         + pd.DataFrame(items).drop(columns=["machine"]).to_html(index=False))
    parts.append("</body></html>")
    return "\n".join(parts)


def to_json(c: Comparison) -> str:
    # JSON has no infinity: an interval that could not be computed is null, as in the records.
    return json.dumps(strict({
        "baseline": c.baseline.label, "new": c.new.label, "threshold": c.threshold, "confidence": c.confidence,
        "accuracy_tolerance": c.tolerances,
        "ignore": list(c.ignore), "notes": c.notes, "counts": c.counts, "exit_code": c.exit_code,
        "configurations": c.rows, "missing": c.missing, "new_only": c.added,
    }), indent=1)


FORMATS = {"md": to_markdown, "html": to_html, "json": to_json}


def check_format(fmt: str) -> None:
    if fmt not in FORMATS:
        raise UsageError(f"--format {fmt!r} is unknown; accepted: {', '.join(FORMATS)}")


def render(c: Comparison, fmt: str) -> str:
    check_format(fmt)
    return FORMATS[fmt](c)
