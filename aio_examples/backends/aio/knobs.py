"""The knob stage: settings tried on a strategy beyond its defaults (settings.KNOBS), one at a time, each on a
preparation of its own, kept only when it wins a trial (trials.py)."""

import dataclasses
import time

from ...core.errors import UsageError, short_error
from . import choose, compiled, settings, trials


def best_has_knobs(prepared: dict, model) -> bool:
    """Whether a knob stage may follow the choice: some prepared strategy has KNOBS (not a generation step)."""
    from ..int8 import is_generation_step

    return any(s in settings.KNOBS for s in prepared) and not is_generation_step(model)


def tune(backend, strategy, chosen: tuple, model, weights: int, example_inputs, precision, threads, ctx,
         checked: bool, tuning: dict, quick: bool = False) -> tuple:
    """Try each of the strategy's KNOBS (a quick tuning: its QUICK_KNOBS, within QUICK_KNOB_BUDGET_S) on a
    preparation of its own, timed against the settings kept so far: keep it when it wins beyond noise in quiet
    rounds. Returns the (prepared, pass) kept; fills `tuning["knobs"]` (the settings kept) and
    `tuning["knob_trials"]` (each knob: what was timed, or why not), and marks the decision not to be saved
    when a trial's rounds were not quiet."""
    import gc

    import torch

    budget = settings.QUICK_KNOB_BUDGET_S if quick else settings.knob_settings()[1]
    offered = [(n, v) for n, v in settings.KNOBS[strategy] if not quick or n in settings.QUICK_KNOBS]
    kept, tried, start = {}, {}, time.monotonic()
    compiled_reasons = (compiled.knob_reasons([n for n, _ in offered], model, example_inputs, precision)
                        if strategy == "compiled" else {})
    for name, value in offered:
        trial = tried[name] = {"value": value}
        reason = (compiled_reasons[name] if strategy == "compiled"
                  else backend.engines[strategy].knob_reason(name, precision))
        if reason:                # known before a copy of the model is made for its trial
            trial["not_tried"] = reason
            continue
        spent = time.monotonic() - start
        short = choose.memory_short(weights * 2)
        if spent > budget or short:
            trial["not_tried"] = short or f"the knob budget ({budget:.0f} s, AIO_KNOB_BUDGET_S) was spent"
            continue
        try:
            p, one_pass, failed = backend._prepare_checked(
                strategy, backend._copy(strategy, model, precision), example_inputs, precision, threads,
                dataclasses.replace(ctx, knobs={**kept, name: value}), checked)
        except UsageError:
            raise
        except Exception as exc:  # noqa: BLE001  (a knob this model or engine cannot take is not kept)
            trial["not_tried"] = short_error(exc)
            continue
        if failed:
            trial["not_tried"] = f"outputs fail the output check: {failed}"
            continue
        with torch.no_grad():
            wins = trials.run(chosen[1], name, one_pass, ctx.time_passes, threads, trial, tuning, ("without", "with"),
                              f"knob {name}")
        if wins:
            wins = trial["kept"] = trials.confirm(backend, strategy, model, weights, example_inputs, precision,
                                                  threads, ctx, kept, name, one_pass, trial, tuning)
        if wins:
            kept[name], chosen = value, (p, one_pass)
        del p, one_pass
        gc.collect()
    tuning.update(knobs=kept, knob_trials=tried, knob_tuning_s=round(time.monotonic() - start, 1))
    return chosen
