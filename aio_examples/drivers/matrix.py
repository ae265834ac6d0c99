"""The support matrix: every zoo model x backend x precision runs, or says why it cannot.

Each (model, backend) runs in its own process at the model's small smoke shape with a few passes;
a process that crashes or hangs is retried one precision at a time, and a cell that still dies gets
a `failed`/`timeout` record with the signal and the last stderr line. Cells already in the output
are skipped, so an interrupted matrix resumes. The Markdown rendering goes into docs/backends.md.
"""

import re
from pathlib import Path

from ..core import records as res
from ..core.log import logger
from ..core.processes import run_isolated
from .worker import failure_of, record_failure, run_argv

README_START = "<!-- support-matrix:start (aio-examples matrix --readme docs/backends.md) -->"
README_END = "<!-- support-matrix:end -->"
MARKS = {"ok": "ok", "fail_accuracy": "FAIL acc", "unsupported": "n/a", "failed": "failed", "timeout": "timeout",
         "crashed": "crashed"}


def _cells(out_dir: Path) -> dict:
    """Latest record per (model, backend, precision) in a matrix folder."""
    return {(r.model, r.backend, r.precision): r for r in res.records_in(out_dir)}


def run_matrix(models, backends, precisions, out_dir: Path, threads: int | None, point_timeout_s: float,
               num_runs: int = 3) -> None:
    """Run every missing cell, one process per (model, backend)."""
    from ..models import get_model

    done = _cells(out_dir)
    for model in models:
        spec = get_model(model)
        for backend in backends:
            todo = [p for p in precisions if (model, backend, p) not in done]
            if not todo:
                continue
            logger.info("matrix: %s on %s at %s", model, backend, ",".join(todo))
            base = run_argv(model, spec.smoke_shape(), backend=backend, num_runs=num_runs, timeout=10,
                            output=out_dir, threads=threads or None)
            outcome = run_isolated([*base, "-p", ",".join(todo)], point_timeout_s * len(todo))
            # A process that crashed, or refused the precisions together (a big model's copies not fitting in
            # memory at once) without a record of them: one precision at a time, and a cell that still has no
            # record gets one saying why
            missing = [p for p in todo if (model, backend, p) not in _cells(out_dir)]
            if not missing:
                continue
            if len(todo) == 1:
                _record_crash(out_dir, spec, backend, todo[0], threads, outcome)
                continue
            for precision in missing:
                outcome = run_isolated([*base, "-p", precision], point_timeout_s)
                if (model, backend, precision) not in _cells(out_dir):
                    _record_crash(out_dir, spec, backend, precision, threads, outcome)


def _record_crash(out_dir, spec, backend, precision, threads, outcome) -> None:
    status, reason, crash = failure_of(outcome)      # exit 2: the run refused it up front, saying why (memory)
    record_failure(out_dir, spec, backend, precision, 1, threads or 0, spec.smoke_shape(), status, reason, crash=crash)


def previous_cells(readme_text: str) -> dict:
    """(model, backend, precision) -> (mark, reason or None) of the table between a file's support-matrix
    markers: the rows a matrix of some models only keeps for the others."""
    if README_START not in readme_text or README_END not in readme_text:
        return {}
    section = readme_text.split(README_START, 1)[1].split(README_END, 1)[0]
    notes = {m[1]: m[2] for m in re.finditer(r"^(\d+)\. (.*)$", section, re.MULTILINE)}
    measured = re.search(r"^Measured on (.*)\.$", section, re.MULTILINE)
    cells, precision, backends = {None: measured[1] if measured else "an earlier run"}, None, []
    for line in section.splitlines():
        if re.fullmatch(r"\*\*\w+\*\*", line.strip()):
            precision = line.strip("* ")
        elif line.startswith("| model |"):
            backends = [c.strip() for c in line.strip("|").split("|")[1:]]
        elif line.startswith("| ") and precision and not line.startswith("|---"):
            model, *marks = [c.strip() for c in line.strip("|").split("|")]
            for backend, mark in zip(backends, marks, strict=False):
                note = re.search(r" \[(\d+)\]$", mark)
                cells[(model, backend, precision)] = ((mark[:note.start()], notes.get(note[1])) if note
                                                      else (mark, None))
    return cells


def render(out_dir: Path, models, backends, precisions, previous: dict | None = None) -> str:
    """One Markdown table per precision (models x backends) with numbered reasons below. `previous` (from
    `previous_cells`) fills the cells of models this folder has no records of: their earlier rows."""
    cells, previous = _cells(out_dir), dict(previous or {})
    earlier = previous.pop(None, "an earlier run")
    before = list(dict.fromkeys(key[0] for key in previous))
    kept = [m for m in before if m not in models]
    rows = list(dict.fromkeys([*before, *models]))       # the earlier rows where they were, new models after
    notes: dict[str, int] = {}
    parts = []
    for precision in precisions:
        lines = [f"**{precision}**", "", "| model | " + " | ".join(backends) + " |",
                 "|---|" + "---|" * len(backends)]
        for model in rows:
            row = []
            for backend in backends:
                r = cells.get((model, backend, precision))
                if r is None and (model, backend, precision) in previous:
                    mark, reason = previous[(model, backend, precision)]
                    row.append(mark + (f" [{notes.setdefault(reason, len(notes) + 1)}]" if reason else ""))
                    continue
                if r is None:
                    row.append("-")
                    continue
                mark = MARKS.get(r.status, r.status)
                if r.status != "ok" and r.reason:
                    # Node names differ from model to model; the reason does not.
                    reason = re.sub(r" in node \([^)]*\)", "", r.reason)
                    number = notes.setdefault(reason, len(notes) + 1)
                    mark += f" [{number}]"
                elif r.status == "ok" and r.strategy and r.strategy != backend:
                    mark += f" ({r.strategy})"
                row.append(mark)
            lines.append(f"| {model} | " + " | ".join(row) + " |")
        parts.append("\n".join(lines))
    legend = ("`ok`: runs and its outputs match eager fp32 within the precision's tolerance (for `aio`, the "
              "strategy it chose is in brackets); `n/a`: unsupported, for the reason given; "
              "`FAIL acc`: runs but its outputs are outside the tolerance; `-`: not run.")
    reasons = "\n".join(f"{n}. {reason}" for reason, n in notes.items())
    env = next((r.env for r in cells.values() if r.env), {})
    versions = env.get("versions") or {}
    machine = (f"Measured on {env.get('cpu_model', 'an unknown CPU')} "
               f"(ISA: {', '.join(i for i in env.get('isa', []) if i.startswith(('avx512', 'amx')) or i == 'avx2')}) with "
               + ", ".join(f"{k} {v}" for k, v in versions.items() if v) + ".\n\n") if env else ""
    if kept:
        machine += (f"The rows of {', '.join(kept)} are kept from the previous table (not run this time), measured "
                    f"on {earlier}.\n\n")
    return machine + "\n\n".join(parts) + "\n\n" + legend + ("\n\n" + reasons if reasons else "") + "\n"


def update_readme(readme: Path, table: str) -> None:
    """Replace the text between the support-matrix markers of a Markdown file (docs/backends.md)."""
    text = readme.read_text()
    if README_START not in text or README_END not in text:
        raise ValueError(f"{readme} has no support-matrix markers ({README_START} ... {README_END})")
    head, rest = text.split(README_START, 1)
    _, tail = rest.split(README_END, 1)
    readme.write_text(head + README_START + "\n\n" + table + "\n" + README_END + tail)
