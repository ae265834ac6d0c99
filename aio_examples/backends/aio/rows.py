"""The rows stage: the model rewritten to compute only the rows its output reads (aio_compile/rows.py), tried on a
strategy with its kept knobs and kept like a knob (trials.py)."""

import copy
import dataclasses
import functools
import time

from ...core.errors import UnsupportedError, UsageError, short_error
from ...core.log import logger
from . import choose, trials


def rewritten(model, example_inputs, ctx):
    """(the model computing only the rows its output reads, its context, what was narrowed: aio_compile.rows.Pruned),
    or UnsupportedError. The rewritten graph is a model of its own in the engines' caches, and keeps the
    original's int8 scheme (its graph has no Conv2d modules to count)."""
    import hashlib

    from ...aio_compile.rows import prune
    from ..int8 import is_conv_net

    found = prune(copy.deepcopy(model), example_inputs)
    if found is None:
        raise UnsupportedError("no op computes rows the output does not read (or the model does not export)")
    gm = found.module
    gm.is_conv_net = functools.partial(bool, is_conv_net(model, example_inputs))
    digest = hashlib.sha256(gm.code.encode()).hexdigest()[:16]
    return gm, dataclasses.replace(ctx, weights_id=f"{ctx.weights_id}-rows-{digest}"), found


def note(found) -> str:
    return (f"{found.narrowed} ops compute only the rows the output reads, {found.flops_saved:.1%} fewer FLOPs "
            "(aio_compile/rows.py)")


def tune(backend, strategy, chosen: tuple, model, weights: int, example_inputs, precision, threads, ctx,
         checked: bool, tuning: dict) -> tuple:
    """Try the model rewritten to compute only the rows its output reads (aio_compile/rows.py) on the chosen
    strategy with the knobs kept, timed against the choice so far and kept like a knob (a win confirmed
    against a fresh instance). Returns (model, ctx, (prepared, pass)) for what follows: the rewritten
    ones when kept. Fills `tuning["rows"]`."""
    import torch

    start = time.monotonic()
    trial = tuning["rows"] = {}
    short = choose.memory_short(weights * 2)
    if short:
        trial["not_tried"] = short
        return model, ctx, chosen
    try:
        rows_model, rows_ctx, found = rewritten(model, example_inputs, ctx)
    except UnsupportedError as exc:
        del tuning["rows"]                  # nothing to try: not worth a line in every record
        logger.debug("aio rows stage: %s", exc)
        return model, ctx, chosen
    trial.update(ops_narrowed=found.narrowed, flops_saved=round(found.flops_saved, 4),
                 rule="kept when its median is at least 1% faster in two trials: the same computation in fewer "
                      "FLOPs needs no interval clear of the other's")
    kept = tuning.get("knobs") or {}
    try:
        p, one_pass, failed = backend._prepare_checked(strategy, rows_model, example_inputs, precision, threads,
                                                       dataclasses.replace(rows_ctx, knobs=dict(kept)), checked)
    except UsageError:
        raise
    except Exception as exc:  # noqa: BLE001  (a rewritten graph this engine cannot take is not kept)
        trial["not_tried"] = short_error(exc)
        return model, ctx, chosen
    if failed:
        trial.update(kept=False, why=f"outputs fail the output check: {failed}")
        return model, ctx, chosen
    with torch.no_grad():
        wins = trials.run(chosen[1], "rows", one_pass, ctx.time_passes, threads, trial, tuning,
                          ("all rows", "rows read"), "the rows read alone", clear_needed=False)
    if wins:
        wins = trial["kept"] = trials.confirm(backend, strategy, model, weights, example_inputs, precision, threads,
                                              ctx, kept, "rows", one_pass, trial, tuning, clear_needed=False)
    trial["rows_tuning_s"] = round(time.monotonic() - start, 1)
    if not wins:
        return model, ctx, chosen
    p.info["rows"] = note(found)
    return rows_model, rows_ctx, (p, one_pass)
