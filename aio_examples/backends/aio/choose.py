"""Timing the strategies against each other: each prepared where memory allows (a crash journaled under its name,
backends/crashes.py), timed alike in interleaved rounds, the fastest kept, and the finalists close enough to it to
take their own knob and rows stages."""

import functools
import time
from collections.abc import Callable

from ...core.errors import UsageError, short_error
from ...core.log import logger
from .. import crashes
from ..base import Prepared
from ..llm_engines import EngineBackend
from . import decisions, settings

MEMORY_MARGIN = 1 << 30     # bytes left free when deciding whether another strategy fits


def memory_short(need: float) -> str | None:
    """Why a strategy is not tried for want of memory: it needs `need` more bytes (its own copy of the weights
    and the frozen, merged or repacked constants compiling makes, or an engine's own format). Tuning holds
    every strategy at once; a strategy left out is named in the decision, which is then not cached."""
    import psutil

    free = psutil.virtual_memory().available - MEMORY_MARGIN
    if need > free:
        return (f"not tried: about {need / 2**30:.1f} GiB more memory needed, "
                f"{max(free, 0) / 2**30:.1f} GiB free beyond a {MEMORY_MARGIN >> 30} GiB margin")
    return None


def prepare_all(backend, model, example_inputs, precision, threads, ctx, weights: int, checked: bool, quick: bool,
                started: float, progress) -> tuple[dict, dict, dict]:
    """Prepare every strategy that can run on `backend`'s engines, each on its own copy of the model (the last on
    the model handed in) and where memory allows, checked when `checked`: ({strategy: (prepared, pass)},
    {strategy refused: why}, {strategy whose outputs fail the check: (prepared, pass)}). A quick tuning prepares
    the cheapest first, no more once QUICK_BUDGET_S is spent and, at fp32, no compiled graph once a runtime is
    prepared (QUICK_LEFT_TO_RUNTIMES); without `ctx.time_passes`, the first that runs."""
    prepared, refused, wrong = {}, {}, {}
    strategies = settings.strategies_for(model, backend.engines)
    if quick and ctx.time_passes is not None:         # untuned, the first strategy runs: the compiled graph
        order = settings.QUICK_ORDER
        strategies = tuple(sorted(strategies, key=lambda s: order.index(s) if s in order else len(order)))
    progress.plan(len(strategies) + 1)           # each strategy, the timing (and the stages after, once known)
    for strategy in strategies:
        if prepared and ctx.time_passes is None:
            break
        progress.step(f"preparing {strategy}")
        if quick and prepared and time.monotonic() - started > settings.QUICK_BUDGET_S:
            refused[strategy] = (f"left out of the quick tuning's {settings.QUICK_BUDGET_S:.0f} s of preparing "
                                 "(--tune thorough tries it)")
            continue
        if quick and strategy in settings.QUICK_LEFT_TO_RUNTIMES.get(precision, ()) \
                and prepared.keys() & set(settings.QUICK_RUNTIMES):
            refused[strategy] = (f"left out of a quick {precision} tuning: the runtimes were faster at {precision} "
                                 "in every thorough tuning measured (--tune thorough tries it)")
            continue
        last, engine = strategy == strategies[-1], backend.engines.get(strategy)
        if isinstance(engine, EngineBackend):         # an LLM engine reads the model into its own format
            need = engine.memory_estimate(2 * weights, precision, True)
        elif engine is not None and strategy in settings.STRATEGIES:
            # a runtime: its own copy to export or convert (not the last), the exported graph while it is
            # written, and what its session holds (the Stable Diffusion UNet's 3.4 GB: about 14 GB at once)
            need = weights * ((not last) + 1 + engine.copies_held)
        else:       # its own copy (not the last, see below), and what compiling makes of it (not eager)
            need = weights * ((strategy != "eager") + (not last))
        short = crashes.known(strategy, ctx.model_name, precision) or memory_short(need)
        if short:
            refused[strategy] = short
            continue
        try:
            # The last strategy takes the model handed in (it is this backend's own copy): one copy fewer
            own = model if last else backend._copy(strategy, model, precision)
            p, one_pass, failed = backend._prepare_checked(strategy, own, example_inputs, precision, threads, ctx,
                                                           checked)
            if failed:                    # fast but wrong: chosen only when every strategy is
                refused[strategy] = f"outputs fail the output check: {failed}"
                wrong[strategy] = (p, one_pass)
                continue
            prepared[strategy] = (p, one_pass)
        except UsageError:
            raise
        except Exception as exc:  # noqa: BLE001  (a strategy that cannot take the model is simply not chosen)
            refused[strategy] = short_error(exc)
            logger.debug("aio strategy %s refused", strategy, exc_info=True)
    return prepared, refused, wrong


def choose(prepared: dict, refused: dict, time_passes, threads: int, decision_file, key: dict,
            save: bool = True) -> tuple[str, dict]:
    """Time the prepared strategies (time_passes: in rounds other processes left alone, until the winner is
    clear) and keep the fastest. Cached unless a strategy was not tried or the rounds were not quiet enough:
    then the choice is provisional, and a decision taken before for the same model, inputs, precision,
    threads and CPU (under other library versions, or on another machine of this CPU model sharing the
    cache) wins over timings a busy machine made."""
    import torch

    timed = None
    if len(prepared) > 1:
        with torch.no_grad():
            timed = time_passes(journaled({s: one_pass for s, (_, one_pass) in prepared.items()}, key.get("model", ""),
                                          key.get("precision", "")), threads)
    medians = timed.medians if timed else {}
    best = min(medians, key=medians.get) if medians else next(iter(prepared))
    decision = {"strategy": best, "mode": "quick" if key.get("tune") == "quick" else "thorough",
                **(timed.to_dict() if timed else {"medians_ms": {}}), "refused": refused}
    tuning = {**decision, "cached": False, "file": str(decision_file)}
    short = [s for s, why in refused.items() if why.startswith("not tried")]
    if short:
        tuning["not_saved"] = f"{', '.join(short)} not tried for want of memory; the next run tunes again"
    elif timed and not timed.quiet:
        prior = decisions.prior(decision_file, key, prepared)
        if prior:
            best, tuning["strategy"] = prior["strategy"], prior["strategy"]
            tuning["prior_decision"] = prior["file"]
        tuning["provisional"] = (
            f"other processes took our cores in too many rounds ({timed.busy_cores:.2f} cores on average, "
            f"rounds kept/dropped {timed.rounds}): "
            + (f"kept the decision taken before under {prior['why']}" if prior else "the fastest under contention")
            + "; the next run tunes again")
        tuning["not_saved"] = tuning["provisional"]
    elif save:                  # else the caller saves, once the knob stage has run
        decisions.save(decision_file, decision)
    if "not_saved" in tuning:
        logger.warning("aio tuning: %s", tuning["not_saved"])
    logger.info("aio tuning chose %s (%s)", best, why_chosen(medians, refused))
    return best, tuning


def why_chosen(medians: dict, refused: dict) -> str:
    """The timings a choice was made on, or that it was the only strategy left and why the others were."""
    if medians:
        return ", ".join(f"{s} {v:.2f} ms" for s, v in medians.items())
    return "the only strategy prepared" + "".join(f"; {s}: {why}" for s, why in refused.items())


_STAGE_FIELDS = ("knobs", "knob_trials", "knob_tuning_s", "rows")


def finalists(best: str, medians: dict) -> list[str]:
    """The fastest strategy, then the others whose median was within FINALIST_MARGIN of it: two engines that
    close swap places between runs, and the knobs of the one behind may put it ahead (ONNX Runtime chosen by
    3% over OpenVINO on vit_b_16 int8, where OpenVINO's int8_mixed_bf16 gains 3-6%)."""
    return [best, *close_to(best, medians, settings.FINALIST_MARGIN)]


def close_to(best: str, medians: dict, margin: float, among=None) -> list[str]:
    """The strategies of `among` (default: STRATEGIES) other than `best` whose median was within `margin` of
    best's, fastest first (none when best has no median)."""
    if best not in medians:
        return []
    among = settings.STRATEGIES if among is None else among
    close = sorted((m, s) for s, m in medians.items()
                   if s != best and s in among and m <= medians[best] * (1 + margin))
    return [s for _, s in close]


def final(tuned: dict, best: str, time_passes, threads: int, tuning: dict) -> str:
    """Time the finalists, each with its kept knobs and rows, against each other and return the fastest (`best`
    unless the rounds were quiet). Fills `tuning["finalists"]`; the winner's stage fields are the decision's."""
    import torch

    with torch.no_grad():
        timed = time_passes({name: t[0][1] for name, t in tuned.items()}, threads)
    winner = min(timed.medians, key=timed.medians.get) if timed.quiet and timed.medians else best
    final = tuning["finalists"] = {"margin": settings.FINALIST_MARGIN, "medians_ms": timed.medians,
                                   "clear": timed.clear, "quiet": timed.quiet, "chosen": winner}
    if not timed.quiet:
        tuning.setdefault("not_saved", "the rounds timing the finalists were not quiet; the next run tunes again")
    for name, (_, _, _, stages) in tuned.items():
        if name != best:            # (the best's stage fields are the decision's own, at the top level)
            if "not_saved" in stages:
                tuning.setdefault("not_saved", stages["not_saved"])
            final[name] = {k: v for k, v in stages.items() if k in _STAGE_FIELDS}
    if winner != best:
        final[best] = {k: tuning.pop(k) for k in _STAGE_FIELDS if k in tuning}
        tuning.update(final.pop(winner), strategy=winner)
    logger.info("aio tuning: finalists %s; kept %s", ", ".join(f"{n} {m:.2f} ms" for n, m in timed.medians.items()),
                winner)
    return winner


def journaled(passes: dict, model_name: str, precision: str) -> dict:
    """The strategies' passes, each writing down that it runs when the rounds turn to it (backends/crashes.py)."""
    def noted(name, one_pass):
        def run():
            if journaled.last != name:
                journaled.last = name
                crashes.trying(name, "timing", model_name, precision)
            return one_pass()
        return run
    journaled.last = None
    return {name: noted(name, p) for name, p in passes.items()}


def call(p: Prepared):
    return p.fn(*p.inputs)


def one_pass(p: Prepared, ctx) -> Callable[[], object]:
    """The zero-argument pass the runner will time for `p` (ctx.make_pass), else one call on its inputs."""
    return ctx.make_pass(p) if ctx.make_pass else functools.partial(call, p)

