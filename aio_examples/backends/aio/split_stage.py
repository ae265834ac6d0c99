"""The split stage: the graph cut into segments (backends/split.py), each segment timed on each engine that ran the
whole model, and the split (each segment on its fastest engine) kept when it wins a trial against the whole model
(trials.py); and the split a cached decision names, prepared again."""

import copy
import dataclasses
import functools
import time

from ...core.errors import UnsupportedError, UsageError, short_error
from ..base import Prepared, onnx_source
from . import choose, settings, trials


def may_split(prepared: dict, model) -> bool:
    """Whether a split stage may follow the choice: two engines ran the whole model, and it is a torch graph
    (not a generation step, not an ONNX file)."""
    from ..int8 import is_generation_step

    return (sum(s in settings.STRATEGIES for s in prepared) >= 2 and not is_generation_step(model)
            and onnx_source(model) is None)


def need(weights: int, engines: list) -> int:
    """Bytes the split stage needs free: each segment prepared on each engine, and the cut graph."""
    return weights * (len(engines) + 1)


def tune(backend, best, chosen: tuple, engines: list, model, weights: int, example_inputs, precision, threads, ctx,
         checked: bool, tuning: dict) -> tuple:
    """Cut the graph into segments (backends/split.py), time each segment on each engine that ran the whole
    model, and unless the engine chosen for the whole model wins every segment, time the split (each segment
    on its fastest engine) against the choice so far:
    kept only when faster beyond noise, in quiet rounds, like a knob. Returns (strategy, (prepared, pass))
    and fills `tuning["split"]`."""
    import torch

    from .. import split

    start, budget = time.monotonic(), settings.split_settings()[1]
    trial = tuning["split"] = {}
    short = choose.memory_short(need(weights, engines))
    if short:
        trial["not_tried"] = short
        return best, chosen
    try:
        graph, segments, per = cut(model, example_inputs, precision, ctx)
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
                ready[engine] = prepare_segment(backend, engine, seg, i, per[i], precision, threads, ctx,
                                                knobs.get(engine, {}))
            except UsageError:
                raise
            except Exception as exc:  # noqa: BLE001  (an engine that cannot take a segment is not used there)
                trial["refused"][f"{i}:{engine}"] = short_error(exc)
        if not ready:
            trial["not_tried"] = f"no engine runs segment {i}"
            return best, chosen
        with torch.no_grad():
            timed = ctx.time_passes({e: functools.partial(choose.call, p) for e, p in ready.items()}, threads)
        trial["segment_ms"].append(timed.medians)
        if not timed.quiet:
            tuning.setdefault("not_saved", f"the rounds timing segment {i} were not quiet; the next run tunes again")
        stages.append(split.Stage(seg, ready[min(timed.medians, key=timed.medians.get)]))
    plan = trial["plan"] = [s.prepared.info["engine"] for s in stages]
    if set(plan) == {best}:         # else a split may win even on one engine: its graph cut differently
        trial.update(kept=False, why=f"{best}, the whole model's choice, is the fastest on every segment")
        trial["split_tuning_s"] = round(time.monotonic() - start, 1)
        return best, chosen
    p = _as_prepared(graph, stages, example_inputs, trial)
    one_pass = choose.one_pass(p, ctx)
    with torch.no_grad():
        failed = ctx.check(one_pass(), precision) if checked else None
        if failed:
            trial.update(kept=False, why=f"outputs fail the output check: {failed}")
            return best, chosen
        wins = trials.run(chosen[1], "split", one_pass, ctx.time_passes, threads, trial, tuning, ("whole", "split"),
                          "the split")
    trial["split_tuning_s"] = round(time.monotonic() - start, 1)
    if not wins:
        return best, chosen
    tuning.update(strategy="split", whole_strategy=best)
    return "split", (p, one_pass)


def cut(model, example_inputs, precision, ctx):
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


def prepare_segment(backend, engine, segment, index: int, inputs: list, precision, threads, ctx, knobs: dict):
    """One segment prepared (and compiled) on one engine, as a model of its own: its own name in the caches
    and int8 calibration on what reaches it."""
    import torch

    seg_ctx = dataclasses.replace(
        ctx, model_name=f"{ctx.model_name}.segment{index}", weights_id=f"{ctx.weights_id}-{segment.digest}",
        calibration=lambda n: (inputs[1:] or inputs[:1]) * n,
        knobs={**knobs, **settings.SPLIT_KNOBS.get(engine, {})}, check=None, time_passes=None, make_pass=None)
    own = copy.deepcopy(segment.module)         # (a GraphModule's copy keeps only what its graph uses)
    own.is_conv_net = functools.partial(bool, segment.conv_net)
    own.exported_segment = True
    p = backend._prepare_strategy(engine, own, inputs[0], precision, threads, seg_ctx)
    p.info["engine"] = engine
    if p.compiles_on_first_call:
        with torch.no_grad():
            p.fn(*p.inputs)
    return p


def prepare(backend, model, example_inputs, precision, threads, ctx, decision: dict) -> Prepared:
    """The split a cached decision names, prepared again (the same cuts, or UnsupportedError)."""
    from .. import split

    plan = decision["split"]
    graph, segments, per = cut(model, example_inputs, precision, ctx)
    if graph.cut_names() != plan["cut_after"]:
        raise UnsupportedError("the graph is cut elsewhere now")
    knobs = {decision.get("whole_strategy"): decision.get("knobs") or {}}
    stages = [split.Stage(seg, prepare_segment(backend, engine, seg, i, per[i], precision, threads, ctx,
                                               knobs.get(engine, {})))
              for i, (seg, engine) in enumerate(zip(segments, plan["plan"], strict=True))]
    return _as_prepared(graph, stages, example_inputs, {})


def _as_prepared(graph, stages: list, example_inputs, info: dict) -> Prepared:
    """The split's pass as a Prepared: torch inputs in, the model's outputs out; each stage's engine and mode
    said (its prepared info names the engine, see prepare_segment)."""
    from .. import split

    modes = ", ".join(f"{i}: {s.prepared.info['engine']} {s.prepared.precision_mode}" for i, s in enumerate(stages))
    info = {**info, "segments": [{"precision_mode": s.prepared.precision_mode, **s.prepared.info} for s in stages]}
    return Prepared(split.split_pass(graph, stages), tuple(example_inputs), f"split ({modes})", info)
