"""The optimized backend: the fastest of several strategies on this machine, chosen by a short tuning run.

Strategies: `compiled` (torch.compile with the `aio` graph passes, see aio_examples/aio_compile),
and executing through ONNX Runtime or OpenVINO. The first run for a (model, shapes, precision,
threads, CPU, library versions) prepares every strategy that can run, times them in interleaved
rounds and caches the decision on disk; later runs prepare the winner, and race the engines that came
close to it again in their own process. Either way, the engines close to the one run stay prepared and each
pass runs whichever is fastest at that moment (backends/switching.py), in memory moved to huge pages once
tuning is over (backends/hugepages.py). Precisions: fp32 and bf16 end to end;
fp16 and int8 through the implicit modes of the compiled graph (reduced-precision or int8 kernels for the ops
the `AIO_*` filters select) or the runtimes' own fp16/int8.
"""

import copy
import dataclasses
import functools
import json
import os
import platform
import sys
import time
from collections.abc import Callable

from ...core.errors import UnsupportedError, UsageError, short_error
from ...core.log import logger
from .. import crashes
from ..base import Backend, Prepared, held_bytes, onnx_source
from ..llm_engines import EngineBackend

STRATEGIES = ("compiled", "onnxruntime", "openvino")
# A generation step runs on neither runtime (they cannot step a mutable KV cache); beside its own compiled
# path, aio weighs inductor's, which lowers torchao's weight-only int8 to its packed kernel where aio's
# constant folding does not, and eager's: torchao's int4 CPU kernel decoded a 4-layer Llama 3.2 1B faster
# uncompiled (99.5 against inductor's 76.7 tokens/s here).
# The LLM engines run their own loops over their own formats of the same weights (llama.cpp's Q4_0 is not
# torchao's int4: the record's precision_mode says which ran). They go first: their weights take the least
# memory (a GGUF file another configuration maps is shared), and a strategy that no longer fits is not
# tried. Eager last: it takes the model handed in.
GENERATION_STRATEGIES = ("llama_cpp", "onnxruntime_genai", "openvino_genai", "compiled", "inductor", "eager")


def strategies_for(model, engines: dict | None = None) -> tuple:
    """The strategies this model may run on; an engine strategy only where its engine was handed in and is
    installed (an LLM engine not built here is no strategy, and the tuning key says so)."""
    from ..int8 import is_generation_step

    names = GENERATION_STRATEGIES if is_generation_step(model) else STRATEGIES
    if onnx_source(model) is not None:      # a graph for the runtimes only
        names = tuple(s for s in names if s in ("onnxruntime", "openvino"))
    if engines is None:
        return names
    return tuple(s for s in names if s == "compiled" or (s in engines and engines[s].unavailable_reason() is None))


MEMORY_MARGIN = 1 << 30     # bytes left free when deciding whether another strategy fits

# Settings tried on the chosen strategy beyond its defaults, one at a time, each on a preparation of its own
# timed against the settings kept so far (interleaved, in quiet rounds): kept only when faster beyond noise,
# so one that does not help on this machine and model costs tuning time and nothing else. A backend honours
# those it knows (PrepareContext.knobs); what each did is in backend_info.tuning.knobs.
KNOBS = {
    # inductor: kernels called from generated C++ rather than Python (per-pass overhead of small graphs);
    # GEMMs from autotuned C++ templates (AMX/AVX-512 microkernels); a conv net in its default layout
    "compiled": (("cpp_wrapper", True), ("max_autotune", True), ("channels_last", False)),
    # ONNX Runtime: idle intra-op threads sleep instead of spinning; no NCHWc layout transformation; parallel
    # loops handed out in shrinking blocks (ORT's suggested 4), which evens out the threads' shares; inputs
    # bound once through an IOBinding rather than fed anew on every pass
    "onnxruntime": (("allow_spinning", False), ("graph_optimization", "extended"), ("dynamic_block_base", 4),
                    ("io_binding", True)),
    # OpenVINO: threads not pinned to cores; denormals flushed to zero; at int8, what NNCF left in floating
    # point run bf16 where the CPU has it (the output check at int8's tolerance still decides); inputs bound
    # to the infer request once (zero copy) rather than wrapped on every pass, which small models notice
    "openvino": (("cpu_pinning", False), ("denormals_optimization", True), ("int8_mixed_bf16", True),
                 ("io_binding", True)),
}
# Engines taking turns in one pass must not keep spinning on the cores the next one needs: ONNX Runtime's idle
# intra-op threads spin by default (they then held both cores while OpenVINO ran the next segment, and a split
# of four engine-wise faster segments ran 1.9x slower than one engine). Applied to every segment they run.
SPLIT_KNOBS = {"onnxruntime": {"allow_spinning": False}}
KNOB_BUDGET_S = 180.0       # seconds of knob trials (preparing and timing) before the rest are left untried
KNOB_MIN_GAIN = 0.01        # a knob is kept when it is this much faster, beyond noise: not for a tie split finely


def _switch(name: str, what: str, off: str = "") -> bool:
    """An on/off variable: 1 (the default, `what`) or 0 (`off`, where said)."""
    on = os.environ.get(name, "1").strip()
    if on not in ("0", "1"):
        raise UsageError(f"{name}={on!r} is invalid; accepted: 1 ({what}, the default) or 0"
                         + (f" ({off})" if off else ""))
    return on == "1"


def _stage_settings(switch: str, budget_var: str, default_budget: float, what: str) -> tuple[bool, float]:
    """A tuning stage's on/off variable (1, the default, or 0) and its budget variable (seconds >= 0)."""
    on = _switch(switch, what)
    raw = os.environ.get(budget_var, str(default_budget)).strip()
    try:
        budget = float(raw)
    except ValueError:
        budget = -1.0
    if not budget >= 0:
        raise UsageError(f"{budget_var}={raw!r} is invalid; accepted: seconds, a number >= 0")
    return on, budget


def knob_settings() -> tuple[bool, float]:
    """`AIO_TUNE_KNOBS` (1, the default: try KNOBS on the chosen strategy; 0: its defaults only) and
    `AIO_KNOB_BUDGET_S` (seconds, default 180)."""
    return _stage_settings("AIO_TUNE_KNOBS", "AIO_KNOB_BUDGET_S", KNOB_BUDGET_S, "try the knobs")


SPLIT_BUDGET_S = 240.0      # seconds of the split stage (preparing each segment on each engine, timing)


def split_settings() -> tuple[bool, float]:
    """`AIO_TUNE_SPLIT` (1, the default: try running each segment of the graph on the engine fastest on it;
    0: whole models only) and `AIO_SPLIT_BUDGET_S` (seconds, default 240)."""
    return _stage_settings("AIO_TUNE_SPLIT", "AIO_SPLIT_BUDGET_S", SPLIT_BUDGET_S, "try splitting")


def rows_setting() -> bool:
    """`AIO_TUNE_ROWS` (1, the default: try the model computing only the rows its output reads; 0: as built)."""
    return _switch("AIO_TUNE_ROWS", "try computing only the rows read")


def huge_pages_setting() -> bool:
    """`AIO_HUGE_PAGES` (1, the default: back the memory aio's engines allocate with huge pages,
    backends/hugepages.py; 0: leave it in the pages it was given)."""
    return _switch("AIO_HUGE_PAGES", "back what aio prepares with huge pages", "leave its pages as allocated")


TUNE_MODES = ("quick", "thorough")
# Seconds a quick tuning spends preparing strategies: the first answer of a fresh machine comes in about a minute
# and a half (the model built, this tuning, the measurement). A strategy not started by then is left for
# `--tune thorough`; the engines that are cheapest to prepare and most often fastest go first.
QUICK_BUDGET_S = 30.0
QUICK_ORDER = ("openvino", "onnxruntime", "compiled")
# The knob a quick tuning tries on the strategy it chose, within its own budget: inputs bound once instead of fed
# on every pass, which small models notice (kept for mobilenet_v2 and efficientnet_b0 by thorough tunings here)
QUICK_KNOBS = ("io_binding",)
QUICK_KNOB_BUDGET_S = 20.0


def tune_setting() -> str:
    """`AIO_TUNE` (`--tune`): quick (the default: the strategies that fit QUICK_BUDGET_S, whole models with the
    QUICK_KNOBS tried on the choice, and the rows stage while the budget lasts; cached, and replaced by a thorough
    decision once one exists) or thorough (every strategy, then the knob, rows and split stages)."""
    mode = os.environ.get("AIO_TUNE", "quick").strip()
    if mode not in TUNE_MODES:
        raise UsageError(f"AIO_TUNE={mode!r} is invalid; accepted: {' or '.join(TUNE_MODES)} (--tune)")
    return mode


def process_mode() -> bool:
    """`AIO_PROCESS_MODE`: 1 (default) runs the optimized backend, 0 falls back to eager."""
    return _switch("AIO_PROCESS_MODE", "run the optimized backend", "fall back to eager")


class AioBackend(Backend):
    name = "aio"
    description = ("optimized: the fastest of aio-compiled / ONNX Runtime / OpenVINO here (generation: of its "
                   "compiled path, inductor, eager and the LLM engines), tuned and cached")
    copies_held = 2.0

    def __init__(self, engines: dict[str, Backend] | None = None):
        """`engines`: the backends the strategies run on ("onnxruntime", "openvino", and "inductor" for int8
        conv nets), built by the registry and handed in so this module does not import it."""
        self.engines = dict(engines or {})

    @property
    def fpmath_modes(self):
        """fp32's fast-math modes of its compiled graph (torch's) and of the engines it tunes among."""
        from ...machine.fpmath import TORCH_MODES

        modes = [*TORCH_MODES, *(m for e in self.engines.values() if e.unavailable_reason() is None
                                 for m in e.fpmath_modes)]
        return tuple(dict.fromkeys(modes))

    def prepare(self, model, example_inputs, precision, threads, ctx):
        """What the strategy chosen (and the engines switched among) allocated, compiled on its first call
        where it compiles then, backed by huge pages (backends/hugepages.py) once tuning is over: the
        strategies are timed against each other alike, in the pages they were given."""
        import torch

        from .. import hugepages

        backed: dict = {}
        with hugepages.backing(backed, huge_pages_setting()):
            prepared = self._prepare(model, example_inputs, precision, threads, ctx)
            if prepared.compiles_on_first_call:
                with torch.no_grad():        # compiling makes the graph's constants: backed too
                    _one_pass(prepared, ctx)()
                prepared.compiles_on_first_call = False
        crashes.done()               # tuning is over: a crash from here on is no candidate's
        prepared.info.update(backed)
        return prepared

    def _prepare(self, model, example_inputs, precision, threads, ctx):
        from ...machine.environment import capture
        from ..artifacts import describe_inputs

        env = capture({})
        knobs_on, _ = knob_settings()
        key = {"inputs": describe_inputs(example_inputs), "precision": precision, "threads": threads,
               "cpu": f"{env.get('cpu_model')}|{platform.machine()}|{','.join(env.get('isa') or [])}",
               "versions": env["versions"], "strategies": list(strategies_for(model, self.engines)),
               "output_checked": ctx.check is not None,      # decisions taken without the check are not reused
               # the knobs on offer: a decision taken before a knob was added tunes again
               "knobs_tuned": knobs_on and {s: [n for n, _ in k] for s, k in KNOBS.items()},
               "split_tuned": split_settings()[0], "rows_tuned": rows_setting(), "finalist_margin": FINALIST_MARGIN}
        if ctx.fpmath != "strict":           # fast math is a configuration of its own (strict keeps the keys it had)
            key["fpmath"] = ctx.fpmath
        decision_file = _decision_file(ctx.model_name, key)
        quick = tune_setting() == "quick"
        cached = _load_decision(decision_file)       # a thorough decision serves either mode
        if quick and cached is None:
            key = {**key, "tune": "quick"}
            decision_file = _decision_file(ctx.model_name, key)
            cached = _load_decision(decision_file)
        offered, original = strategies_for(model, self.engines), (model, ctx)
        rivals = _rivals(cached or {}, offered) if race_setting() and ctx.time_passes is not None else []
        crashed = functools.partial(crashes.known, model=ctx.model_name, precision=precision)
        if cached and crashed(cached["strategy"]):
            logger.info("aio: cached strategy %s %s; tuning again", cached["strategy"], crashed(cached["strategy"]))
            cached, rivals = None, []
        rivals = [r for r in rivals if not crashed(r)]
        if cached and (cached["strategy"] in offered
                       or cached["strategy"] == "split" and set(cached["split"]["plan"]) <= set(offered)):
            short = rivals and _memory_short(2 * held_bytes(model))
            if short:
                logger.info("aio: close engines %s not raced again: %s", ", ".join(rivals), short)
                rivals = []
            if rivals:   # preparing a strategy may change the model in place (cast, layout): rivals take a copy
                original = (copy.deepcopy(model), ctx)
            try:
                rows = (cached.get("rows") or {}).get("kept")
                if rows:
                    model, ctx, found = _rows_model(model, example_inputs, ctx)
                if cached["strategy"] == "split":
                    prepared = self._prepare_split(model, example_inputs, precision, threads, ctx, cached)
                else:
                    prepared = self._prepare_strategy(cached["strategy"], model, example_inputs, precision, threads,
                                                      dataclasses.replace(ctx, knobs=cached.get("knobs") or {}))
            except UnsupportedError:
                logger.info("cached strategy %s no longer runs; tuning again", cached["strategy"])
            else:
                prepared.info.update({"strategy": cached["strategy"],
                                      "tuning": {**cached, "cached": True, "file": str(decision_file)}})
                if rows:
                    prepared.info["rows"] = _rows_note(found)
                return self._race(prepared, rivals, *original, example_inputs, precision, threads) if rivals \
                    else prepared
        model, ctx = original           # not the rows rewrite (tuning tries it on its own), a copy if one was made
        with _Progress(ctx.model_name, precision) as progress:
            return self._tune(model, example_inputs, precision, threads, ctx, decision_file,
                              {"model": ctx.model_name, **key}, progress)

    def _tune(self, model, example_inputs, precision, threads, ctx, decision_file, key, progress) -> Prepared:
        """Prepare every strategy that can run, time them alike (with `ctx.time_passes`), keep the fastest. A
        quick tuning (key["tune"]) prepares the strategies that fit its budget, cheapest first, tries only the
        QUICK_KNOBS on its choice, and skips the split stage.

        Without `ctx.time_passes` (prepare called outside the runner) the first strategy that runs is taken,
        untuned, and nothing is cached."""
        from ..int8 import is_generation_step

        started = time.monotonic()
        quick = key.get("tune") == "quick"
        prepared, refused, wrong = {}, {}, {}
        strategies = strategies_for(model, self.engines)
        if quick and ctx.time_passes is not None:         # untuned, the first strategy runs: the compiled graph
            strategies = tuple(sorted(strategies, key=lambda s: QUICK_ORDER.index(s) if s in QUICK_ORDER else -1))
        weights = held_bytes(model)
        # a generation's output check needs its own teacher-forced steps: its strategies are not checked here
        checked = ctx.check is not None and not is_generation_step(model)
        progress.plan(len(strategies) + 1)           # each strategy, the timing (and the stages after, once known)
        for strategy in strategies:
            if prepared and ctx.time_passes is None:
                break
            progress.step(f"preparing {strategy}")
            if quick and prepared and time.monotonic() - started > QUICK_BUDGET_S:
                refused[strategy] = (f"left out of the quick tuning's {QUICK_BUDGET_S:.0f} s of preparing "
                                     "(--tune thorough tries it)")
                continue
            last, engine = strategy == strategies[-1], self.engines.get(strategy)
            if isinstance(engine, EngineBackend):         # an LLM engine reads the model into its own format
                need = engine.memory_estimate(2 * weights, precision, True)
            elif engine is not None and strategy in STRATEGIES:
                # a runtime: its own copy to export or convert (not the last), the exported graph while it is
                # written, and what its session holds (the Stable Diffusion UNet's 3.4 GB: about 14 GB at once)
                need = weights * ((not last) + 1 + engine.copies_held)
            else:       # its own copy (not the last, see below), and what compiling makes of it (not eager)
                need = weights * ((strategy != "eager") + (not last))
            short = crashes.known(strategy, ctx.model_name, precision) or _memory_short(need)
            if short:
                refused[strategy] = short
                continue
            try:
                # The last strategy takes the model handed in (it is this backend's own copy): one copy fewer
                own = model if last else self._copy(strategy, model, precision)
                p, one_pass, failed = self._prepare_checked(strategy, own, example_inputs, precision, threads, ctx,
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
        all_wrong = not prepared and bool(wrong)
        if all_wrong:                 # its record then fails the check, as the strategy's own backend would
            prepared = wrong
        if not prepared:
            raise UnsupportedError("no aio strategy runs this model at " + precision + ": "
                                   + "; ".join(f"{k}: {v}" for k, v in refused.items()))
        knobs = splits = rows = False
        switch_to, switch_medians = {}, None         # the engines switched among at run time, beside the best
        if ctx.time_passes is None:
            best = next(iter(prepared))
            tuning = {"not_tuned": "no timing function handed in", "refused": refused}
            logger.warning("aio: no timing function handed in (PrepareContext.time_passes): running %s untuned", best)
        else:
            knobs = key.get("knobs_tuned") and best_has_knobs(prepared, model)
            splits = not quick and key.get("split_tuned") and may_split(prepared, model)
            rows = (key.get("rows_tuned") and not is_generation_step(model) and onnx_source(model) is None
                    and not (quick and time.monotonic() - started > QUICK_BUDGET_S))
            progress.step("timing " + ", ".join(prepared))
            best, tuning = _choose(prepared, refused, ctx.time_passes, threads, decision_file, key,
                                   save=not (knobs or splits or rows))
            later = [name for name, on in (("knobs", knobs), ("rows", rows), ("split", splits)) if on]
            progress.step(f"the {', '.join(later)} stage{'s' * (len(later) > 1)}" if later else "done", more=bool(later))
        engines = [s for s in prepared if s in STRATEGIES]
        if all_wrong:
            tuning["output_check"] = "every strategy that ran failed the output check: the fastest was kept"
        chosen = prepared[best]
        if ctx.time_passes is not None and (knobs or rows) and not all_wrong and "provisional" not in tuning:
            # the strategies not chosen free their memory for the trials, but for those close enough to win
            # once their own knobs are in (the finalists)
            finalists = [(f, prepared[f]) for f in _finalists(best, tuning.get("medians_ms") or {})]
            prepared = wrong = None
            tuned = {}
            for name, c in finalists:
                stages, m, cx = tuning if name == best else {}, model, ctx
                if knobs and name in KNOBS and (not quick or name == best):
                    c = self._tune_knobs(name, c, m, weights, example_inputs, precision, threads, cx, checked, stages,
                                         quick)
                if rows and name in STRATEGIES:
                    m, cx, c = self._tune_rows(name, c, m, weights, example_inputs, precision, threads, cx, checked,
                                               stages)
                tuned[name] = (c, m, cx, stages)
            if len(tuned) > 1:
                best = _final(tuned, best, ctx.time_passes, threads, tuning)
            chosen, model, ctx, _ = tuned[best]
            switch_to = {n: t[0][0] for n, t in tuned.items() if n != best and n in STRATEGIES}
            final = tuning.get("finalists") or {}
            switch_medians = final.get("medians_ms") if final.get("quiet") else None
            del tuned, finalists
        elif ctx.time_passes is not None and not all_wrong and not is_generation_step(model):
            # the finalists, close enough to trade the lead (every engine when the rounds were busy: their order
            # then says little), stay prepared, and the run switches among them (backends/switching.py)
            provisional = "provisional" in tuning
            close = [s for s in prepared if s in STRATEGIES and s != best] if provisional else \
                _finalists(best, tuning.get("medians_ms") or {})[1:]
            switch_to = {n: prepared[n][0] for n in close}
            switch_medians = None if provisional else tuning.get("medians_ms")
        if ctx.time_passes is not None and splits and not all_wrong and "provisional" not in tuning:
            prepared = wrong = None
            if switch_to and _memory_short(_split_need(weights, engines)):
                switch_to = {}          # the split, whose decision is cached, needs the memory more
            best, chosen = self._tune_split(best, chosen, engines, model, weights, example_inputs, precision,
                                            threads, ctx, checked, tuning)
        tuning["tuning_s"] = round(time.monotonic() - started, 1)     # preparing and timing it all, knobs too
        if (knobs or splits or rows) and "not_saved" not in tuning:   # _choose left the saving to after these stages
            _save_decision(decision_file, {k: v for k, v in tuning.items() if k not in ("cached", "file")})
        chosen = chosen[0]
        chosen.info.update({"strategy": best, "tuning": tuning})
        chosen.compiles_on_first_call = False     # already compiled above
        if best not in STRATEGIES:
            switch_to = {}                # a split
        return _with_switching(chosen, best, switch_to, tuning, switch_medians) if switch_to else chosen

    def _race(self, prepared: Prepared, rivals: list, model, ctx, example_inputs, precision, threads) -> Prepared:
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
        race = tuning["race"] = {"margin": RACE_MARGIN, "decision": decided, "refused": {}}
        runners = {decided: (prepared, _one_pass(prepared, ctx))}
        stages = tuning.get("finalists") or {}
        weights = held_bytes(model)
        for rival in rivals:
            engine = self.engines.get(rival)
            short = _memory_short(weights * (2 + (engine.copies_held if engine else 0)))
            if short:
                race["refused"][rival] = short
                continue
            kept = stages.get(rival) or {}
            try:
                own = model if rival == rivals[-1] else self._copy(rival, model, precision)   # the last takes it
                rival_ctx, found = ctx, None
                if (kept.get("rows") or {}).get("kept"):
                    own, rival_ctx, found = _rows_model(own, example_inputs, ctx)
                p, one_pass, failed = self._prepare_checked(
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
                p.info["rows"] = _rows_note(found)
            runners[rival] = (p, one_pass)
        if len(runners) > 1:
            if prepared.compiles_on_first_call:       # compiled (and its first output checked) like its rivals
                with torch.no_grad():
                    runners[decided][1]()
            with torch.no_grad():
                timed = ctx.time_passes(_journaled({name: r[1] for name, r in runners.items()}, ctx.model_name,
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
            prepared = _with_switching(prepared, winner, close, tuning, timed.medians if timed.quiet else None)
            logger.info("aio: raced %s again here: %s", ", ".join(runners),
                        ", ".join(f"{n} {m:.2f} ms" for n, m in timed.medians.items()))
        race["race_s"] = round(time.monotonic() - start, 1)
        del runners
        gc.collect()
        return prepared

    def _copy(self, strategy, model, precision):
        """A strategy's own copy of the model handed in (a runtime's working copy, else a deep copy)."""
        engine = self.engines.get(strategy)
        return engine.working_copy(model, precision) if engine else copy.deepcopy(model)

    def _prepare_checked(self, strategy, own, example_inputs, precision, threads, ctx, checked: bool):
        """(prepared, its pass, why its first output fails the output check or None): compiled by a first pass
        where it compiles on its first call, checked when `checked`."""
        import torch

        p = self._prepare_strategy(strategy, own, example_inputs, precision, threads, ctx)
        one_pass = _one_pass(p, ctx)
        if p.compiles_on_first_call or checked:
            with torch.no_grad():
                output = one_pass()
        return p, one_pass, (ctx.check(output, precision) if checked else None)

    def _tune_knobs(self, strategy, chosen: tuple, model, weights: int, example_inputs, precision, threads, ctx,
                    checked: bool, tuning: dict, quick: bool = False) -> tuple:
        """Try each of the strategy's KNOBS (a quick tuning: its QUICK_KNOBS, within QUICK_KNOB_BUDGET_S) on a
        preparation of its own, timed against the settings kept so far: keep it when it wins beyond noise in quiet
        rounds. Returns the (prepared, pass) kept; fills `tuning["knobs"]` (the settings kept) and
        `tuning["knob_trials"]` (each knob: what was timed, or why not), and marks the decision not to be saved
        when a trial's rounds were not quiet."""
        import gc

        import torch

        budget = QUICK_KNOB_BUDGET_S if quick else knob_settings()[1]
        offered = [(n, v) for n, v in KNOBS[strategy] if not quick or n in QUICK_KNOBS]
        kept, trials, start = {}, {}, time.monotonic()
        compiled_reasons = (_compiled_knob_reasons([n for n, _ in offered], model, example_inputs, precision)
                            if strategy == "compiled" else {})
        for name, value in offered:
            trial = trials[name] = {"value": value}
            reason = (compiled_reasons[name] if strategy == "compiled"
                      else self.engines[strategy].knob_reason(name, precision))
            if reason:                # known before a copy of the model is made for its trial
                trial["not_tried"] = reason
                continue
            spent = time.monotonic() - start
            short = _memory_short(weights * 2)
            if spent > budget or short:
                trial["not_tried"] = short or f"the knob budget ({budget:.0f} s, AIO_KNOB_BUDGET_S) was spent"
                continue
            try:
                p, one_pass, failed = self._prepare_checked(
                    strategy, self._copy(strategy, model, precision), example_inputs, precision, threads,
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
                wins = _trial(chosen[1], name, one_pass, ctx.time_passes, threads, trial, tuning, ("without", "with"),
                              f"knob {name}")
            if wins:
                wins = trial["kept"] = self._confirm(strategy, model, weights, example_inputs, precision, threads,
                                                     ctx, kept, name, one_pass, trial, tuning)
            if wins:
                kept[name], chosen = value, (p, one_pass)
            del p, one_pass
            gc.collect()
        tuning.update(knobs=kept, knob_trials=trials, knob_tuning_s=round(time.monotonic() - start, 1))
        return chosen

    def _confirm(self, strategy, model, weights: int, example_inputs, precision, threads, ctx, kept: dict, name,
                 one_pass, trial: dict, tuning: dict, clear_needed: bool = True) -> bool:
        """Time a knob that won again, against a fresh instance of the settings kept so far (`trial["again"]`).

        Two instances of one engine with the same settings differ by a few percent: in one process, knobs that
        change nothing measurable "won" or "lost" by up to 2.7%. So a first win may be the kept instance's bad
        luck rather than the knob's; it is kept only if it wins against a second instance too."""
        import torch

        again = trial["again"] = {}
        short = _memory_short(weights)
        if short:
            again["not_tried"] = short
            return True
        try:
            control, control_pass, _ = self._prepare_checked(
                strategy, self._copy(strategy, model, precision), example_inputs, precision, threads,
                dataclasses.replace(ctx, knobs=dict(kept)), False)
        except Exception as exc:  # noqa: BLE001  (it ran before: the first trial's verdict stands)
            again["not_tried"] = short_error(exc)
            return True
        with torch.no_grad():
            wins = _trial(control_pass, name, one_pass, ctx.time_passes, threads, again, tuning, ("without", "with"),
                          f"{name} against a fresh instance", clear_needed)
        del control, control_pass
        return wins

    def _tune_rows(self, strategy, chosen: tuple, model, weights: int, example_inputs, precision, threads, ctx,
                   checked: bool, tuning: dict) -> tuple:
        """Try the model rewritten to compute only the rows its output reads (aio_compile/rows.py) on the chosen
        strategy with the knobs kept, timed against the choice so far and kept like a knob (a win confirmed
        against a fresh instance). Returns (model, ctx, (prepared, pass)) for what follows: the rewritten
        ones when kept. Fills `tuning["rows"]`."""
        import torch

        start = time.monotonic()
        trial = tuning["rows"] = {}
        short = _memory_short(weights * 2)
        if short:
            trial["not_tried"] = short
            return model, ctx, chosen
        try:
            rows_model, rows_ctx, found = _rows_model(model, example_inputs, ctx)
        except UnsupportedError as exc:
            del tuning["rows"]                  # nothing to try: not worth a line in every record
            logger.debug("aio rows stage: %s", exc)
            return model, ctx, chosen
        trial.update(ops_narrowed=found.narrowed, flops_saved=round(found.flops_saved, 4),
                     rule="kept when its median is at least 1% faster in two trials: the same computation in fewer "
                          "FLOPs needs no interval clear of the other's")
        kept = tuning.get("knobs") or {}
        try:
            p, one_pass, failed = self._prepare_checked(strategy, rows_model, example_inputs, precision, threads,
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
            wins = _trial(chosen[1], "rows", one_pass, ctx.time_passes, threads, trial, tuning,
                          ("all rows", "rows read"), "the rows read alone", clear_needed=False)
        if wins:
            wins = trial["kept"] = self._confirm(strategy, model, weights, example_inputs, precision, threads, ctx,
                                                 kept, "rows", one_pass, trial, tuning, clear_needed=False)
        trial["rows_tuning_s"] = round(time.monotonic() - start, 1)
        if not wins:
            return model, ctx, chosen
        p.info["rows"] = _rows_note(found)
        return rows_model, rows_ctx, (p, one_pass)

    def _tune_split(self, best, chosen: tuple, engines: list, model, weights: int, example_inputs, precision,
                    threads, ctx, checked: bool, tuning: dict) -> tuple:
        """Cut the graph into segments (backends/split.py), time each segment on each engine that ran the whole
        model, and unless the engine chosen for the whole model wins every segment, time the split (each segment
        on its fastest engine) against the choice so far:
        kept only when faster beyond noise, in quiet rounds, like a knob. Returns (strategy, (prepared, pass))
        and fills `tuning["split"]`."""
        import torch

        from .. import split

        start, budget = time.monotonic(), split_settings()[1]
        trial = tuning["split"] = {}
        short = _memory_short(_split_need(weights, engines))
        if short:
            trial["not_tried"] = short
            return best, chosen
        try:
            graph, segments, per = self._segments(model, example_inputs, precision, ctx)
        except UnsupportedError as exc:
            trial["not_tried"] = str(exc)
            return best, chosen
        knobs = {best: tuning.get("knobs") or {}}
        trial.update(segments=len(segments), cut_after=graph.cut_names(), segment_ms=[], refused={})
        stages = []
        for i, seg in enumerate(segments):
            ready = {}
            for engine in engines:
                if time.monotonic() - start > budget:
                    trial["not_tried"] = f"the split budget ({budget:.0f} s, AIO_SPLIT_BUDGET_S) was spent"
                    return best, chosen
                try:
                    ready[engine] = self._prepare_segment(engine, seg, i, per[i], precision, threads, ctx,
                                                          knobs.get(engine, {}))
                except UsageError:
                    raise
                except Exception as exc:  # noqa: BLE001  (an engine that cannot take a segment is not used there)
                    trial["refused"][f"{i}:{engine}"] = short_error(exc)
            if not ready:
                trial["not_tried"] = f"no engine runs segment {i}"
                return best, chosen
            with torch.no_grad():
                timed = ctx.time_passes({e: functools.partial(_call, p) for e, p in ready.items()}, threads)
            trial["segment_ms"].append(timed.medians)
            if not timed.quiet:
                tuning.setdefault("not_saved", f"the rounds timing segment {i} were not quiet; the next run tunes again")
            stages.append(split.Stage(seg, ready[min(timed.medians, key=timed.medians.get)]))
        plan = trial["plan"] = [s.prepared.info["engine"] for s in stages]
        if set(plan) == {best}:         # else a split may win even on one engine: its graph cut differently
            trial.update(kept=False, why=f"{best}, the whole model's choice, is the fastest on every segment")
            trial["split_tuning_s"] = round(time.monotonic() - start, 1)
            return best, chosen
        p = _split_prepared(graph, stages, example_inputs, trial)
        one_pass = _one_pass(p, ctx)
        with torch.no_grad():
            failed = ctx.check(one_pass(), precision) if checked else None
            if failed:
                trial.update(kept=False, why=f"outputs fail the output check: {failed}")
                return best, chosen
            wins = _trial(chosen[1], "split", one_pass, ctx.time_passes, threads, trial, tuning, ("whole", "split"),
                          "the split")
        trial["split_tuning_s"] = round(time.monotonic() - start, 1)
        if not wins:
            return best, chosen
        tuning.update(strategy="split", whole_strategy=best)
        return "split", (p, one_pass)

    def _segments(self, model, example_inputs, precision, ctx):
        """(graph, its segments, each segment's inputs: the example's first, then int8 calibration's)."""
        from .. import split
        from ..int8 import is_conv_net

        graph = split.export_graph(copy.deepcopy(model), example_inputs)
        segments = graph.segments()
        # a segment takes the model's int8 scheme (static for conv nets): its graph of ATen calls has no Conv2d
        # module for the engines to count, and would otherwise take dynamic int8, which leaves convolutions fp32
        conv_net = precision == "int8" and is_conv_net(model, example_inputs)
        for seg in segments:
            seg.conv_net = conv_net
        calibration = ctx.calibration_inputs(example_inputs) if precision == "int8" else []
        return graph, segments, split.segment_inputs(graph, segments, [example_inputs, *calibration])

    def _prepare_segment(self, engine, segment, index: int, inputs: list, precision, threads, ctx, knobs: dict):
        """One segment prepared (and compiled) on one engine, as a model of its own: its own name in the caches
        and int8 calibration on what reaches it."""
        import torch

        seg_ctx = dataclasses.replace(
            ctx, model_name=f"{ctx.model_name}.segment{index}", weights_id=f"{ctx.weights_id}-{segment.digest}",
            calibration=lambda n: (inputs[1:] or inputs[:1]) * n, knobs={**knobs, **SPLIT_KNOBS.get(engine, {})},
            check=None, time_passes=None,
            make_pass=None)
        own = copy.deepcopy(segment.module)         # (a GraphModule's copy keeps only what its graph uses)
        own.is_conv_net = functools.partial(bool, segment.conv_net)
        own.exported_segment = True
        p = self._prepare_strategy(engine, own, inputs[0], precision, threads, seg_ctx)
        p.info["engine"] = engine
        if p.compiles_on_first_call:
            with torch.no_grad():
                p.fn(*p.inputs)
        return p

    def _prepare_split(self, model, example_inputs, precision, threads, ctx, decision: dict) -> Prepared:
        """The split a cached decision names, prepared again (the same cuts, or UnsupportedError)."""
        from .. import split

        plan = decision["split"]
        graph, segments, per = self._segments(model, example_inputs, precision, ctx)
        if graph.cut_names() != plan["cut_after"]:
            raise UnsupportedError("the graph is cut elsewhere now")
        knobs = {decision.get("whole_strategy"): decision.get("knobs") or {}}
        stages = [split.Stage(seg, self._prepare_segment(engine, seg, i, per[i], precision, threads, ctx,
                                                         knobs.get(engine, {})))
                  for i, (seg, engine) in enumerate(zip(segments, plan["plan"], strict=True))]
        return _split_prepared(graph, stages, example_inputs, {})

    def _prepare_strategy(self, strategy, model, example_inputs, precision, threads, ctx) -> Prepared:
        from ...machine.fpmath import TORCH_MODES

        crashes.trying(strategy, "preparing", ctx.model_name, precision)     # a crash from here on is this strategy's
        if strategy == "compiled":
            if ctx.fpmath not in TORCH_MODES:
                raise UnsupportedError(f"the compiled graph has no {ctx.fpmath} fast math for fp32 (torch's modes: "
                                       f"{', '.join(TORCH_MODES)})")
            return _compiled(model, example_inputs, precision, threads, ctx, self.engines.get("inductor"))
        backend = self.engines.get(strategy)
        reason = (f"no {strategy} engine was handed in" if backend is None
                  else backend.unavailable_reason() or backend.fpmath_reason(ctx.fpmath))
        if reason:
            raise UnsupportedError(reason)
        return backend.prepare(model, example_inputs, precision, threads, ctx)


def _rows_model(model, example_inputs, ctx):
    """(the model computing only the rows its output reads, its context, what was narrowed: rows.Pruned), or
    UnsupportedError. The rewritten graph is a model of its own in the engines' caches, and keeps the
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


def _rows_note(found) -> str:
    return (f"{found.narrowed} ops compute only the rows the output reads, {found.flops_saved:.1%} fewer FLOPs "
            "(aio_compile/rows.py)")


def _journaled(passes: dict, model_name: str, precision: str) -> dict:
    """The strategies' passes, each writing down that it runs when the rounds turn to it (backends/crashes.py)."""
    def journaled(name, one_pass):
        def run():
            if _journaled.last != name:
                _journaled.last = name
                crashes.trying(name, "timing", model_name, precision)
            return one_pass()
        return run
    _journaled.last = None
    return {name: journaled(name, p) for name, p in passes.items()}


def _call(p: Prepared):
    return p.fn(*p.inputs)


def _one_pass(p: Prepared, ctx) -> Callable[[], object]:
    """The zero-argument pass the runner will time for `p` (ctx.make_pass), else one call on its inputs."""
    return ctx.make_pass(p) if ctx.make_pass else functools.partial(_call, p)


def _trial(kept_pass, name: str, challenger, time_passes, threads: int, trial: dict, tuning: dict,
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
                         and gain >= KNOB_MIN_GAIN)
    if not timed.quiet:
        tuning.setdefault("not_saved", f"the rounds timing {what} were not quiet; the next run tunes again")
    return trial["kept"]


FINALIST_MARGIN = 0.05      # strategies within this of the fastest take their own knob and rows stages too
_STAGE_FIELDS = ("knobs", "knob_trials", "knob_tuning_s", "rows")


def _finalists(best: str, medians: dict) -> list[str]:
    """The fastest strategy, then the others whose median was within FINALIST_MARGIN of it: two engines that
    close swap places between runs, and the knobs of the one behind may put it ahead (ONNX Runtime chosen by
    3% over OpenVINO on vit_b_16 int8, where OpenVINO's int8_mixed_bf16 gains 3-6%)."""
    return [best, *_close_to(best, medians, FINALIST_MARGIN)]


def _close_to(best: str, medians: dict, margin: float, among=STRATEGIES) -> list[str]:
    """The strategies of `among` other than `best` whose median was within `margin` of best's, fastest first
    (none when best has no median)."""
    if best not in medians:
        return []
    close = sorted((m, s) for s, m in medians.items()
                   if s != best and s in among and m <= medians[best] * (1 + margin))
    return [s for _, s in close]


# Engines this close in the decision's timing are raced again in each process that runs a cached decision: on a
# shared machine their order changes from one process to the next (mobilenet_v2 fp32 here: OpenVINO 4.3-7.3 ms,
# ONNX Runtime 4.2-8.8 ms alone in successive processes), so only the process that runs them can tell.
RACE_MARGIN = 0.25


def race_setting() -> bool:
    """`AIO_RACE_CLOSE` (1, the default: race engines within RACE_MARGIN again when a cached decision is run;
    0: run the decision's strategy)."""
    return _switch("AIO_RACE_CLOSE", "race close engines again in this process", "run the cached decision")


def switch_setting() -> bool:
    """`AIO_SWITCH` (1, the default: keep every engine raced and run the fastest of them at each moment,
    backends/switching.py; 0: run the race's winner throughout)."""
    return _switch("AIO_SWITCH", "switch among close engines at run time", "run the race's winner")


def _with_switching(prepared: Prepared, best: str, others: dict[str, Prepared], tuning: dict,
                    medians_ms: dict | None) -> Prepared:
    """`prepared` (the strategy `best`) switching at run time among `others` too (backends/switching.py), unless
    there are none or AIO_SWITCH is 0; `tuning["switch"]` gets the passes each engine ran. `medians_ms`: what
    quiet rounds just measured of each (None when they were not quiet)."""
    if not others or not switch_setting():
        logger.info("aio: running %s", best)
        return prepared
    from ..switching import switching

    logger.info("aio: running %s, switching at run time to %s when faster", best, ", ".join(others))
    return switching({best: prepared, **others}, best, tuning.setdefault("switch", {}), medians_ms)


def _rivals(decision: dict, offered) -> list[str]:
    """The whole-model engines (not generation's) whose median in the decision's timing was within RACE_MARGIN
    of the decided strategy's, fastest first; none for a split or a generation decision."""
    decided = decision.get("strategy")
    if decided not in STRATEGIES:
        return []
    return _close_to(decided, decision.get("medians_ms") or {}, RACE_MARGIN, [s for s in STRATEGIES if s in offered])


def _final(tuned: dict, best: str, time_passes, threads: int, tuning: dict) -> str:
    """Time the finalists, each with its kept knobs and rows, against each other and return the fastest (`best`
    unless the rounds were quiet). Fills `tuning["finalists"]`; the winner's stage fields are the decision's."""
    import torch

    with torch.no_grad():
        timed = time_passes({name: t[0][1] for name, t in tuned.items()}, threads)
    winner = min(timed.medians, key=timed.medians.get) if timed.quiet and timed.medians else best
    final = tuning["finalists"] = {"margin": FINALIST_MARGIN, "medians_ms": timed.medians, "clear": timed.clear,
                                   "quiet": timed.quiet, "chosen": winner}
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


def _split_prepared(graph, stages: list, example_inputs, info: dict) -> Prepared:
    """The split's pass as a Prepared: torch inputs in, the model's outputs out; each stage's engine and mode
    said (its prepared info names the engine, see _prepare_segment)."""
    from .. import split

    modes = ", ".join(f"{i}: {s.prepared.info['engine']} {s.prepared.precision_mode}" for i, s in enumerate(stages))
    info = {**info, "segments": [{"precision_mode": s.prepared.precision_mode, **s.prepared.info} for s in stages]}
    return Prepared(split.split_pass(graph, stages), tuple(example_inputs), f"split ({modes})", info)


def _split_need(weights: int, engines: list) -> int:
    """Bytes the split stage needs free: each segment prepared on each engine, and the cut graph."""
    return weights * (len(engines) + 1)


def may_split(prepared: dict, model) -> bool:
    """Whether a split stage may follow the choice: two engines ran the whole model, and it is a torch graph
    (not a generation step, not an ONNX file)."""
    from ..int8 import is_generation_step

    return (sum(s in STRATEGIES for s in prepared) >= 2 and not is_generation_step(model)
            and onnx_source(model) is None)


def _memory_short(need: float) -> str | None:
    """Why a strategy is not tried for want of memory: it needs `need` more bytes (its own copy of the weights
    and the frozen, merged or repacked constants compiling makes, or an engine's own format). Tuning holds
    every strategy at once; a strategy left out is named in the decision, which is then not cached."""
    import psutil

    free = psutil.virtual_memory().available - MEMORY_MARGIN
    if need > free:
        return (f"not tried: about {need / 2**30:.1f} GiB more memory needed, "
                f"{max(free, 0) / 2**30:.1f} GiB free beyond a {MEMORY_MARGIN >> 30} GiB margin")
    return None


def best_has_knobs(prepared: dict, model) -> bool:
    """Whether a knob stage may follow the choice: some prepared strategy has KNOBS (not a generation step)."""
    from ..int8 import is_generation_step

    return any(s in KNOBS for s in prepared) and not is_generation_step(model)


def _choose(prepared: dict, refused: dict, time_passes, threads: int, decision_file, key: dict,
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
            timed = time_passes(_journaled({s: one_pass for s, (_, one_pass) in prepared.items()}, key.get("model", ""),
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
        prior = _prior_decision(decision_file, key, prepared)
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
        _save_decision(decision_file, decision)
    if "not_saved" in tuning:
        logger.warning("aio tuning: %s", tuning["not_saved"])
    logger.info("aio tuning chose %s (%s)", best, _why_chosen(medians, refused))
    return best, tuning


def _why_chosen(medians: dict, refused: dict) -> str:
    """The timings a choice was made on, or that it was the only strategy left and why the others were."""
    if medians:
        return ", ".join(f"{s} {v:.2f} ms" for s, v in medians.items())
    return "the only strategy prepared" + "".join(f"; {s}: {why}" for s, why in refused.items())


PRIOR_IGNORES = ("versions", "strategies")     # what may differ between a prior decision's key and ours


def _prior_decision(decision_file, key: dict, prepared: dict) -> dict | None:
    """The newest cached decision for the same model, inputs, precision, threads and CPU whose key differs
    only in library versions or the strategies on offer, naming a strategy prepared now."""
    found = []
    for other in decision_file.parent.parent.glob(f"{decision_file.parent.name.rsplit('-', 1)[0]}-*/decision.json"):
        try:
            their_key = json.loads((other.parent / "key.json").read_text())
            decision = json.loads(other.read_text())
        except (OSError, ValueError):
            continue
        same = all(their_key.get(k) == v for k, v in key.items() if k not in PRIOR_IGNORES)
        if other != decision_file and same and decision.get("strategy") in prepared:
            differs = [k for k in PRIOR_IGNORES if their_key.get(k) != key.get(k)]
            found.append((other.stat().st_mtime, {"strategy": decision["strategy"], "file": str(other),
                                                  "why": " and ".join(f"other {k}" for k in differs) or "this key"}))
    return max(found, key=lambda f: f[0])[1] if found else None


def _compiled_knob_reasons(knobs, model, example_inputs, precision) -> dict:
    """Each of these of the compiled strategy's KNOBS -> why it cannot apply to this model at this precision, or
    None (the conv-net test, a pass with hooks, runs at most once for them all)."""
    import torch

    from ..int8 import is_conv_net

    pt2e = bool(knobs) and precision == "int8" and is_conv_net(model, example_inputs)
    no_conv = not any(isinstance(m, torch.nn.Conv2d) for m in model.modules())
    return {knob: "the layout knob applies to conv nets, and this model has no Conv2d"
            if knob == "channels_last" and no_conv
            else "the compiled strategy's knobs apply to aio's own graph, not to PT2E int8" if pt2e else None
            for knob in knobs}


def _compiled(model, example_inputs, precision, threads, ctx, inductor: Backend | None = None) -> Prepared:
    """torch.compile(backend="aio") with the precision's implicit mode, channels-last for conv nets."""
    import torch

    from ... import aio_compile
    from ...core import precision as prec
    from ..int8 import is_conv_net, is_generation_step

    options = {"modelname": ctx.model_name, "threads": threads}
    inputs, mode = example_inputs, "native"
    if is_generation_step(model):
        return _compiled_generation(model, example_inputs, precision, options)
    reasons = _compiled_knob_reasons(ctx.knobs, model, example_inputs, precision)
    reason = reasons.get("channels_last") or next(filter(None, reasons.values()), None)    # the layout's first
    if reason:
        raise UnsupportedError(reason)
    knobs = dict(ctx.knobs)
    channels_last = knobs.pop("channels_last", None)
    options.update(knobs)         # inductor's cpp_wrapper, max_autotune
    if precision == "bf16":
        model, inputs, mode = prec.cast(model, example_inputs, "bf16")
    elif precision == "fp16":
        options["implicit_fp16_filter"] = os.environ.get("AIO_IMPLICIT_FP16_TRANSFORM_FILTER") or ".*"
        options["implicit_fp16_dtype"] = "FP16"       # the label says fp16: not the CPU's preferred bf16
    elif precision == "int8":
        if is_conv_net(model, example_inputs):
            # The implicit int8 kinds (FullyConnected, Matmul, EmbeddingBag) would leave the convolutions in
            # fp32: conv nets take static PT2E int8 lowered by inductor instead.
            if inductor is None:
                raise UnsupportedError("int8 conv nets run on the inductor backend, and none was handed in")
            prepared = inductor.prepare(model, example_inputs, precision, threads, ctx)
            prepared.info["int8_path"] = "PT2E static int8 lowered by inductor (conv net)"
            return prepared
        options["quantize_int8_filter"] = os.environ.get("AIO_QUANTIZE_INT8_FILTER") or ".*"
    aio_compile.resolve_options(options)          # bad AIO_* values stop here, before compiling
    provider = aio_compile.register()
    model, inputs = aio_compile.prepare_module(model, inputs, channels_last)
    compiled = torch.compile(model, backend="aio", options=options)
    info = {"provider": provider, "options": options, "passes": {}}

    def check():
        """After the first call (the compile): say what the passes did, and refuse a label the graph does not
        honour."""
        report = aio_compile.last_report(ctx.model_name) or {}
        info["passes"] = report
        if precision == "fp16":
            dtype = (report.get("implicit_fp16") or {}).get("dtype")
            if dtype not in (None, "float16", "fp16", "torch.float16"):
                raise UnsupportedError(f"implicit reduced precision runs {dtype} on this CPU, not fp16")
        int8 = report.get("quantize_int8") or {}
        if precision == "int8" and not (int8.get("quantized") or int8.get("onednn_int8_linears")):
            raise UnsupportedError("no op of this model was quantized by the implicit int8 pass")

    return Prepared(_CheckedOnFirstCall(compiled, check), inputs,
                    f"implicit-{precision}" if precision in ("fp16", "int8") else mode, info,
                    compiles_on_first_call=True)


def _compiled_generation(model, example_inputs, precision, options) -> Prepared:
    """A generation step through backend "aio" with static shapes (one prefill graph, one decode graph):
    q/k/v and gate/up projections merged into one GEMM each (fewer, larger weight reads per token), weights
    frozen; int8/int4 as weight-only quantization (torchao) first, whose packed weights stay unmerged."""
    import torch

    from ... import aio_compile
    from ..generation import CompiledDecode, generation_weights

    model, mode, info = generation_weights(model, example_inputs, precision)
    info.update(dynamic=False, prefill="eager")
    aio_compile.resolve_options(options)
    info["provider"] = aio_compile.register()
    compiled = torch.compile(model, backend="aio", options=options, dynamic=False)
    info["options"] = options

    def check():
        info["passes"] = aio_compile.last_report(options["modelname"]) or {}

    return Prepared(_CheckedOnFirstCall(CompiledDecode(model, compiled), check), example_inputs, mode, info,
                    compiles_on_first_call=True)


class _CheckedOnFirstCall:
    """The compiled module, checked once its first call has compiled it. Other attributes are the module's
    (a generation step's `new_cache`), as with any torch.compile result."""

    def __init__(self, compiled, check):
        self.compiled, self.check = compiled, check

    def __call__(self, *args):
        out = self.compiled(*args)
        if self.check is not None:
            check, self.check = self.check, None
            check()
        return out

    def __getattr__(self, name):
        if name in ("compiled", "check"):      # not set yet (a copy being made): no recursion
            raise AttributeError(name)
        return getattr(self.compiled, name)


def _decision_file(model_name: str, key: dict):
    from ..artifacts import artifact_dir

    return artifact_dir("tuning", model_name, **key) / "decision.json"


def _load_decision(path) -> dict | None:
    try:
        decision = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    decision.setdefault("mode", "thorough")       # taken before quick tunings existed: every stage ran
    return decision


class _Progress:
    """A progress bar of a tuning on stderr: the stage it is in, and an estimate of the time left (tqdm's, from
    the stages done so far); none where CI is set or for a tuning that ends at once."""

    def __init__(self, model: str, precision: str):
        self.what, self.bar, self.doing = f"aio tuning {model} {precision}", None, None

    def __enter__(self):
        return self

    def plan(self, stages: int) -> None:
        from tqdm import tqdm

        quiet = os.environ.get("CI", "").lower() in ("1", "true")
        self.bar = tqdm(total=stages, desc=self.what, unit="stage", file=sys.stderr, disable=quiet,
                        dynamic_ncols=True, bar_format="{desc}: {n_fmt}/{total_fmt} [{elapsed}<{remaining}] {postfix}")

    def step(self, doing: str, more: bool = False) -> None:
        """The stage before is done; `doing` begins (a stage `more` than planned)."""
        if self.bar is None:
            return
        if more:
            self.bar.total += 1
        if self.doing is not None:
            self.bar.update(1)
        self.doing = doing
        self.bar.set_postfix_str(doing)
        logger.debug("%s: %s", self.what, doing)

    def __exit__(self, kind, *exc):
        if self.bar is not None:
            if kind is None:             # the last stage is done too
                self.bar.update(self.bar.total - self.bar.n)
            self.bar.close()


def _save_decision(path, decision: dict) -> None:
    from ...core.paths import write_json_atomic

    write_json_atomic(path, decision, indent=1)
