"""Run configurations: build the model once, prepare it on each backend, measure, make records."""

import os
import resource
import time
from dataclasses import dataclass, field
from pathlib import Path

from ..backends import BACKENDS, PrepareContext, get_backend
from ..backends.artifacts import weights_digest
from ..backends.base import FPMATH_READ_BACK
from ..compat.torchvision_shim import torchvision_status
from ..core import interrupts, scores
from ..core import precision as prec
from ..core import records as res
from ..core.errors import UnsupportedError, UsageError
from ..core.log import logger
from ..datasets import DEFAULT_DATASET, Dataset, get_dataset
from ..machine import env_axes, fpmath
from ..machine.contention import CONTENDED_CORES
from ..machine.environment import capture
from ..machine.threads import ThreadChoice, apply_threads
from ..models import ModelSpec, file_sha256, is_generator
from ..models.base import folder_sha256
from . import accuracy
from .output_check import check_outputs
from .scenarios import GenerationScenario, LatencyScenario, Scenario
from .timing import Measurement, StopRule, time_passes

# Messages of errors that mean "this build cannot do that", not "something broke".
_UNSUPPORTED_MARKERS = ("not implemented for", "Unsupported", "not supported", "NotImplementedError",
                        "does not support")


@dataclass
class RunRequest:
    """What to measure: one model at one precision/batch/threads on one or more backends."""

    spec: ModelSpec
    backends: list[str]
    precisions: list[str] | str = "fp32"      # one name or a list
    batch_size: int = 1
    threads: ThreadChoice = None
    shape: dict = field(default_factory=dict)
    weights: str | None = None
    model_dir: str | None = None
    rule: StopRule = field(default_factory=StopRule)
    module: object = None            # a user's own module (then spec is a CustomModel)
    example_inputs: tuple | None = None
    scenario: Scenario | None = None  # how the prepared configurations are driven (default: by the model's task)
    dataset: Dataset = field(default_factory=lambda: get_dataset(DEFAULT_DATASET))   # where the inputs come from
    point_id: str | None = None      # the sweep point this run answers
    probe: bool = False              # measure the machine probe after every round (machine/probe.py)
    profile: bool = False            # profiled passes after the timed ones (measurement/profile.py)
    flops_per_pass: int | None = None  # filled by run(): FLOPs of one pass (zoo models), for % of machine peak
    # fp32's fast-math mode (core/precision.FPMATH_MODES), one per process: torch's setting is the process's. The
    # eager fp32 reference outputs and scores are made strict before it is turned on.
    fpmath: str = "strict"

    def __post_init__(self):
        if self.scenario is None:
            self.scenario = GenerationScenario() if is_generator(self.spec.task) else LatencyScenario()
        if isinstance(self.precisions, str):
            self.precisions = [self.precisions]
        for p in self.precisions:
            prec.validate(p)
        prec.fpmath_configs(self.precisions, [self.fpmath])
        if self.fpmath != "strict" and set(self.precisions) != {"fp32"}:
            raise UsageError(f"--fpmath-mode {self.fpmath} with {', '.join(self.precisions)} in one process would "
                             "reach the float layers of every precision; accepted: -p fp32 alone, or a process per "
                             "configuration (--launcher process, the default)")
        if not isinstance(self.batch_size, int) or self.batch_size < 1:
            raise UsageError(f"batch size {self.batch_size!r} is invalid; accepted: a whole number >= 1")
        for name in self.backends:
            get_backend(name)
        _check_memory(self.spec, self.batch_size, self.shape, self.backends, self.precisions)
        if self.weights is not None and not Path(self.weights).is_file():
            raise UsageError(f"--weights {self.weights!r} is not a readable file; "
                             "accepted: a PyTorch state-dict file")
        if self.model_dir is not None and not Path(self.model_dir).is_dir():
            raise UsageError(f"--model-dir {self.model_dir!r} is not a folder; accepted: a local Hugging Face model folder")
        if self.dataset.tasks and self.spec.task not in self.dataset.tasks:
            raise UsageError(f"dataset {self.dataset.name!r} is for {', '.join(self.dataset.tasks)}, not "
                             f"{self.spec.name}'s {self.spec.task}")
        if getattr(self.dataset, "needs_tokenizer", False) and self.model_dir is None and self.module is None:
            raise UsageError(f"dataset {self.dataset.name!r} needs text tokenized as the model was trained; "
                             "accepted: --model-dir with a folder holding the model and its tokenizer")


def _check_memory(spec: ModelSpec, batch_size: int, shape: dict, backends: list[str], precisions: list[str]) -> None:
    """Refuse, from an estimate, what the machine cannot hold, before allocating any of it: the built model and
    a pass at this batch and shape, and every configuration's own copy of the weights (all are alive at once,
    measured in interleaved rounds)."""
    import psutil

    weights, generator = spec.weight_bytes(), is_generator(spec.task)
    runnable = [(b, p, get_backend(b)) for p in precisions for b in backends if (b, p) != ("eager", "fp32")]
    copies = {f"{b}/{p}": backend.memory_estimate(weights, p, generator) for b, p, backend in runnable
              if not (backend.unavailable_reason() or backend.unsupported_reason(spec, p))}
    need, have = spec.memory_estimate(batch_size, shape) + sum(copies.values()), psutil.virtual_memory().available
    if need <= have:
        return
    said = ", ".join(f"{k.replace('_', ' ')} {v}" for k, v in shape.items())
    parts = ", ".join(f"{k} {v / 2**30:.1f}" for k, v in copies.items() if v >= 2**30 / 10)
    raise UsageError(f"batch size {batch_size} at {said} needs about {need / 2**30:.0f} GiB for {spec.name}"
                     + (f" (the configurations' own weights, GiB: {parts})" if parts else "")
                     + f"; {have / 2**30:.0f} GiB are available; accepted: fewer backends or precisions per run "
                     "(a sweep runs each in its own process), a smaller batch size or input")


@dataclass
class _Candidate:
    backend: str
    precision: str
    result: res.Result
    measurement: Measurement | None = None
    prepared: object = None          # the backend's Prepared, for accuracy mode after the timed passes


def _classify(exc: BaseException) -> tuple[str, str]:
    text = f"{type(exc).__name__}: {str(exc).strip().splitlines()[0] if str(exc).strip() else ''}"
    if isinstance(exc, (UnsupportedError, NotImplementedError)) or any(m in text for m in _UNSUPPORTED_MARKERS):
        return "unsupported", text[:500]
    return "failed", text[:500]


def _weights_label(req: RunRequest) -> tuple[str, str | None]:
    if req.model_dir:
        return "model-dir", f"{Path(req.model_dir).resolve()} (sha256 {folder_sha256(req.model_dir)[:16]})"
    if req.weights:
        return "file", f"{Path(req.weights).resolve()} (sha256 {file_sha256(req.weights)[:16]})"
    return ("user-module" if req.module is not None else req.spec.random_weights), None


def run(req: RunRequest, out_dir: Path | None = None, run_id: str | None = None,
        reference: bool = False) -> list[res.Result]:
    """Measure every requested backend x precision (interleaved) and return their records, appended to out_dir.

    With `reference`, eager fp32 is measured alongside when not requested, so every record gets
    its speedup over eager fp32 from the same run. Every record's outputs are checked against
    eager fp32 on the same inputs. Ctrl-C or SIGTERM while preparing stops before anything is measured;
    while measuring, the records of what was measured are written, then KeyboardInterrupt is raised.
    """
    with interrupts.stop_on_signals():
        return _run(req, out_dir, run_id, reference)


# Graphs torch.compile may keep per function. Every compiled configuration of a run (backends x precisions,
# and the strategies aio tunes among) adds graphs for the same forward functions; past torch's default of 8,
# dynamo silently runs the function uncompiled, and a record would call eager timings compiled ones.
RECOMPILE_LIMIT = 256


def _run(req: RunRequest, out_dir: Path | None, run_id: str | None, reference: bool) -> list[res.Result]:
    import torch
    import torch._dynamo.config

    torch._dynamo.config.recompile_limit = max(torch._dynamo.config.recompile_limit, RECOMPILE_LIMIT)
    torch._dynamo.config.accumulated_recompile_limit = max(torch._dynamo.config.accumulated_recompile_limit,
                                                           4 * RECOMPILE_LIMIT)
    # Each run compiles its configurations afresh, as in a process of its own: graphs earlier runs of this
    # process (a notebook, a test session) left on the same forward functions count against those limits, and
    # a graph whose module guards were skipped (aio's decode step) could answer for another model's instance.
    torch._dynamo.reset()
    threads_in_effect = apply_threads(req.threads.threads)
    module = req.module if req.module is not None else req.spec.build(req.weights, req.model_dir, req.shape)
    module.eval()
    inputs = req.example_inputs or req.dataset.example_inputs(req.spec, req.batch_size, req.shape, module)
    configs = [(b, p) for p in req.precisions for b in req.backends]
    if reference and ("eager", "fp32") not in configs:
        configs.insert(0, ("eager", "fp32"))
    with torch.no_grad():
        reference_pass = req.spec.make_pass(_eager_fp32(module, inputs), req.shape)
        first = reference_pass()
        reference_output = req.spec.checked_output(reference_pass, first, first)
        reference = _reference_accuracy(req, module, inputs)
    if req.fpmath in fpmath.TORCH_MODES:           # after the strict reference: every configuration here runs in it
        fpmath.apply_torch(req.fpmath)
    _count_flops(req)
    blank = _blank_record(req, run_id or res.new_run_id(), threads_in_effect)
    ctx = PrepareContext(
        model_name=req.spec.name, task=req.spec.task, family=req.spec.family, shape=dict(req.shape),
        batch_size=req.batch_size, weights_id=weights_digest(module),
        calibration=(lambda n: [inputs] * n) if req.module is not None
        else lambda n: req.dataset.calibration_inputs(req.spec, req.batch_size, req.shape, module, n),
        time_passes=time_passes, make_pass=lambda prepared: req.spec.make_pass(prepared, req.shape),
        # aio's tuning judges each strategy's first output as the record of it would be
        check=lambda output, precision: _compare(req, reference_output, req.spec.checked_output(None, output, None),
                                                 precision, blank.weights).reason,
        fpmath=req.fpmath)
    candidates = []
    for backend_name, precision in configs:
        cand = _Candidate(backend_name, precision, res.Result.from_dict(
            {**blank.to_dict(), "backend": backend_name, "precision": precision}))
        candidates.append(cand)
        _prepare(cand, req, module, inputs, ctx)
        interrupts.check()          # a signal a library swallowed while preparing still stops the run
    active = [c for c in candidates if c.measurement is not None]
    serving = getattr(req.scenario, "serves_samples", False) and req.dataset.labelled
    if serving:         # LoadGen's accuracy mode: the instance answers samples by index, and scores the answers
        for cand in active:
            cand.measurement.samples = accuracy.SampleSource(req.dataset, req.spec, req.shape, module, cand.prepared,
                                                             req.batch_size, reference.metrics)
    interrupted = _drive(active, req)
    for cand in active:
        _fill(cand, req)
        _check(cand, req, reference_output, blank.weights)
        if req.profile and cand.result.status == "ok" and not interrupted:
            _profile(cand, out_dir)
    if reference is not None and not serving:
        interrupted = interrupted or _accuracy(active, req, module, reference, out_dir, blank.run_id)
    _speedups(candidates, getattr(req.scenario, "reference_ms", None))
    if out_dir is not None:
        _append_all(out_dir, [c.result for c in candidates])
    if interrupted:
        raise interrupted
    return [c.result for c in candidates]


def _profile(cand: _Candidate, out_dir: Path | None) -> None:
    """Profiled passes of a measured configuration, after its timed ones (they never change its timings)."""
    from . import profile

    trace = profile.trace_path(out_dir, cand.result.run_id, cand.backend, _tag(cand))
    try:
        cand.result.metrics["profile"] = profile.profile_prepared(cand.prepared, cand.measurement.fn, trace=trace)
    except Exception as exc:  # noqa: BLE001  (a profile that cannot be taken costs only the profile)
        cand.result.warnings.append(f"not profiled: {type(exc).__name__}: {exc}"[:300])


def _append_all(out_dir: Path, results: list[res.Result]) -> None:
    """Append every record, each on its own: one that cannot be written does not cost the others."""
    lost = []
    for r in results:
        try:
            res.append(out_dir, r)
        except res.RecordNotSaved as exc:
            lost.append(str(exc))
    if lost:
        raise res.RecordNotSaved("; ".join(lost))


def _blank_record(req: RunRequest, run_id: str, threads_in_effect: int) -> res.Result:
    """What every configuration's record of this run shares: the model, its inputs, the machine, the binding."""
    import torch

    weights, weights_path = _weights_label(req)
    if weights.startswith("random"):
        logger.info("%s uses random weights (none can be loaded here by default): outputs are meaningless, "
                    "timings are representative. Use --weights or --model-dir for real weights.", req.spec.name)
    binding = {"threads_in_effect": threads_in_effect, "threads_requested": req.threads.threads,
               "threads_source": req.threads.source, "interop_threads": torch.get_num_interop_threads(),
               "affinity": sorted(os.sched_getaffinity(0))}
    applied, binding_warnings = _binding_applied()
    binding.update(applied)
    return res.Result(
        model=req.spec.name, task=req.spec.task, backend="", precision="", batch_size=req.batch_size,
        threads=req.threads.threads, input_shape=req.spec.input_shape(req.batch_size, req.shape), weights=weights,
        weights_path=weights_path,
        confidence_target={"ci_rel_halfwidth": req.rule.ci_target, "confidence": req.rule.confidence},
        binding=binding, env=capture({**torchvision_status(), "env_axes": env_axes.in_use()}), run_id=run_id,
        warnings=[*binding_warnings, *filter(None, [fpmath.default_warning()])],
        point_id=req.point_id, instances=req.scenario.instances, instance=req.scenario.instance(),
        scenario=req.scenario.record(), dataset=req.dataset.name)


def _count_flops(req: RunRequest) -> None:
    if req.module is not None or req.model_dir is not None:    # the zoo entry's FLOPs are not a folder's model's
        return
    from .flops import cached_flops

    try:        # counted once per model and shape at batch 1 (cached), then scaled by the batch
        req.flops_per_pass = cached_flops(req.spec, dict(req.shape)) * req.batch_size
    except Exception:  # noqa: BLE001  (a count the flop counter cannot make only costs the % of peak)
        logger.debug("FLOPs of %s not counted", req.spec.name, exc_info=True)


def _drive(active: list[_Candidate], req: RunRequest) -> KeyboardInterrupt | None:
    """Hand the prepared configurations to the scenario; the interrupt (Ctrl-C, SIGTERM) that stopped it, if
    one did: what was measured is kept, the records are still written, then the run stops."""
    import torch

    if active:
        logger.info("measuring %s", ", ".join(f"{c.backend}/{c.precision}" for c in active)
                    + (" in interleaved rounds so drift affects all alike" if len(active) > 1 else ""))
    try:
        with torch.no_grad():
            req.scenario.measure([c.measurement for c in active], _fail_measurement, _probe(req), req.rule.timeout_s)
        interrupts.check()
    except KeyboardInterrupt as stop:
        for cand in active:
            if not cand.measurement.done:
                cand.measurement.stop_reason = "interrupted"
        return stop
    return None


def _probe(req: RunRequest):
    if not req.probe:
        return None
    from ..machine.probe import MachineProbe

    return MachineProbe()


def _binding_applied() -> tuple[dict, list[str]]:
    """The core/memory binding the parent applied (sweeps), checked against the affinity we really have."""
    from ..machine.binding import observed

    applied = observed()
    warnings = list(applied.get("warnings") or [])
    cores = applied.get("cores")
    if cores is not None and applied.get("method") != "none" and set(cores) != os.sched_getaffinity(0):
        warnings.append(f"bound to cores {cores} but running on {sorted(os.sched_getaffinity(0))}")
    return {"method": applied.get("method"), "cores": cores, "membind": applied.get("membind")}, warnings


def _eager_fp32(module, inputs):
    from ..backends import Prepared

    return Prepared(module, inputs, "native")


def _prepare(cand: _Candidate, req: RunRequest, module, inputs, ctx: PrepareContext) -> None:
    """Prepare one configuration; a backend that cannot take it becomes a record, not a crash."""
    import torch

    result, backend = cand.result, BACKENDS[cand.backend]
    if cand.precision == "fp32":
        result.fpmath = {"mode": req.fpmath}
    reason = (backend.unavailable_reason() or backend.unsupported_reason(req.spec, cand.precision)
              or (backend.fpmath_reason(req.fpmath) if cand.precision == "fp32" else None))
    if reason:
        result.status, result.reason = "unsupported", reason
        return
    logger.info("preparing %s on %s at %s", req.spec.name, cand.backend, cand.precision
                + (f" in fpmath {req.fpmath}" if cand.precision == "fp32" and req.fpmath != "strict" else ""))
    start = time.perf_counter()
    first_output = None
    try:
        with torch.no_grad():
            # Eager fp32 runs the module as built (nothing changes it): one copy of the weights fewer, which
            # for a 1B-parameter model is 5 GB. Every other configuration gets its own copy to change.
            own = module if (cand.backend, cand.precision) == ("eager", "fp32") else backend.working_copy(
                module, cand.precision)
            prepared = backend.prepare(own, inputs, cand.precision, req.threads.threads, ctx)
            one_pass = req.spec.make_pass(prepared, req.shape)
            if prepared.compiles_on_first_call:
                first_output = one_pass()      # compilation happens here, so it counts as preparation
    except UsageError:
        raise          # bad settings (e.g. an invalid AIO_* value) stop the run with their one-line message
    except Exception as exc:  # noqa: BLE001  (a backend that cannot take a model is a result, not a crash)
        inner = getattr(exc, "inner_exception", None)     # torch.compile wraps a backend's errors
        if isinstance(inner, UsageError):
            raise inner from None
        result.status, result.reason = _classify(inner or exc)
        logger.debug("preparing %s failed", cand.backend, exc_info=True)
        return
    result.prepare_s = round(time.perf_counter() - start, 3)
    logger.debug("%s prepared in %.1f s", cand.backend, result.prepare_s)
    result.precision_mode = prepared.precision_mode
    if cand.precision == "fp32":
        _fpmath_read_back(result, prepared.info.pop(FPMATH_READ_BACK, None), req.fpmath)
    result.backend_info = prepared.info
    result.strategy = prepared.info.get("strategy", cand.backend)
    cand.measurement = Measurement(one_pass, req.rule, first_output=first_output)
    cand.prepared = prepared


def _fpmath_read_back(result: res.Result, engine: dict | None, mode: str) -> None:
    """The record's fast-math mode as read back: the engine's own setting where it has one, else torch's (and
    the kernels oneDNN picks under it), with a warning when those kernels compute fp32 all the same."""
    read_back = engine if engine is not None else fpmath.torch_read_back(mode)
    result.fpmath = {"mode": mode, "read_back": read_back}
    warning = fpmath.kernel_warning(read_back, mode)
    if warning:
        result.warnings.append(warning)


def _tag(cand: _Candidate) -> str:
    """The precision in the names of a configuration's files (predictions, traces), with its fast-math mode."""
    mode = cand.result.fpmath_mode
    return cand.precision if mode == "strict" else f"{cand.precision}-fpmath-{mode}"


def _check(cand: _Candidate, req: RunRequest, reference_output, weights: str) -> None:
    m, r = cand.measurement, cand.result
    if r.status != "ok" or m.first_output is None:
        return
    check = _compare(req, reference_output, req.spec.checked_output(m.fn, m.first_output, reference_output),
                     cand.precision, weights)
    r.check = check.to_dict()
    if not check.passed:
        r.status, r.reason = "fail_accuracy", check.reason


def _compare(req: RunRequest, reference_output, output, precision: str, weights: str):
    """The output check of `output` (as `spec.checked_output` gives it) against the reference's, at the tolerances
    of the precision it computes in (fp32 in fast math: the narrower type's); agreement is judged only for real
    weights."""
    return check_outputs(req.spec.task, reference_output, output, prec.judged_as(precision, req.fpmath),
                         judge_agreement=not weights.startswith("random"),
                         reference_name=getattr(req.module, "reference", "eager-fp32"))


def _reference_accuracy(req: RunRequest, module, inputs) -> accuracy.Scored | None:
    """Eager fp32's metrics over the dataset, before any backend is prepared: a dataset that cannot be read
    or does not fit the model stops the run here, with nothing measured yet."""
    if not req.dataset.labelled:
        return None
    logger.info("scoring eager fp32 on %s (%d samples)", req.dataset.name, len(req.dataset.samples))
    scored = accuracy.score(req.dataset, req.spec, module, _eager_fp32(module, inputs), req.batch_size, req.shape)
    logger.info("eager fp32: %s", ", ".join(f"{k} {scores.shown(k, v)}" for k, v in scored.metrics.items()))
    return scored


def _accuracy(active: list[_Candidate], req: RunRequest, module, reference: accuracy.Scored, out_dir: Path | None,
              run_id: str) -> KeyboardInterrupt | None:
    """Score every measured configuration on the dataset (after all timing, so it never disturbs it); a
    drop below eager fp32 beyond its precision's allowance makes it fail_accuracy. Ctrl-C stops scoring:
    what was measured is still written."""
    import torch

    for cand in active:
        r = cand.result
        if r.status not in ("ok", "fail_accuracy"):
            continue
        try:
            if (cand.backend, cand.precision, r.fpmath_mode) == ("eager", "fp32", "strict"):
                found = reference            # the same module on the same samples: scored once
            else:
                logger.info("scoring %s/%s on %s", cand.backend, cand.precision, req.dataset.name)
                with torch.no_grad():
                    found = accuracy.score(req.dataset, req.spec, module, cand.prepared, req.batch_size, req.shape)
        except KeyboardInterrupt as stop:
            for later in active[active.index(cand):]:
                if later.result.status in ("ok", "fail_accuracy"):
                    later.result.warnings.append("accuracy not evaluated: interrupted")
            return stop
        except Exception as exc:  # noqa: BLE001  (a backend failing on a later batch: its record says why)
            r.status, r.reason = "failed", "scoring the dataset: " + _classify(exc)[1]
            continue
        saved = accuracy.save_predictions(out_dir, run_id, cand.backend, _tag(cand), found.predictions)
        r.accuracy = accuracy.block(req.dataset, found, reference.metrics, saved,
                                    req.dataset.protocol(req.spec, req.shape))
        why = accuracy.verdict(r.accuracy, prec.judged_as(cand.precision, req.fpmath))
        if why and r.status == "ok":
            r.status, r.reason = "fail_accuracy", why
    return None


def _fail_measurement(measurement: Measurement, exc: BaseException) -> None:
    measurement.error = _classify(exc)


def _fill(cand: _Candidate, req: RunRequest) -> None:
    m, r = cand.measurement, cand.result
    if m.error:
        r.status, r.reason = m.error
        return
    if not m.samples_ns:
        r.status, r.reason = "failed", f"stopped ({m.stop_reason}) before any pass was measured"
        return
    summary = m.summary()
    r.latency_ms = summary.to_dict()
    r.samples_ms = [round(s / 1e6, 4) for s in m.samples_ns]
    total_s = sum(m.samples_ns) / 1e9
    units = req.spec.task_size(req.batch_size, req.shape) * len(m.samples_ns)
    r.throughput = {"value": units / total_s, "unit": f"{req.spec.task_unit}/s"}
    r.first_pass_ms = m.first_pass_ms
    r.warmup = {"passes": m.warmup_passes, "seconds": round(m.warmup_s, 3)}
    r.measured_s = round(m.measured_s, 3)
    r.stop_reason = m.stop_reason
    if m.stop_reason == "interrupted":
        r.warnings.append(f"interrupted after {len(m.samples_ns)} measured passes: a resumed sweep measures it "
                          "again")
    r.confidence_met = m.confidence_met
    if cand.prepared.strategy_ran is not None:
        r.strategy = cand.prepared.strategy_ran()
    if m.rounds and m.rounds[0][1] is not None:
        from ..machine.probe import MachineProbe

        r.probe = {"workload": MachineProbe.name, "reference": MachineProbe.reference, "rounds": m.rounds}
    req.scenario.annotate(r, m, req.spec.task_size(req.batch_size, req.shape))
    r.peak_rss_mb = round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1)
    r.metrics["units_per_pass"] = req.spec.task_size(req.batch_size, req.shape)
    if req.flops_per_pass:
        r.metrics["flops_per_pass"] = req.flops_per_pass
    _observed_cores(m, r)
    _contention(m, r)
    for name, values in m.extra_ns.items():
        r.metrics[f"{name}_ms"] = res_summary(values)


# CPU time / wall time above the thread count by more than this means the backend ignored it.
_CORES_SLACK = 0.35


def _observed_cores(m: Measurement, r: res.Result) -> None:
    cores = m.observed_cores
    if cores is None:
        return
    r.binding["observed_cores"] = round(cores, 2)
    if cores > r.threads + _CORES_SLACK:
        r.warnings.append(f"{r.backend} kept {cores:.2f} cores busy with {r.threads} thread(s) requested: "
                          "it does not respect the thread setting")
        logger.warning("%s: %s", r.label, r.warnings[-1])


def _contention(m: Measurement, r: res.Result) -> None:
    busy = m.contention
    if busy is None:
        return
    # Cores of the affinity set beyond the threads are spare: what others run there leaves ours alone (a
    # 1-thread run on two cores beside one busy process); only the load beyond them takes from the run.
    spare = max(0, len(r.binding.get("affinity") or []) - r.threads)
    limit = spare + CONTENDED_CORES
    r.contention = {"busy_elsewhere_cores": round(busy, 2), "spare_cores": spare, "threshold_cores": limit,
                    "contended": busy > limit}
    if busy > limit:
        r.warnings.append(f"other processes kept {busy:.2f} of this run's cores busy while it measured"
                          + (f" ({spare} spare)" if spare else "") + ": its timings are not representative")
        logger.warning("%s: %s", r.label, r.warnings[-1])


def res_summary(values_ns) -> dict:
    from .stats import summarize

    s = summarize([v / 1e6 for v in values_ns])
    return {"median": s.median, "p90": s.p90, "mean": s.mean, "n": s.n}


def _speedups(candidates: list[_Candidate], reference_ms: float | None = None) -> None:
    """Each ok record's speedup over eager fp32 of the same run: measured here, or in another process of the
    run (`reference_ms`, when each configuration has a process of its own). Eager fp32 strict where it ran; in a
    process whose every configuration runs in a fast-math mode, eager fp32 in it."""
    eager = sorted((c.result for c in candidates if c.backend == "eager" and c.precision == "fp32"
                    and c.result.status == "ok"), key=lambda r: r.fpmath_mode != "strict")
    ref = eager[0] if eager and (eager[0].fpmath_mode == "strict" or not reference_ms) else None
    reference_ms = ref.median_ms if ref is not None else reference_ms
    if not reference_ms:
        return
    for c in candidates:
        if c.result.status == "ok":
            c.result.speedup_vs_eager_fp32 = reference_ms / c.result.median_ms
