"""A cached decision's close engines raced again in the process that runs it (on a shared machine their order
changes from one process to the next), and the switching among the engines kept prepared (backends/switching.py)."""

import dataclasses
import time

from ...core.errors import UsageError, short_error
from ...core.log import logger
from ..base import Prepared, held_bytes
from . import choose, rows, settings


def rivals(decision: dict, offered) -> list[str]:
    """The whole-model engines (not generation's) whose median in the decision's timing was within RACE_MARGIN
    of the decided strategy's, fastest first; none for a split or a generation decision."""
    decided = decision.get("strategy")
    if decided not in settings.STRATEGIES:
        return []
    among = [s for s in settings.STRATEGIES if s in offered]
    return choose.close_to(decided, decision.get("medians_ms") or {}, settings.RACE_MARGIN, among)


def run(backend, prepared: Prepared, rivals: list, model, ctx, example_inputs, precision, threads) -> Prepared:
    """The cached decision's strategy timed again, in this process, against its `rivals` (each prepared from
    `model`, an unprepared copy of the one handed in, and `ctx`, with its own kept knobs and rows where it was
    a finalist): the fastest in quiet rounds is run when its lead is clear of noise, the decision's strategy
    otherwise. Fills `tuning["race"]`; the cached decision itself is left as it was."""
    import gc

    import torch

    from ..int8 import is_generation_step

    start, tuning = time.monotonic(), prepared.info["tuning"]
    decided = tuning["strategy"]
    checked = ctx.check is not None and not is_generation_step(model)
    race = tuning["race"] = {"margin": settings.RACE_MARGIN, "decision": decided, "refused": {}}
    runners = {decided: (prepared, choose.one_pass(prepared, ctx))}
    stages = tuning.get("finalists") or {}
    weights = held_bytes(model)
    for rival in rivals:
        engine = backend.engines.get(rival)
        short = choose.memory_short(weights * (2 + (engine.copies_held if engine else 0)))
        if short:
            race["refused"][rival] = short
            continue
        kept = stages.get(rival) or {}
        try:
            own = model if rival == rivals[-1] else backend._copy(rival, model, precision)   # the last takes it
            rival_ctx, found = ctx, None
            if (kept.get("rows") or {}).get("kept"):
                own, rival_ctx, found = rows.rewritten(own, example_inputs, ctx)
            p, one_pass, failed = backend._prepare_checked(
                rival, own, example_inputs, precision, threads,
                dataclasses.replace(rival_ctx, knobs=kept.get("knobs") or {}), checked)
        except UsageError:
            raise
        except Exception as exc:  # noqa: BLE001  (a rival that no longer runs is simply not raced)
            race["refused"][rival] = short_error(exc)
            continue
        if failed:
            race["refused"][rival] = f"outputs fail the output check: {failed}"
            continue
        p.info.update(strategy=rival, tuning=tuning)
        if found:
            p.info["rows"] = rows.note(found)
        runners[rival] = (p, one_pass)
    if len(runners) > 1:
        if prepared.compiles_on_first_call:       # compiled (and its first output checked) like its rivals
            with torch.no_grad():
                runners[decided][1]()
        with torch.no_grad():
            timed = ctx.time_passes(choose.journaled({name: r[1] for name, r in runners.items()}, ctx.model_name,
                                                precision), threads)
        # a rival replaces the decision (tuned with its knobs, in quiet rounds) only when clearly faster here:
        # a tie split finely would swap engines on noise (efficientnet_b0 fp32: 8.00 against 8.11 ms)
        fastest = min(timed.medians, key=timed.medians.get) if timed.medians else decided
        winner = fastest if timed.quiet and timed.clear else decided
        race.update(medians_ms=timed.medians, quiet=timed.quiet, clear=timed.clear, chosen=winner)
        if winner != decided:
            won = stages.get(winner) or {}
            tuning.update(strategy=winner, knobs=won.get("knobs") or {}, rows=won.get("rows") or {})
        prepared = runners[winner][0]
        prepared.info["strategy"] = winner
        prepared.compiles_on_first_call = False
        # every engine raced stays in: a race of a few seconds can be misled by a minute (mobilenet_v2 fp32:
        # ONNX Runtime 39% behind OpenVINO in one race, 11% ahead in the next process), and one that stays
        # behind is soon probed once in MAX_PROBE_EVERY passes
        close = {n: runners[n][0] for n in sorted(timed.medians, key=timed.medians.get) if n != winner}
        prepared = with_switching(prepared, winner, close, tuning, timed.medians if timed.quiet else None)
        logger.info("aio: raced %s again here: %s", ", ".join(runners),
                    ", ".join(f"{n} {m:.2f} ms" for n, m in timed.medians.items()))
    race["race_s"] = round(time.monotonic() - start, 1)
    del runners
    gc.collect()
    return prepared


def with_switching(prepared: Prepared, best: str, others: dict[str, Prepared], tuning: dict,
                   medians_ms: dict | None) -> Prepared:
    """`prepared` (the strategy `best`) switching at run time among `others` too (backends/switching.py), unless
    there are none or AIO_SWITCH is 0; `tuning["switch"]` gets the passes each engine ran. `medians_ms`: what
    quiet rounds just measured of each (None when they were not quiet)."""
    if not others or not settings.switch_setting():
        logger.info("aio: running %s", best)
        return prepared
    from ..switching import switching

    logger.info("aio: running %s, switching at run time to %s when faster", best, ", ".join(others))
    return switching({best: prepared, **others}, best, tuning.setdefault("switch", {}), medians_ms)
