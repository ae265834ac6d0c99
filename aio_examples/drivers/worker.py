"""The worker protocol: the flags of one measurement, and the argument list a driver builds for its process.

`aio-examples run`, every model's run.py and every process a driver starts (sweep points, matrix cells,
throughput instances) parse the same flags, defined here; a driver builds the argument list with
`run_argv` beside them, so the two cannot drift apart (tests/drivers/test_worker.py round-trips them).
A point whose process never wrote its own record gets one from `record_failure`, whichever driver ran it.
"""

import argparse
import math
import os
import sys

from ..core import records as res
from ..core.errors import UsageError
from ..core.log import logger
from ..machine.environment import MACHINE_CPUS_ENV, capture


def split_items(text: str, flag: str) -> list[str]:
    """A comma list given on the command line: each item once, none empty (`1,,2` is a typo, not `1,2`)."""
    items = [x.strip() for x in str(text).split(",")]
    if not any(items):
        raise UsageError(f"{flag} {text!r} is empty; accepted: a comma list of values")
    if "" in items:
        raise UsageError(f"{flag} {text!r} has an empty item; accepted: a comma list of values, none empty")
    twice = sorted({x for x in items if items.count(x) > 1})
    if twice:
        raise UsageError(f"{flag} {text!r} lists {', '.join(twice)} more than once; accepted: each value once")
    return items


def backends_setting(arg: str | list | None) -> list[str]:
    """`--backend` (or benchmark's `backend`): a name, a comma list, a list or `all`, each checked; the aio
    settings it will read checked too, before torch loads."""
    from ..backends import DEFAULT_BACKEND, available_backends, get_backend
    from ..backends.aio import (
        huge_pages_setting,
        knob_settings,
        process_mode,
        race_setting,
        rows_setting,
        split_settings,
        switch_setting,
        tune_setting,
    )

    if arg is None:
        names = [DEFAULT_BACKEND]
    elif not isinstance(arg, str):
        names = split_items(",".join(arg), "--backend")
        for n in names:
            get_backend(n)
    elif arg == "all":
        names = available_backends()
    else:
        names = split_items(arg, "--backend")
        for n in names:
            get_backend(n)
    if {"aio", "aio_torch"} & set(names):
        knob_settings()                       # a bad AIO_TUNE_KNOBS / AIO_KNOB_BUDGET_S stops here, before torch
        split_settings()                      # and AIO_TUNE_SPLIT / AIO_SPLIT_BUDGET_S
        rows_setting()                        # and AIO_TUNE_ROWS
        race_setting()                        # and AIO_RACE_CLOSE
        switch_setting()                      # and AIO_SWITCH
        huge_pages_setting()                  # and AIO_HUGE_PAGES
        tune_setting()                        # and AIO_TUNE
    if {"aio", "aio_torch"} & set(names) and not process_mode():
        print("AIO_PROCESS_MODE=0: the optimized backend is off, running eager instead", file=sys.stderr)
        names = list(dict.fromkeys("eager" if n in ("aio", "aio_torch") else n for n in names))
    return names


def precisions_setting(arg: str | list) -> list[str]:
    """`-p/--precision` (or benchmark's `precision`): a name, a comma list, a list or `all`, each checked."""
    from ..core.precision import PRECISIONS, validate

    if arg == "all":
        return list(PRECISIONS)
    return [validate(p) for p in split_items(arg if isinstance(arg, str) else ",".join(arg), "-p/--precision")]


def positive(flag, kind=int, accepted="a whole number >= 1"):
    """An argparse type: a number > 0 of `kind`, else a one-line usage error naming `flag`."""
    def parse(text):
        try:
            value = kind(text)
        except ValueError:
            value = 0
        if not (value > 0 and math.isfinite(value)):       # not inf or nan: a record holds finite numbers
            raise UsageError(f"{flag} {text!r} is invalid; accepted: {accepted}")
        return value
    return parse


def add_run_arguments(p: argparse.ArgumentParser) -> None:
    """The flags of a measurement, shared by `aio-examples run` and every run.py."""
    from ..backends import BACKENDS, DEFAULT_BACKEND
    from ..core.precision import PRECISIONS

    p.add_argument("-p", "--precision", default="fp32",
                   help=f"one of {', '.join(PRECISIONS)}, a comma list, or 'all' (default fp32)")
    p.add_argument("--fpmath-mode", default="strict", metavar="MODE",
                   help="fp32's fast math: strict (default), bf16 (fp32 weights, GEMMs and convolutions computed on "
                        "bf16 operands: oneDNN's fpmath mode in torch, OpenVINO's inference precision), f16 where the "
                        "CPU has fp16 arithmetic; a comma list measures each (strict,bf16)")
    p.add_argument("-b", "--batch-size", type=positive("-b/--batch-size"), default=1)
    p.add_argument("-t", "--threads", default=None,
                   help="threads (default: AIO_NUM_THREADS, else OMP_NUM_THREADS, else physical cores)")
    p.add_argument("--backend", default=None,
                   help=f"one of {', '.join(BACKENDS)}, a comma list, or 'all' (default: {DEFAULT_BACKEND})")
    p.add_argument("--timeout", type=positive("--timeout", float, "a number of seconds > 0"), default=60.0,
                   help="seconds of measurement per configuration (default 60)")
    p.add_argument("--num-runs", type=positive("--num-runs"), default=None,
                   help="measure exactly this many passes instead of stopping at the confidence target")
    p.add_argument("--output", default="results", help="folder for results.jsonl (default ./results)")
    p.add_argument("--input-size", type=positive("--input-size"), default=None, help="image side (vision)")
    p.add_argument("--seq-len", type=positive("--seq-len"), default=None, help="sequence length (NLP)")
    p.add_argument("--new-tokens", type=positive("--new-tokens"), default=None,
                   help="tokens to generate (text generation)")
    p.add_argument("--config-override", action="append", default=None, metavar="KEY=VALUE",
                   help="change the architecture's config (transformers models; repeatable), e.g. "
                        "num_hidden_layers=2: recorded in the input shape")
    p.add_argument("--weights", default=None, help="a local torchvision/PyTorch state-dict file")
    p.add_argument("--model-file", default=None,
                   help="your own model instead of a zoo name: a saved torch.export program (.pt2) or a TorchScript "
                        "module (.pt); recorded under the file's name with its digest")
    p.add_argument("--input-shape", default=None,
                   help="the model file's input shapes, NAME=DxDx...,... in order (a .pt2 may carry its own)")
    p.add_argument("--input-dtype", default=None, help="float32 (default), bfloat16, float16, int64, int32 or "
                                                       "bool; a comma list gives one per input")
    p.add_argument("--model-dir", default=None, help="a local Hugging Face model folder (with tokenizer)")
    p.add_argument("--dataset", default=None,
                   help="KIND:PATH of a labelled dataset to score every configuration on (imagenet, coco, squad, "
                        "glue, masked-text; default: the kind's environment variables, else synthetic inputs)")
    p.add_argument("--labels", default=None, help="the dataset's labels or annotation file (imagenet, coco)")
    p.add_argument("--num-samples", type=positive("--num-samples"), default=None,
                   help="score only the first N samples of the dataset (default: all)")
    p.add_argument("--allow-oversubscribe", action="store_true",
                   help="allow more threads than CPUs available to this process")
    p.add_argument("--probe", action="store_true",
                   help="after every second of passes, read the machine (one core's speed at numpy matmuls, "
                        "and how fast the cores hand work over) so compare can take its moves out of a change")
    p.add_argument("--profile", action="store_true",
                   help="after the timed passes, profile a few more: time per op category and the top ops per "
                        "configuration, a Chrome trace under OUTPUT/profiles (timings unchanged)")
    p.add_argument("--json", action="store_true", help="print the records as JSON lines instead of a table")
    p.add_argument("--tune", choices=("quick", "thorough"), default=None,
                   help="aio's tuning when nothing is cached for this model here: quick (default: about 30 s of "
                        "preparing, one knob tried) or thorough (every strategy and its settings, minutes); "
                        "as AIO_TUNE")
    p.add_argument("--launcher", choices=LAUNCHERS, default=None,
                   help="process (default): each configuration is prepared and measured in a process of its own, "
                        "so a crash, a hang or the memory of one costs only its own record; inline: all in this "
                        "process (for debuggers and profilers); as AIO_LAUNCHER")
    # Set by the drivers (sweep, throughput) for the processes they start: see run_argv.
    p.add_argument("--point-id", default=None, help=argparse.SUPPRESS)
    p.add_argument("--instance", default=None, help=argparse.SUPPRESS)
    p.add_argument("--barrier", default=None, help=argparse.SUPPRESS)
    p.add_argument("--turns", default=None, help=argparse.SUPPRESS)     # READ_FD,WRITE_FD from a sweep (drivers/turns.py)
    p.add_argument("--group", default=None, help=argparse.SUPPRESS)
    p.add_argument("--serve", default=None, help=argparse.SUPPRESS)     # a LoadGen driver's socket (drivers/loadgen.py)
    p.add_argument("--run-id", default=None, help=argparse.SUPPRESS)    # a run's configurations share it (drivers/launcher.py)
    p.add_argument("--rounds", default=None, help=argparse.SUPPRESS)    # READ_FD,WRITE_FD from a run (drivers/launcher.py)
    p.add_argument("--saved-module", default=None, help=argparse.SUPPRESS)  # benchmark(module): models.custom.save_module


def machine_cpus() -> int:
    """The CPUs of the machine a driver runs on: its Ray node's (set on the node), else the driver's own
    affinity, seen before a binding narrows a point's process to its cores."""
    value = os.environ.get(MACHINE_CPUS_ENV, "")
    return int(value) if value.isdigit() else len(os.sched_getaffinity(0))


def child_env(threads: int, allocator: str, binding, base=None, settings=()) -> dict:
    """A worker's environment: threads, binding, allocator and torch's runtime variables (`settings`,
    ((VARIABLE, value), ...): machine/env_axes.py) in place before it imports torch."""
    from ..machine import allocators, env_axes

    env = dict(os.environ if base is None else base)
    env.setdefault(MACHINE_CPUS_ENV, str(machine_cpus()))
    env.update(binding.child_env(threads))
    env.update(allocators.env_for(allocator, env))
    env.update(env_axes.env_for(settings))
    env.setdefault("PYTHONUNBUFFERED", "1")
    return env


def run_argv(model: str, shape: dict, command: str = "run", **options) -> list[str]:
    """Arguments of `python -m aio_examples run MODEL ...` (or another `command` of a model: `loadgen`) for
    one point: shape overrides and options become long flags (`batch_size=8` -> `--batch-size 8`,
    `json=True` -> `--json`; None is left out)."""
    argv = ["-m", "aio_examples", command, *([model] if model is not None else [])]
    for name, value in [*shape.items(), *options.items()]:
        if value is None or value is False:
            continue
        flag = "--" + name.replace("_", "-")
        if isinstance(value, (list, tuple)):        # a repeatable flag
            argv += [x for item in value for x in (flag, str(item))]
        else:
            argv += [flag] if value is True else [flag, str(value)]
    return argv


# The flags of `run` that a run passes on to the process of each of its configurations (drivers/launcher.py).
FORWARDED = ("batch_size", "threads", "timeout", "num_runs", "input_size", "seq_len", "new_tokens", "config_override",
             "weights", "model_file", "input_shape", "input_dtype", "model_dir", "dataset", "labels", "num_samples",
             "allow_oversubscribe", "probe", "profile", "point_id", "saved_module", "tune")


def config_argv(model: str | None, args: argparse.Namespace) -> list[str]:
    """The worker argv of one configuration of the run `args` asks for, without its backend, precision and
    output (drivers/launcher.py adds them): the same model, shape, inputs and stop rule, measured inline."""
    return run_argv(model, {}, **{k: getattr(args, k, None) for k in FORWARDED}, launcher="inline")


LAUNCHERS = ("process", "inline")


def fpmath_setting(modes, precisions: list[str], inline: bool) -> list[tuple[str, str]]:
    """(precision, fast-math mode) of every configuration `--fpmath-mode` (or benchmark's `fpmath_mode`: a
    comma list or a list) asks for with `precisions`, each mode checked against this CPU; several modes need a
    process per configuration (torch's setting is the process's)."""
    from ..core.precision import fpmath_configs
    from ..machine.fpmath import check_cpu

    modes = split_items(modes, "--fpmath-mode") if isinstance(modes, str) else list(modes)
    pairs = fpmath_configs(precisions, modes)
    if inline and len(modes) > 1:
        raise UsageError(f"--fpmath-mode {','.join(modes)} in one process cannot be: torch's fast math is the "
                         "process's; accepted: one mode with --launcher inline, or the process launcher (default)")
    for mode in modes:
        check_cpu(mode)
    return pairs


def launcher_setting(value: str | None = None) -> str:
    """`--launcher` (or benchmark's `launcher`), else `AIO_LAUNCHER`, else process: one line for a bad value."""
    chosen = value or os.environ.get("AIO_LAUNCHER", "").strip() or "process"
    if chosen not in LAUNCHERS:
        said = f"launcher {value!r}" if value else f"AIO_LAUNCHER={chosen!r}"
        raise UsageError(f"{said} is invalid; accepted: {' or '.join(LAUNCHERS)}")
    return chosen


def measures_inline(args: argparse.Namespace, configurations: int) -> bool:
    """Whether this process measures its configurations itself instead of a process for each: asked to
    (`--launcher inline`), or it is already the process of what a driver handed it (a sweep point or a matrix
    cell of one configuration, a configuration taking turns, an instance, a LoadGen server)."""
    from ..core.processes import DRIVER_PID_ENV

    driven = any(getattr(args, k, None) is not None for k in ("turns", "rounds", "instance", "serve"))
    by_driver = os.environ.get(DRIVER_PID_ENV) == str(os.getppid()) and configurations == 1
    return driven or by_driver or launcher_setting(getattr(args, "launcher", None)) == "inline"


def parse_run_argv(argv: list[str]) -> tuple[str, argparse.Namespace]:
    """What a process started with `run_argv` parses: (model, flags). The inverse of run_argv."""
    parser = argparse.ArgumentParser(prog="aio-examples run", exit_on_error=False)
    parser.add_argument("model")
    add_run_arguments(parser)
    if argv[:3] != ["-m", "aio_examples", "run"]:
        raise UsageError(f"{argv[:3]} is not a worker's argument list; accepted: -m aio_examples run MODEL ...")
    args = parser.parse_args(argv[3:])
    return args.model, args


def scenario_of(args: argparse.Namespace, task: str | None = None):
    """The scenario a process's flags ask for: an instance serving LoadGen's queries (--serve), a
    multi-instance window (--instance), turns a sweep hands out (--turns), else token-by-token generation
    for a text generator, or interleaved latency rounds."""
    from ..measurement.scenarios import (
        InstanceSync,
        ServeScenario,
        Turns,
        TurnsScenario,
        WindowScenario,
    )

    if getattr(args, "serve", None) is not None:
        return ServeScenario.parse(args.serve, args.instance, args.group or "")
    if args.instance is not None:
        return WindowScenario(InstanceSync.parse(args.instance, args.barrier or ".", args.group or ""))
    if args.turns is not None:
        return TurnsScenario(Turns(args.turns))
    if getattr(args, "rounds", None) is not None:       # one configuration of a run: its task's scenario
        from ..measurement.scenarios import GenerationScenario, LatencyScenario
        from ..models import is_generator

        inner = GenerationScenario() if task is not None and is_generator(task) else LatencyScenario()
        return TurnsScenario(Turns(args.rounds), inner=inner)
    return None         # the runner's default: by the model's task (generation or latency)


def failure_of(outcome, phase: str | None = None) -> tuple[str, str, dict | None]:
    """(status, reason, crash) of a process that ended without writing its record (core/processes.Outcome):
    `crashed` when a signal killed it (a segfault, an illegal instruction, the OOM killer), `timeout` when it
    hung past its time, `unsupported` when it refused the configuration up front (exit 2, a usage error such as
    too little memory), else `failed`. `phase`: what it was doing then (preparing, measuring, writing)."""
    if outcome.timed_out:
        status = "timeout"
    elif outcome.signal_name:
        status = "crashed"
    else:
        status = "unsupported" if outcome.returncode == 2 else "failed"
    crash = None
    if status in ("crashed", "timeout"):
        crash = {"signal": outcome.signal_name or ("SIGKILL" if outcome.timed_out else None),
                 "returncode": outcome.returncode, "phase": phase, "seconds": round(outcome.seconds, 1),
                 "stderr_tail": outcome.stderr_tail}
    reason = outcome.reason if phase is None else f"{phase}: {outcome.reason}"
    return status, reason, crash


def record_failure(out, spec, backend: str, precision: str, batch_size: int, threads: int, shape: dict,
                   status: str, reason: str, binding=None, point_id: str | None = None,
                   allocator: str = "default", crash: dict | None = None, run_id: str | None = None,
                   fpmath: str = "strict", settings=()) -> res.Result:
    """Append the record of a point whose process crashed, hung or never started (its own record never came):
    its configuration as the process would have recorded it (fast-math mode, runtime variables `settings`)."""
    r = res.Result.for_config(spec, backend, precision, batch_size, threads, shape, status=status, reason=reason,
                              point_id=point_id, crash=crash, **({"run_id": run_id} if run_id else {}),
                              fpmath={"mode": fpmath} if precision == "fp32" else None)
    if binding is not None:
        r.binding = {"method": binding.method, "cores": list(binding.cores),
                     "membind": list(binding.membind) if binding.membind else None}
        r.warnings = list(binding.warnings)
    from ..machine import env_axes

    # the machine it was to run on, like a measured record, and the variables its process would have had
    r.env = {**capture({"machine_cpus": machine_cpus()}), "allocator": allocator,
             "env_axes": env_axes.in_use({**os.environ, **env_axes.env_for(settings)})}
    res.append(out, r)
    logger.warning("%s %s/%s: %s: %s", spec.name, backend, precision, status, reason)
    return r
