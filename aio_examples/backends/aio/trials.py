"""A trial: a setting (a knob, the rows read alone, the split) timed against the pass kept so far, and kept only
when it wins beyond noise in quiet rounds, and against a fresh instance of the kept settings too."""

import dataclasses

from ...core.errors import short_error
from . import choose, settings


def run(kept_pass, name: str, challenger, time_passes, threads: int, trial: dict, tuning: dict,
        labels: tuple[str, str], what: str, clear_needed: bool = True) -> bool:
    """Time `challenger` against the pass kept so far (quiet interleaved rounds) and fill `trial` with both
    medians (under `labels`), the gain, clear and quiet: whether it is kept (at least KNOB_MIN_GAIN faster, clear
    of noise unless not `clear_needed`, quiet). Rounds that were not quiet mark the decision not to be saved
    (saying `what` was timed)."""
    timed = time_passes({"kept": kept_pass, name: challenger}, threads)
    without, with_ = timed.medians.get("kept"), timed.medians.get(name)
    gain = without / with_ - 1 if without and with_ else None
    trial.update(ms=dict(zip(labels, (without, with_), strict=True)), gain=None if gain is None else round(gain, 4),
                 clear=timed.clear, quiet=timed.quiet)
    trial["kept"] = bool(timed.quiet and (timed.clear or not clear_needed) and gain is not None
                         and gain >= settings.KNOB_MIN_GAIN)
    if not timed.quiet:
        tuning.setdefault("not_saved", f"the rounds timing {what} were not quiet; the next run tunes again")
    return trial["kept"]


def confirm(backend, strategy, model, weights: int, example_inputs, precision, threads, ctx, kept: dict, name,
            one_pass, trial: dict, tuning: dict, clear_needed: bool = True) -> bool:
    """Time a knob that won again, against a fresh instance of the settings kept so far (`trial["again"]`).

    Two instances of one engine with the same settings differ by a few percent: in one process, knobs that
    change nothing measurable "won" or "lost" by up to 2.7%. So a first win may be the kept instance's bad
    luck rather than the knob's; it is kept only if it wins against a second instance too."""
    import torch

    again = trial["again"] = {}
    short = choose.memory_short(weights)
    if short:
        again["not_tried"] = short
        return True
    try:
        control, control_pass, _ = backend._prepare_checked(
            strategy, backend._copy(strategy, model, precision), example_inputs, precision, threads,
            dataclasses.replace(ctx, knobs=dict(kept)), False)
    except Exception as exc:  # noqa: BLE001  (it ran before: the first trial's verdict stands)
        again["not_tried"] = short_error(exc)
        return True
    with torch.no_grad():
        wins = run(control_pass, name, one_pass, ctx.time_passes, threads, again, tuning, ("without", "with"),
                   f"{name} against a fresh instance", clear_needed)
    del control, control_pass
    return wins
