"""Sweeps: every point (model x shape x backend x precision (x fp32's fast-math mode) x batch x threads x allocator
x torch's runtime variables) in its own process.

Each point starts fresh so its thread settings are in place before torch starts, bound to its cores
(see machine/binding.py), under a timeout; a point that crashes, hangs or fails still gets a record saying
why, and the sweep goes on. Records are appended point by point, so a rerun into the same output
resumes: points that already have a record are skipped. Exports, OpenVINO IR and the optimized
backend's tuning decisions are cached on disk (backends/artifacts.py), so later points reuse them.

Shape axes (`seq_lens`, `new_tokens`) are points of their own for the models that take that dimension; the
architecture's `config_overrides` (`KEY=VALUE`) go to every point and are part of its configuration key,
as they are of its record's input shape.
"""

import hashlib
import json
import math
import os
import random
import sys
import time
from dataclasses import asdict, dataclass, field, fields
from functools import cached_property
from pathlib import Path

from ..core import records as res
from ..core.errors import UnsupportedError, UsageError
from ..core.log import logger
from ..core.paths import read_toml
from ..core.precision import fpmath_configs
from ..core.processes import run_isolated
from ..core.records import ConfigKey, env_axes_label, machine_fingerprint, shape_label
from ..machine import allocators, env_axes
from ..machine.binding import plan, probe
from ..machine.environment import capture
from ..machine.fpmath import check_cpu
from ..machine.topology import numa_cpus_from_env, read_topology
from ..measurement.timing import ORDER_SEED, ROUND_GAP_S, ROUND_S
from .turns import Taker
from .worker import child_env, failure_of, machine_cpus, record_failure, run_argv

SHAPE_KEYS = ("input_size", "seq_len", "new_tokens")
# Shape axes: a list of values, each a point of its own, for the models whose shape has that dimension
# (SweepConfig key -> shape key). The single-value form is the `shape` table (--seq-len).
SHAPE_AXES = {"seq_lens": "seq_len", "new_tokens": "new_tokens"}
# Bounds that keep a typo from planning billions of points or processes (each point is a process of its own).
MAX_REPEATS = 1000
MAX_INTERLEAVE = 64


def _digest(fields_: dict) -> str:
    return hashlib.sha256(json.dumps(fields_, sort_keys=True).encode()).hexdigest()[:16]


@dataclass(frozen=True)
class Point:
    model: str
    backend: str
    precision: str
    batch_size: int
    threads: int
    allocator: str = "default"
    shape: tuple = ()                  # sorted (name, value) overrides, e.g. (("seq_len", 128),)
    repeat: int = 0                    # the same configuration again, in another process (SweepConfig.repeats)
    dataset: tuple = ()                # (kind, path, labels) to score on; () for the model's synthetic inputs
    config: tuple = ()                 # "KEY=VALUE" overrides of the architecture's config (--config-override)
    serving: tuple = ()                # a LoadGen test: (scenario, target rate or None, instances); docs/serving.md
    fpmath: str = "strict"             # fp32's fast-math mode (core/precision.py)
    env: tuple = ()                    # torch's runtime variables set for it: ((VARIABLE, value), ...), env_axes.py

    @property
    def env_axes(self) -> dict:
        """The runtime variables its process will have: the sweep's own (`env`) over what the driver has."""
        return env_axes.in_use({**os.environ, **env_axes.env_for(self.env)})

    @property
    def spec(self):
        """The zoo entry with this point's config overrides."""
        from ..models import get_model

        return get_model(self.model).with_config(list(self.config))

    @cached_property
    def key(self) -> ConfigKey:
        """The configuration this point measures, on whichever machine runs it (`machine` is "*"). Its shape is
        the record's (`Result.shape_label`): the input shape without the batch, config overrides included."""
        from ..models import is_generator

        spec = self.spec
        scenario, instances = "generation" if is_generator(spec.task) else "latency", 1
        if self.serving:
            from .loadgen import serving_key

            scenario, instances = serving_key(*self.serving[:2]), self.serving[2]
        return ConfigKey(self.model, spec.task, self.backend, self.precision, self.batch_size, self.threads, instances,
                         self.allocator, shape_label(spec.input_shape(1, spec.shape(**dict(self.shape)))),
                         scenario, self.dataset[0] if self.dataset else "synthetic", "*", self.fpmath,
                         env_axes_label(self.env_axes))

    @cached_property
    def point_id(self) -> str:
        """A digest of the point's configuration key (and its repeat), stamped on its record: the records a
        resumed sweep finds, and skips."""
        return _digest({**self.key.identity(), **({"repeat": self.repeat} if self.repeat else {})})

    @property
    def legacy_point_id(self) -> str:
        """The point's id in release 0.1 (a digest of the sweep's own fields), so its outputs resume too."""
        fields_ = asdict(self)
        for later, default in (("repeat", 0), ("dataset", ()), ("config", ()), ("serving", ()), ("fpmath", "strict"),
                               ("env", ())):     # fields added since, left out at their defaults
            if fields_[later] == default:
                del fields_[later]
        return _digest(fields_)

    @property
    def label(self) -> str:
        extra = "".join(f" {k}={v}" for k, v in self.shape)
        alloc = "" if self.allocator == "default" else f" [{self.allocator}]"
        again = f" (repeat {self.repeat + 1})" if self.repeat else ""
        data = f" on {self.dataset[0]}" if self.dataset else ""
        config = f" [{' '.join(self.config)}]" if self.config else ""
        config += f" fpmath {self.fpmath}" if self.fpmath != "strict" else ""
        config += "".join(f" {k}={v}" for k, v in self.env)
        serving = ""
        if self.serving:
            scenario, rate, instances = self.serving
            serving = f" LoadGen {scenario}" + (f" at {rate:g}/s" if rate else " peak" if scenario == "Server" else "")
            serving += f" {instances} instance(s)"
        return (f"{self.model} {self.backend} {self.precision} b{self.batch_size} t{self.threads}{alloc}{extra}{data}"
                f"{config}{serving}{again}")


def _names_list(name: str, values, accepted: str) -> None:
    """A sweep axis of names: a non-empty list of non-empty strings, each once (a string alone is not a list:
    `models = "resnet_18"` would otherwise be read letter by letter)."""
    if not isinstance(values, list) or not values:
        raise UsageError(f"{name} {values!r} is invalid; accepted: a non-empty list of {accepted}")
    for v in values:
        if not isinstance(v, str) or not v.strip():
            raise UsageError(f"{name} value {v!r} is invalid; accepted: {accepted}")
    _no_repeats(name, values)


def _no_repeats(name: str, values: list) -> None:
    twice = sorted({str(v) for v in values if values.count(v) > 1})
    if twice:
        raise UsageError(f"{name} lists {', '.join(twice)} more than once; accepted: each value once")


@dataclass
class SweepConfig:
    """What to sweep; validated as a whole before anything runs (bad input costs nothing measured)."""

    models: list[str]
    backends: list[str] = field(default_factory=lambda: ["aio"])
    precisions: list[str] = field(default_factory=lambda: ["fp32"])
    batch_sizes: list[int] = field(default_factory=lambda: [1])
    threads: list[int] | None = None          # None: powers of two up to the physical cores, plus that
    allocators: list[str] = field(default_factory=lambda: ["default"])
    # fp32's fast-math modes, each a point of its own (other precisions run once, strict): run --fpmath-mode
    fpmath_modes: list[str] = field(default_factory=lambda: ["strict"])
    # torch's runtime variables, each value a point of its own (machine/env_axes.py); None: left as they are
    lru_cache_capacity: list[int] | None = None       # LRU_CACHE_CAPACITY: oneDNN primitives torch keeps
    thp_mem_alloc: list[int] | None = None            # THP_MEM_ALLOC_ENABLE: 0 or 1
    shape: dict = field(default_factory=dict)
    seq_lens: list[int] | None = None         # each a point of its own (models with a sequence length)
    new_tokens: list[int] | None = None       # each a point of its own (text generators)
    config_overrides: list[str] = field(default_factory=list)   # "KEY=VALUE", passed to every point
    tune: str | None = None                   # aio's tuning where nothing is cached: quick or thorough (run --tune)
    input_shape: str | None = None            # your own model files' input shapes and dtypes (run --input-shape)
    input_dtype: str | None = None
    timeout: float = 20.0                     # measured seconds per point
    point_timeout: float = 900.0              # seconds before a point's process is killed
    output: str = "results/sweep"
    # Each point measured this many times, each in its own process, the rounds one after another. A process
    # has its own memory layout and placement, which moves its timings by a percent or more; repeats let a
    # comparison see that spread (analysis/compare.py) instead of mistaking it for a change.
    repeats: int = 1
    # Every point also reads the machine after each round (machine/probe.py), for compare.
    probe: bool = False
    # Up to this many points' processes alive at once, taking one-second turns (drivers/turns.py); 1: one after another.
    interleave: int = 1
    # Labelled datasets by kind, {"imagenet": {"path": ..., "labels": ...}}: each model is scored on the one
    # serving its task (docs/datasets.md); others run on synthetic inputs. Opened and checked before any point.
    datasets: dict = field(default_factory=dict)
    num_samples: int | None = None            # samples of each dataset scored (default: all)
    # LoadGen tests instead of measurements (docs/serving.md): {"scenarios": [...], "target_qps": [...],
    # "instances": [...], "latency_ms", "duration", "min_queries", "find_peak"}; threads are per instance.
    serving: dict = field(default_factory=dict)

    def __post_init__(self):
        from ..backends import available_backends, get_backend
        from ..core.precision import PRECISIONS, validate
        from ..models import ZOO, get_model

        # "all" (or ["all"]) stands for every zoo model, every backend installed here, every precision.
        for name, every in (("models", lambda: list(ZOO)), ("backends", available_backends),
                            ("precisions", lambda: list(PRECISIONS))):
            if getattr(self, name) in ("all", ["all"]):
                setattr(self, name, every())
        for name, accepted in (("models", "zoo names (aio-examples list)"), ("backends", "backend names"),
                               ("precisions", "precision names"), ("allocators", "allocator names"),
                               ("fpmath_modes", "fast-math modes")):
            _names_list(name, getattr(self, name), accepted)
        for m in self.models:
            get_model(m)
        for b in self.backends:
            get_backend(b)
        for p in self.precisions:
            validate(p)
        for a in self.allocators:
            allocators.validate(a)
        fpmath_configs(self.precisions, self.fpmath_modes)
        for axis in env_axes.ENV_AXES:
            if getattr(self, axis.key) is not None:
                env_axes.check(axis, getattr(self, axis.key))
        if not isinstance(self.output, str) or not self.output.strip():
            raise UsageError(f"output {self.output!r} is invalid; accepted: a folder path (text, not empty)")
        if not isinstance(self.shape, dict):
            raise UsageError(f"shape {self.shape!r} is invalid; accepted: a table of {', '.join(SHAPE_KEYS)}")
        if not isinstance(self.repeats, int) or isinstance(self.repeats, bool) or not 1 <= self.repeats <= MAX_REPEATS:
            raise UsageError(f"repeats {self.repeats!r} is invalid; accepted: a whole number from 1 to {MAX_REPEATS}")
        if (not isinstance(self.interleave, int) or isinstance(self.interleave, bool)
                or not 1 <= self.interleave <= MAX_INTERLEAVE):
            raise UsageError(f"interleave {self.interleave!r} is invalid; accepted: a whole number from 1 to "
                             f"{MAX_INTERLEAVE} (processes taking turns)")
        if not isinstance(self.probe, bool):
            raise UsageError(f"probe {self.probe!r} is invalid; accepted: true or false")
        for name in ("batch_sizes", "threads", *SHAPE_AXES):
            values = getattr(self, name)
            if values is None and name != "batch_sizes":
                continue                          # threads auto: powers of two up to the physical cores
            if not isinstance(values, list) or not values:
                raise UsageError(f"{name} {values!r} is invalid; accepted: a non-empty list of whole numbers >= 1"
                                 + (' (or "auto")' if name == "threads" else ""))
            for v in values:
                if not isinstance(v, int) or isinstance(v, bool) or v < 1:
                    raise UsageError(f"{name} value {v!r} is invalid; accepted: whole numbers >= 1")
            _no_repeats(name, values)
        for k, v in self.shape.items():
            if k not in SHAPE_KEYS or not isinstance(v, int) or isinstance(v, bool) or v < 1:
                raise UsageError(f"shape {k}={v!r} is invalid; accepted: {', '.join(SHAPE_KEYS)} = whole numbers")
        self._check_shapes()
        self._check_file_inputs()
        if self.tune is not None and self.tune not in ("quick", "thorough"):
            raise UsageError(f"tune {self.tune!r} is invalid; accepted: quick or thorough")
        self._check_datasets()
        if self.serving:
            from .loadgen import check_serving

            if self.interleave > 1:
                raise UsageError(f"interleave {self.interleave} does not apply to serving tests (LoadGen drives "
                                 "each alone); accepted: interleave = 1 with a serving table")
            if self.fpmath_modes != ["strict"]:
                raise UsageError(f"fpmath_modes {self.fpmath_modes} do not apply to serving tests (LoadGen's "
                                 "instances run strict); accepted: fpmath_modes = [\"strict\"] with a serving table")
            self.serving = check_serving(self.serving, [get_model(m).with_config(self.config_overrides)
                                                        for m in self.models], self.batch_sizes)
        for name in ("timeout", "point_timeout"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value < math.inf:
                raise UsageError(f"{name} {value!r} is invalid; accepted: seconds > 0 (a finite number)")

    def _check_shapes(self) -> None:
        """Shape axes and config overrides, each against every model it applies to: one line before anything runs."""
        from ..models import get_model

        for name, key in SHAPE_AXES.items():
            if getattr(self, name) is not None and key in self.shape:
                raise UsageError(f"{name} and shape.{key} are both given; accepted: one of them (--{name.replace('_', '-')}"
                                 f" or --{key.replace('_', '-')})")
        if not isinstance(self.config_overrides, list) or not all(
                isinstance(o, str) and o.strip() for o in self.config_overrides):
            raise UsageError(f"config_overrides {self.config_overrides!r} is invalid; accepted: a list of "
                             '"KEY=VALUE" strings')
        _no_repeats("config_overrides", self.config_overrides)
        specs = {m: get_model(m).with_config(self.config_overrides) for m in self.models}
        for name, key in SHAPE_AXES.items():
            if getattr(self, name) is not None and not any(key in s.default_shape for s in specs.values()):
                raise UsageError(f"{name} does not apply to {', '.join(self.models)}; accepted: models whose shape "
                                 f"has {key} (aio-examples list)")
        for spec in specs.values():
            for shape in self._shapes(spec):
                spec.shape(**shape)              # too long for the model, or not its dimension

    def _shapes(self, spec) -> list[dict]:
        """The shape overrides of `spec`'s points: the `shape` table times each axis it has a dimension for."""
        shapes = [dict(self.shape)]
        for name, key in SHAPE_AXES.items():
            values = getattr(self, name)
            if values is not None and key in spec.default_shape:
                shapes = [{**s, key: v} for s in shapes for v in values]
        return shapes

    def _check_file_inputs(self) -> None:
        """input_shape and input_dtype: text run's flags take, for models that are files (a zoo model's shape is
        its own: input_size, seq_len)."""
        from ..models import is_path
        from ..models.files import DTYPES, parse_shapes

        for name in ("input_shape", "input_dtype"):
            value = getattr(self, name)
            if value is None:
                continue
            if not isinstance(value, str) or not value.strip():
                raise UsageError(f"{name} {value!r} is invalid; accepted: text as run --{name.replace('_', '-')} takes")
            if not any(is_path(m) for m in self.models):
                raise UsageError(f"{name} applies to your own model files; accepted: a model given by its path")
        parse_shapes(self.input_shape)
        bad = [d for d in (self.input_dtype or "float32").split(",") if d.strip() not in DTYPES]
        if bad:
            raise UsageError(f"input_dtype {bad[0]!r} is invalid; accepted: {', '.join(DTYPES)} (comma list per input)")

    def _check_datasets(self) -> None:
        from ..datasets import open_dataset

        if not isinstance(self.datasets, dict):
            raise UsageError(f"datasets {self.datasets!r} is invalid; accepted: a table of kind = {{path, labels}}")
        if self.num_samples is not None and (isinstance(self.num_samples, bool) or not isinstance(self.num_samples, int)
                                             or self.num_samples < 1):
            raise UsageError(f"num_samples {self.num_samples!r} is invalid; accepted: a whole number >= 1")
        for kind, where in self.datasets.items():
            if not isinstance(where, dict) or not isinstance(where.get("path"), str) or set(where) - {"path", "labels"}:
                raise UsageError(f"datasets.{kind} {where!r} is invalid; accepted: {{path = \"...\", labels = \"...\"}}")
            open_dataset(kind, where["path"], where.get("labels"), self.num_samples)

    def dataset_of(self, model: str) -> tuple:
        """(kind, path, labels) of the dataset serving `model`'s task, or () for synthetic inputs."""
        from ..datasets import DATASETS
        from ..models import get_model

        task = get_model(model).task
        for kind, where in self.datasets.items():
            if task in DATASETS[kind].tasks:
                return kind, where["path"], where.get("labels")
        return ()

    @classmethod
    def from_toml(cls, path, overrides: dict | None = None) -> "SweepConfig":
        """A sweep kept in a file (see sweeps/*.toml); `overrides` (from the command line) win."""
        data = read_toml(path, "--config", "a TOML file (see sweeps/*.toml)")
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise UsageError(f"{path}: unknown key {unknown[0]!r}; accepted: {', '.join(sorted(known))}")
        if data.get("threads") == "auto":
            data["threads"] = None
        over = {k: v for k, v in (overrides or {}).items() if v is not None}
        shape = over.pop("shape", None) or {}
        for name, key in SHAPE_AXES.items():     # a dimension given on the command line, in either form, wins
            if name in over or key in shape:
                data.pop(name, None)
                if isinstance(data.get("shape"), dict):
                    data["shape"] = {k: v for k, v in data["shape"].items() if k != key}
        if shape:
            data["shape"] = {**data["shape"], **shape} if isinstance(data.get("shape"), dict) else shape
        data.update(over)
        return cls(**data)

    def points(self, default_threads: list[int]) -> list[Point]:
        from ..models import get_model

        config = tuple(self.config_overrides)
        shapes = {m: [tuple(sorted(s.items())) for s in self._shapes(get_model(m))] for m in self.models}
        tests = [()]
        if self.serving:
            from .loadgen import serving_points

            tests = serving_points(self.serving)
        return [Point(m, b, p, bs, t, a, shape, r, self.dataset_of(m), config, test, fpmath, env)
                for r in range(self.repeats) for m in self.models for shape in shapes[m] for b in self.backends
                for p, fpmath in fpmath_configs(self.precisions, self.fpmath_modes)
                for bs in self.batch_sizes for t in (self.threads or default_threads) for a in self.allocators
                for env in self.env_settings() for test in tests]

    def env_settings(self) -> list[tuple]:
        """Every combination of the runtime variables' values, ((VARIABLE, value), ...) each; [()] for none."""
        combos = [()]
        for axis in env_axes.ENV_AXES:
            values = getattr(self, axis.key)
            if values is not None:
                combos = [(*c, (axis.variable, v)) for c in combos for v in values]
        return combos


@dataclass
class SweepSummary:
    total: int
    skipped: int                      # already in the output (resumed)
    statuses: dict
    prepare_s: float
    warmup_s: float
    measured_s: float
    wall_s: float
    interrupted: KeyboardInterrupt | None = None      # what stopped it (Ctrl-C, or SIGTERM as Terminated)
    notes: list = field(default_factory=list)         # more lines for the user (a fleet's machines, lost nodes)

    def text(self, out: Path) -> str:
        ran = sum(self.statuses.values())
        counts = ", ".join(f"{n} {s}" for s, n in sorted(self.statuses.items())) or "nothing"
        lines = [f"sweep: {ran} point(s) run ({counts}), {self.skipped} already done, of {self.total}",
                 (f"time: {self.wall_s:.0f} s wall, of which preparing {self.prepare_s:.0f} s (compiling, exporting, "
                  f"tuning), warming up {self.warmup_s:.0f} s and measuring {self.measured_s:.0f} s; the rest is "
                  "process start, model building and the eager fp32 reference outputs"),
                 *self.notes, f"records: {out / 'results.jsonl'}"]
        if self.interrupted:
            lines.insert(0, "sweep interrupted: the points above are kept; rerun the same command to resume")
        return "\n".join(lines)


def finished_points(out: Path, machine: str | None = None) -> set[str]:
    """Points that have a record (on `machine`, when given: a fleet's folder holds several), but for those
    interrupted (Ctrl-C) before their measurement was done or lost with their node (drivers/fleet.py)."""
    return {r.point_id for r in res.records_in(out) if r.point_id and r.stop_reason not in ("interrupted", "node_lost")
            and (machine is None or r.machine in (None, machine))}


def point_env(point: Point, binding, base=None) -> dict:
    """The child's environment: threads, binding, allocator and runtime variables in place before it imports torch."""
    return child_env(point.threads, point.allocator, binding, base, point.env)


@dataclass
class Launch:
    """How one point's process is started: its argv, environment and binding (or why it cannot be)."""

    point: Point
    spec: object
    binding: object
    env: dict | None = None
    argv: list | None = None
    unsupported: str | None = None


def launch_of(point: Point, cfg: SweepConfig, out: Path, topology, numa_cpus=None, **extra) -> Launch:
    spec = point.spec
    instances = point.serving[2] if point.serving else 1
    cores = topology.pick_cpus(point.threads * instances, numa_cpus)      # LoadGen splits them among its instances
    binding = probe(plan(topology, cores))
    try:
        env = point_env(point, binding)
    except UnsupportedError as exc:
        return Launch(point, spec, binding, unsupported=str(exc))
    if point.serving:
        from .loadgen import serving_argv

        return Launch(point, spec, binding, env, serving_argv(point, cfg.serving, out))
    argv = run_argv(point.model, dict(point.shape), backend=point.backend, precision=point.precision,
                    batch_size=point.batch_size, threads=point.threads, timeout=cfg.timeout, output=out,
                    point_id=point.point_id, probe=cfg.probe, json=True, config_override=list(point.config) or None,
                    fpmath_mode=point.fpmath if point.fpmath != "strict" else None,
                    tune=cfg.tune, **_file_input_flags(point, cfg),
                    **_dataset_flags(point, cfg), **extra)
    return Launch(point, spec, binding, env, argv)


def _file_input_flags(point: Point, cfg: SweepConfig) -> dict:
    from ..models import is_path

    return {"input_shape": cfg.input_shape, "input_dtype": cfg.input_dtype} if is_path(point.model) else {}


def _dataset_flags(point: Point, cfg: SweepConfig) -> dict:
    if not point.dataset:
        return {}
    kind, path, labels = point.dataset
    return {"dataset": f"{kind}:{path}", "labels": labels, "num_samples": cfg.num_samples}


def status_of(launch: Launch, out: Path, start: int, outcome) -> str:
    """The status the point's process recorded (read from offset `start`), or a record of how it ended."""
    written = [r for r in res.records_in(out, start) if r.point_id == launch.point.point_id]
    if written:
        return written[-1].status
    status, reason, crash = failure_of(outcome)
    return _record(out, launch.point, launch.spec, "failed" if status == "unsupported" else status, reason,
                   launch.binding, crash)


def run_point(point: Point, cfg: SweepConfig, out: Path, topology, numa_cpus=None) -> str:
    """Run one point in its own bound process; return the status recorded for it."""
    launch = launch_of(point, cfg, out, topology, numa_cpus)
    if launch.unsupported:
        return _record(out, point, launch.spec, "unsupported", launch.unsupported, launch.binding)
    start = res.end_offset(out)       # read back only what this point appends, not the whole sweep again
    outcome = run_isolated(launch.argv, cfg.point_timeout, env=launch.env, prefix=launch.binding.prefix())
    return status_of(launch, out, start, outcome)


def run_taking_turns(points: list[Point], cfg: SweepConfig, out: Path, topology, numa_cpus=None):
    """Run `points` up to cfg.interleave at a time, their processes taking turns (drivers/turns.py); yield each
    point's status as its record is written. A group also stops growing while the memory left is less than
    what its largest process holds (plus a margin), so a machine smaller than the setting still runs. Ctrl-C
    stops every process that is measuring, so it writes what it has, then stops the sweep."""
    import psutil

    queue = list(points)
    while queue:
        takers = []
        try:
            while queue and len(takers) < cfg.interleave:
                largest = max((t.rss() for t in takers), default=0)
                if takers and psutil.virtual_memory().available < 1.5 * largest + MEMORY_MARGIN:
                    logger.info("sweep: %d point(s) taking turns: too little memory left for another", len(takers))
                    break
                # One at a time: each process prepares and warms up with the machine to itself.
                status, taker = _start_taker(queue.pop(0), cfg, out, topology, numa_cpus)
                if taker is None:
                    yield status
                else:
                    takers.append(taker)
            order = random.Random(ORDER_SEED)
            while waiting := [t for t in takers if t.alive and t.turns_left > 0]:
                order.shuffle(waiting)      # a new order each cycle: no point always follows the same one
                for taker in waiting:
                    time.sleep(ROUND_GAP_S)
                    taker.turn(cfg.point_timeout)
            while takers:                   # one record at a time, in the sweep's order
                yield _stop_taker(takers.pop(0), cfg, out)
        finally:
            for taker in takers:            # interrupted: whoever measured writes what it has, saying so
                _stop_taker(taker, cfg, out, interrupted=True)


MEMORY_MARGIN = 1 << 30      # bytes kept free beyond another process like the largest so far


def _start_taker(point: Point, cfg: SweepConfig, out: Path, topology, numa_cpus):
    """(status, None) if the point ended before it was ready (its record says why), else (None, Taker)."""
    launch = launch_of(point, cfg, out, topology, numa_cpus)
    if launch.unsupported:
        return _record(out, point, launch.spec, "unsupported", launch.unsupported, launch.binding), None
    taker = Taker.spawn(launch.argv, launch.env, launch.binding.prefix(), math.ceil(cfg.timeout / ROUND_S),
                        context=(launch, res.end_offset(out)))
    if taker.wait_ready(cfg.point_timeout):
        return None, taker
    return _stop_taker(taker, cfg, out), None


def _stop_taker(taker: Taker, cfg: SweepConfig, out: Path, interrupted: bool = False) -> str:
    launch, start = taker.context
    return status_of(launch, out, start, taker.stop(cfg.point_timeout, interrupted))


def _record(out, point: Point, spec, status: str, reason: str, binding, crash: dict | None = None) -> str:
    record_failure(out, spec, point.backend, point.precision, point.batch_size, point.threads,
                   spec.shape(**dict(point.shape)), status, reason, binding, point.point_id, point.allocator, crash,
                   fpmath=point.fpmath, settings=point.env)
    return status


def run_sweep(cfg: SweepConfig, quiet: bool = False) -> SweepSummary:
    """Run every point of the sweep that has no record yet; Ctrl-C stops after saying what is done. The output
    folder is held for the whole sweep (another sweep into it is refused)."""
    out = res.check_output_dir(cfg.output)
    with res.lock_output(out, f"a sweep of {', '.join(cfg.models)}"):
        return _run_sweep(cfg, out, quiet)


def _run_sweep(cfg: SweepConfig, out: Path, quiet: bool) -> SweepSummary:
    from tqdm import tqdm

    topology = read_topology()
    numa_cpus = numa_cpus_from_env()
    default_threads = topology.default_thread_counts()
    points = cfg.points(default_threads)
    for t in sorted({p.threads * (p.serving[2] if p.serving else 1) for p in points}):
        topology.pick_cpus(t, numa_cpus)         # too many threads for this machine: say so before running
    for mode in cfg.fpmath_modes:
        check_cpu(mode)                          # a fast-math mode this CPU cannot compute natively, likewise
    done = finished_points(out, machine_fingerprint(capture({"machine_cpus": machine_cpus()})))
    todo = [p for p in points if p.point_id not in done and p.legacy_point_id not in done]
    statuses: dict[str, int] = {}
    start = time.perf_counter()
    interrupted = None
    bar = tqdm(total=len(points), initial=len(points) - len(todo), unit="point", file=sys.stderr,
               disable=quiet or os.environ.get("CI", "").lower() in ("1", "true"), dynamic_ncols=True)
    try:
        if cfg.interleave > 1:
            bar.set_postfix_str(f"{cfg.interleave} points taking turns")
            logger.info("sweep: %d point(s), up to %d at a time taking turns", len(todo), cfg.interleave)
            for status in run_taking_turns(todo, cfg, out, topology, numa_cpus):
                statuses[status] = statuses.get(status, 0) + 1
                bar.update(1)
        else:
            for point in todo:
                bar.set_postfix_str(point.label)
                if bar.disable:
                    logger.info("sweep point %d/%d: %s", len(points) - len(todo) + sum(statuses.values()) + 1,
                                len(points), point.label)
                status = run_point(point, cfg, out, topology, numa_cpus)
                statuses[status] = statuses.get(status, 0) + 1
                bar.update(1)
    except KeyboardInterrupt as stop:
        interrupted = stop
    finally:
        bar.close()
    ids = {p.point_id for p in todo}
    mine = [r for r in res.records_in(out) if r.point_id in ids]
    summary = SweepSummary(len(points), len(points) - len(todo), statuses,
                           sum(r.prepare_s or 0 for r in mine),
                           sum((r.warmup or {}).get("seconds") or 0 for r in mine),
                           sum(r.measured_s or 0 for r in mine),
                           time.perf_counter() - start, interrupted)
    return summary
