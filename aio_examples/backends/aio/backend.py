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

Each stage has a module of its own beside this one: settings (strategies, knobs, budgets, `AIO_*`), decisions
(the cached decision), choose (preparing and timing the strategies), knobs, rows, split_stage, trials (a
setting timed against the one kept), race (a cached decision's close engines raced again, and the switching
among them), compiled (the compiled strategy), progress.
"""

import copy
import dataclasses
import functools
import time

from ...core.errors import UnsupportedError
from ...core.log import logger
from .. import crashes
from ..base import Backend, Prepared, held_bytes, onnx_source
from . import choose, compiled, decisions, knobs, race, rows, settings, split_stage
from .progress import Progress


class AioBackend(Backend):
    name = "aio"
    description = ("optimized: the fastest of aio-compiled / ONNX Runtime / OpenVINO here (generation: of its "
                   "compiled path, inductor, eager and the LLM engines), tuned and cached")
    copies_held = 2.0

    def __init__(self, engines: dict[str, Backend] | None = None):
        """`engines`: the backends the strategies run on ("onnxruntime", "openvino", and "inductor" for int8
        conv nets), built by the registry and handed in so this module does not import it."""
        self.engines = dict(engines or {})
        self.inductor = self.engines.get("inductor")      # int8 conv nets lower through inductor's PT2E

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
        with hugepages.backing(backed, settings.huge_pages_setting()):
            prepared = self._prepare(model, example_inputs, precision, threads, ctx)
            if prepared.compiles_on_first_call:
                with torch.no_grad():        # compiling makes the graph's constants: backed too
                    choose.one_pass(prepared, ctx)()
                prepared.compiles_on_first_call = False
        crashes.done()               # tuning is over: a crash from here on is no candidate's
        prepared.info.update(backed)
        return prepared

    def _prepare(self, model, example_inputs, precision, threads, ctx):
        """The decision cached for this key prepared again, its close engines raced again (race.py); else a
        tuning."""
        key = decisions.key(model, example_inputs, precision, threads, ctx, self.engines)
        decision_file = decisions.file(ctx.model_name, key)
        quick = settings.tune_setting() == "quick"
        cached = decisions.load(decision_file)       # a thorough decision serves either mode
        if quick and cached is None:
            key = {**key, "tune": "quick"}
            decision_file = decisions.file(ctx.model_name, key)
            cached = decisions.load(decision_file)
        offered, original = settings.strategies_for(model, self.engines), (model, ctx)
        rivals = race.rivals(cached or {}, offered) if settings.race_setting() and ctx.time_passes is not None else []
        crashed = functools.partial(crashes.known, model=ctx.model_name, precision=precision)
        if cached and crashed(cached["strategy"]):
            logger.info("aio: cached strategy %s %s; tuning again", cached["strategy"], crashed(cached["strategy"]))
            cached, rivals = None, []
        rivals = [r for r in rivals if not crashed(r)]
        if cached and (cached["strategy"] in offered
                       or cached["strategy"] == "split" and set(cached["split"]["plan"]) <= set(offered)):
            short = rivals and choose.memory_short(2 * held_bytes(model))
            if short:
                logger.info("aio: close engines %s not raced again: %s", ", ".join(rivals), short)
                rivals = []
            if rivals:   # preparing a strategy may change the model in place (cast, layout): rivals take a copy
                original = (copy.deepcopy(model), ctx)
            prepared = self._prepare_decision(cached, decision_file, model, example_inputs, precision, threads, ctx)
            if prepared is not None:
                return race.run(self, prepared, rivals, *original, example_inputs, precision, threads) if rivals \
                    else prepared
        model, ctx = original           # not the rows rewrite (tuning tries it on its own), a copy if one was made
        with Progress(ctx.model_name, precision) as progress:
            return self._tune(model, example_inputs, precision, threads, ctx, decision_file,
                              {"model": ctx.model_name, **key}, progress)

    def _prepare_decision(self, cached: dict, decision_file, model, example_inputs, precision, threads, ctx):
        """The strategy a cached decision names (a split: its segments on their engines), prepared again with the
        knobs and rows it kept; None when it no longer runs."""
        try:
            rows_kept = (cached.get("rows") or {}).get("kept")
            if rows_kept:
                model, ctx, found = rows.rewritten(model, example_inputs, ctx)
            if cached["strategy"] == "split":
                prepared = split_stage.prepare(self, model, example_inputs, precision, threads, ctx, cached)
            else:
                prepared = self._prepare_strategy(cached["strategy"], model, example_inputs, precision, threads,
                                                  dataclasses.replace(ctx, knobs=cached.get("knobs") or {}))
        except UnsupportedError:
            logger.info("cached strategy %s no longer runs; tuning again", cached["strategy"])
            return None
        prepared.info.update({"strategy": cached["strategy"],
                              "tuning": {**cached, "cached": True, "file": str(decision_file)}})
        if rows_kept:
            prepared.info["rows"] = rows.note(found)
        return prepared

    def _tune(self, model, example_inputs, precision, threads, ctx, decision_file, key, progress) -> Prepared:
        """Prepare every strategy that can run, time them alike (with `ctx.time_passes`), keep the fastest. A
        quick tuning (key["tune"]) prepares the strategies that fit its budget, cheapest first, tries only the
        QUICK_KNOBS on its choice, and skips the split stage.

        Without `ctx.time_passes` (prepare called outside the runner) the first strategy that runs is taken,
        untuned, and nothing is cached."""
        from ..int8 import is_generation_step

        started = time.monotonic()
        quick = key.get("tune") == "quick"
        weights = held_bytes(model)
        # a generation's output check needs its own teacher-forced steps: its strategies are not checked here
        checked = ctx.check is not None and not is_generation_step(model)
        prepared, refused, wrong = choose.prepare_all(self, model, example_inputs, precision, threads, ctx, weights,
                                                      checked, quick, started, progress)
        all_wrong = not prepared and bool(wrong)
        if all_wrong:                 # its record then fails the check, as the strategy's own backend would
            prepared = wrong
        if not prepared:
            raise UnsupportedError("no aio strategy runs this model at " + precision + ": "
                                   + "; ".join(f"{k}: {v}" for k, v in refused.items()))
        knobs_on = split_on = rows_on = False
        switch_to, switch_medians = {}, None         # the engines switched among at run time, beside the best
        if ctx.time_passes is None:
            best = next(iter(prepared))
            tuning = {"not_tuned": "no timing function handed in", "refused": refused}
            logger.warning("aio: no timing function handed in (PrepareContext.time_passes): running %s untuned", best)
        else:
            knobs_on = key.get("knobs_tuned") and knobs.best_has_knobs(prepared, model)
            split_on = not quick and key.get("split_tuned") and split_stage.may_split(prepared, model)
            rows_on = (key.get("rows_tuned") and not is_generation_step(model) and onnx_source(model) is None
                       and not (quick and time.monotonic() - started > settings.QUICK_BUDGET_S))
            progress.step("timing " + ", ".join(prepared))
            best, tuning = choose.choose(prepared, refused, ctx.time_passes, threads, decision_file, key,
                                         save=not (knobs_on or split_on or rows_on))
            later = [name for name, on in (("knobs", knobs_on), ("rows", rows_on), ("split", split_on)) if on]
            progress.step(f"the {', '.join(later)} stage{'s' * (len(later) > 1)}" if later else "done", more=bool(later))
        engines = [s for s in prepared if s in settings.STRATEGIES]
        if all_wrong:
            tuning["output_check"] = "every strategy that ran failed the output check: the fastest was kept"
        chosen = prepared[best]
        if ctx.time_passes is not None and (knobs_on or rows_on) and not all_wrong and "provisional" not in tuning:
            # the strategies not chosen free their memory for the trials, but for those close enough to win
            # once their own knobs are in (the finalists)
            finalists = [(f, prepared[f]) for f in choose.finalists(best, tuning.get("medians_ms") or {})]
            prepared = wrong = None
            tuned = {}
            for name, c in finalists:
                stages, m, cx = tuning if name == best else {}, model, ctx
                if knobs_on and name in settings.KNOBS and (not quick or name == best):
                    c = knobs.tune(self, name, c, m, weights, example_inputs, precision, threads, cx, checked, stages,
                                   quick)
                if rows_on and name in settings.STRATEGIES:
                    m, cx, c = rows.tune(self, name, c, m, weights, example_inputs, precision, threads, cx, checked,
                                         stages)
                tuned[name] = (c, m, cx, stages)
            if len(tuned) > 1:
                best = choose.final(tuned, best, ctx.time_passes, threads, tuning)
            chosen, model, ctx, _ = tuned[best]
            switch_to = {n: t[0][0] for n, t in tuned.items() if n != best and n in settings.STRATEGIES}
            final = tuning.get("finalists") or {}
            switch_medians = final.get("medians_ms") if final.get("quiet") else None
            del tuned, finalists
        elif ctx.time_passes is not None and not all_wrong and not is_generation_step(model):
            # the finalists, close enough to trade the lead (every engine when the rounds were busy: their order
            # then says little), stay prepared, and the run switches among them (backends/switching.py)
            provisional = "provisional" in tuning
            close = [s for s in prepared if s in settings.STRATEGIES and s != best] if provisional else \
                choose.finalists(best, tuning.get("medians_ms") or {})[1:]
            switch_to = {n: prepared[n][0] for n in close}
            switch_medians = None if provisional else tuning.get("medians_ms")
        if ctx.time_passes is not None and split_on and not all_wrong and "provisional" not in tuning:
            prepared = wrong = None
            if switch_to and choose.memory_short(split_stage.need(weights, engines)):
                switch_to = {}          # the split, whose decision is cached, needs the memory more
            best, chosen = split_stage.tune(self, best, chosen, engines, model, weights, example_inputs, precision,
                                            threads, ctx, checked, tuning)
        tuning["tuning_s"] = round(time.monotonic() - started, 1)     # preparing and timing it all, knobs too
        if (knobs_on or split_on or rows_on) and "not_saved" not in tuning:   # choose.choose left saving to these
            decisions.save(decision_file, {k: v for k, v in tuning.items() if k not in ("cached", "file")})
        chosen = chosen[0]
        chosen.info.update({"strategy": best, "tuning": tuning})
        chosen.compiles_on_first_call = False     # already compiled above
        if best not in settings.STRATEGIES:
            switch_to = {}                # a split
        return race.with_switching(chosen, best, switch_to, tuning, switch_medians) if switch_to else chosen

    # The steps every stage takes with a strategy (choose, knobs, rows, split_stage, race call them)

    def _copy(self, strategy, model, precision):
        """A strategy's own copy of the model handed in (a runtime's working copy, else a deep copy)."""
        engine = self.engines.get(strategy)
        return engine.working_copy(model, precision) if engine else copy.deepcopy(model)

    def _prepare_checked(self, strategy, own, example_inputs, precision, threads, ctx, checked: bool):
        """(prepared, its pass, why its first output fails the output check or None): compiled by a first pass
        where it compiles on its first call, checked when `checked`."""
        import torch

        p = self._prepare_strategy(strategy, own, example_inputs, precision, threads, ctx)
        one_pass = choose.one_pass(p, ctx)
        if p.compiles_on_first_call or checked:
            with torch.no_grad():
                output = one_pass()
        return p, one_pass, (ctx.check(output, precision) if checked else None)

    def _prepare_strategy(self, strategy, model, example_inputs, precision, threads, ctx) -> Prepared:
        from ...machine.fpmath import TORCH_MODES

        crashes.trying(strategy, "preparing", ctx.model_name, precision)     # a crash from here on is this strategy's
        if strategy == "compiled":
            if ctx.fpmath not in TORCH_MODES:
                raise UnsupportedError(f"the compiled graph has no {ctx.fpmath} fast math for fp32 (torch's modes: "
                                       f"{', '.join(TORCH_MODES)})")
            return compiled.prepare(model, example_inputs, precision, threads, ctx, self.inductor)
        backend = self.engines.get(strategy)
        reason = (f"no {strategy} engine was handed in" if backend is None
                  else backend.unavailable_reason() or backend.fpmath_reason(ctx.fpmath))
        if reason:
            raise UnsupportedError(reason)
        return backend.prepare(model, example_inputs, precision, threads, ctx)


class AioTorchBackend(AioBackend):
    """aio's own PyTorch path alone: `torch.compile(backend="aio")` with its graph passes, what a user of the
    compile backend gets on their own model, without the engines `aio` may hand a model to. Its knobs and
    cached decision work as aio's (one strategy to choose from)."""

    name = "aio_torch"
    description = "aio's own PyTorch path: torch.compile(backend=\"aio\") with its passes, no other engine"

    def __init__(self, inductor: Backend | None = None):
        super().__init__({})
        self.inductor = inductor

    def prepare(self, model, example_inputs, precision, threads, ctx):
        if onnx_source(model) is not None:
            raise UnsupportedError("aio_torch compiles torch modules; an ONNX file runs on onnxruntime, openvino "
                                   "or aio")
        return super().prepare(model, example_inputs, precision, threads, ctx)
