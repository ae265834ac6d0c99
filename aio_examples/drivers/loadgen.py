"""Serving scenarios under MLPerf LoadGen (`mlperf_loadgen`, from the `mlcommons-loadgen` package).

LoadGen issues the queries; this process is its system under test (SUT) and query sample library (QSL).
The SUT is N instance processes x T threads on disjoint cores, started and bound as the multi-instance
throughput driver starts them, each preparing its one configuration and then serving passes
(measurement/scenarios/serve.py). One feeder thread per instance takes the samples LoadGen issued from a
shared queue, up to the batch size at a time, hands them to its instance and reports them complete to
LoadGen the moment the instance answers.

Scenarios (LoadGen's own): SingleStream (one sample a query, the next after it completes: p90 latency),
MultiStream (8 samples a query: p99 latency), Offline (every sample at once: throughput), Server (Poisson
arrivals at a target rate: p99 within a latency bound). LoadGen's logs are kept in a folder beside the
results and its verdict, with the reasons when INVALID, is in the record.
"""

import array
import functools
import math
import os
import re
import shutil
import socket
import tempfile
import threading
import time
from collections import deque
from dataclasses import asdict, dataclass, field
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Self

from ..core import records as res
from ..core.errors import SetupError, UsageError
from ..core.log import logger
from ..core.processes import Isolated
from ..machine.binding import plan, probe
from .worker import child_env, run_argv

SCENARIOS = ("SingleStream", "MultiStream", "Offline", "Server")
MODES = ("performance", "accuracy")
MULTISTREAM_SAMPLES = 8
# The percentile each scenario judges and the confidence of LoadGen's early stopping (its results.cc)
PERCENTILES = {"SingleStream": 0.90, "MultiStream": 0.99, "Server": 0.99}
EARLY_STOPPING_CONFIDENCE = 0.99
# Quick runs: LoadGen's minimum duration, and a query count its early stopping accepts with up to
# QUICK_MISSES queries over the bound (a shared machine's hiccup), as far as QUICK_BUDGET_S of queries at the
# scenario's pace allow, and never fewer than QUICK_MIN_MISSES (p99: 1307 queries absorb 5, 662 absorb 1).
# `--official` takes LoadGen's MLPerf settings instead (10 minutes).
QUICK_DURATION_S = 10.0
QUICK_MISSES, QUICK_MIN_MISSES, QUICK_BUDGET_S = 5, 1, 60.0
PEAK_TRIES = 2                      # a peak search tries a rate judged INVALID on a few misses again
BORDERLINE_MISSES = 0.05            # ... when at most this share of its queries missed the bound
DEFAULT_LATENCY_MS = 100.0
DEFAULT_TTFT_MS, DEFAULT_TPOT_MS = 2000.0, 200.0     # MLPerf's Llama 2 70B Server bounds, for text generators
PERFORMANCE_SAMPLES = 1024          # the QSL's size in performance mode (synthetic inputs: all alike)
# MLPerf's benchmark names for `--official` (its per-benchmark settings); other models take its defaults
MLPERF_NAMES = {"resnet_50_v1": "resnet50", "bert_base": "bert", "bert_large": "bert", "llama_3_2_1b": "llama3_1-8b"}
PREPARE_TIMEOUT_S = 900.0
OFFLINE_HEADROOM = 1.5            # Offline's expected rate over the probe passes' (see test_settings)

_REASONS = {"result_min_duration_met": "the run was shorter than the minimum duration",
            "result_min_queries_met": "fewer queries completed than the minimum query count",
            "result_perf_constraints_met": "the latency bound was not met at the target percentile",
            "early_stopping_met": "early stopping could not confirm the percentile with the queries run"}


@dataclass(frozen=True)
class ServingSettings:
    """What a user sets for one LoadGen run (flags), turned into LoadGen's TestSettings by `test_settings`."""

    scenario: str
    mode: str = "performance"
    duration_s: float = QUICK_DURATION_S
    min_queries: int | None = None
    target_qps: float | None = None            # Server: the Poisson arrival rate
    latency_ms: float | None = None            # Server: the p99 bound
    batch_timeout_ms: float = 5.0              # Server with a batch size > 1: how long a batch may wait to fill
    official: bool = False
    ttft_ms: float | None = None               # text generators, Server: the p99 bounds of MLPerf's LLM
    tpot_ms: float | None = None               # benchmarks on time to first token and time per output token

    def __post_init__(self):
        if self.scenario not in SCENARIOS:
            raise UsageError(f"--scenario {self.scenario!r} does not exist; accepted: {', '.join(SCENARIOS)}")
        if self.mode not in MODES:
            raise UsageError(f"--mode {self.mode!r} is invalid; accepted: {', '.join(MODES)}")
        for flag, value in (("--target-qps", self.target_qps), ("--latency-ms", self.latency_ms),
                            ("--duration", self.duration_s), ("--ttft-ms", self.ttft_ms), ("--tpot-ms", self.tpot_ms)):
            if value is not None and not (value > 0 and math.isfinite(value)):
                raise UsageError(f"{flag} {value!r} is invalid; accepted: a number > 0")
        if self.scenario == "Server" and self.target_qps is None:
            raise UsageError("--scenario Server needs --target-qps (queries per second), or --find-peak")

    @property
    def latency_bound_ms(self) -> float:
        return self.latency_ms if self.latency_ms is not None else DEFAULT_LATENCY_MS

    def record(self) -> dict:
        out = {k: v for k, v in asdict(self).items() if v is not None}
        if self.scenario == "Server":
            out["latency_ms"] = self.latency_bound_ms
        else:
            out.pop("batch_timeout_ms", None)
        return out


@functools.cache
def early_stopping_queries(misses: int, percentile: float) -> int:
    """The fewest queries with which LoadGen's early stopping confirms `percentile` when `misses` of them were
    over the bound: the smallest n for which at most `misses` misses would be as unlikely as 1 - confidence if
    the true miss rate were 1 - percentile (a one-sided binomial test, as LoadGen computes it)."""
    q = 1.0 - percentile
    n = misses + 1
    while True:
        log_terms = (math.lgamma(n + 1) - math.lgamma(i + 1) - math.lgamma(n - i + 1) + i * math.log(q)
                     + (n - i) * math.log1p(-q) for i in range(misses + 1))
        if sum(math.exp(t) for t in log_terms) <= 1.0 - EARLY_STOPPING_CONFIDENCE:
            return n
        n += 1


def absorbable_misses(queries: int, percentile: float) -> int | None:
    """How many over-bound queries a run of `queries` can have and still pass early stopping (None: not even
    one without misses)."""
    if queries < early_stopping_queries(0, percentile):
        return None
    misses = 0
    while early_stopping_queries(misses + 1, percentile) <= queries:
        misses += 1
    return misses


def quick_queries(scenario: str, query_s: float, duration_s: float = QUICK_DURATION_S) -> int:
    """A quick run's minimum query count: room for QUICK_MISSES over-bound queries when that many queries, one
    every `query_s` seconds, fit in QUICK_BUDGET_S (or the asked duration, when longer); less room when they do
    not, down to QUICK_MIN_MISSES."""
    if scenario == "Offline":
        return 1
    percentile, budget = PERCENTILES[scenario], max(QUICK_BUDGET_S, duration_s)
    misses = QUICK_MIN_MISSES
    while misses < QUICK_MISSES and early_stopping_queries(misses + 1, percentile) * query_s <= budget:
        misses += 1
    return early_stopping_queries(misses, percentile)


@dataclass
class _Instance:
    """One instance process of the system under test."""

    index: int
    cores: tuple
    binding: object
    child: Isolated
    conn: Connection | None = None
    facts: dict = field(default_factory=dict)


class _Queue:
    """The samples LoadGen issued and no instance has taken yet."""

    def __init__(self):
        self.items, self.cond, self.closed = deque(), threading.Condition(), False

    def put(self, samples) -> bool:
        """False once closed: the caller completes them itself."""
        with self.cond:
            if self.closed:
                return False
            self.items.extend(samples)
            self.cond.notify_all()
            return True

    def take(self, most: int, fill_s: float = 0.0) -> list:
        """Up to `most` samples, waiting for the first; with `fill_s`, up to that long for the batch to fill.
        Empty once closed."""
        with self.cond:
            while not self.items and not self.closed:
                self.cond.wait(0.1)
            if fill_s > 0 and len(self.items) < most:
                deadline = time.monotonic() + fill_s
                while len(self.items) < most and not self.closed and (left := deadline - time.monotonic()) > 0:
                    self.cond.wait(left)
            return [self.items.popleft() for _ in range(min(most, len(self.items)))]

    def close(self) -> list:
        with self.cond:
            self.closed = True
            left = list(self.items)
            self.items.clear()
            self.cond.notify_all()
            return left


class _SUT:
    """LoadGen's system under test over the instances for one test: one feeder thread per instance."""

    def __init__(self, lg, instances: list, batch_size: int, fill_s: float, answers: bool = False,
                 tokens: bool = False, cpus: tuple = ()):
        self.lg, self.batch_size, self.fill_s, self.answers, self.tokens = lg, batch_size, fill_s, answers, tokens
        self.cpus, self.ran_on = cpus, set()        # where LoadGen's and the feeders' threads run, read back
        self.queue = _Queue()
        self.failure: str | None = None
        self.lock = threading.Lock()
        self.passes = 0
        self.threads = [threading.Thread(target=self._feed, args=(i,), daemon=True) for i in instances]
        for t in self.threads:
            t.start()

    def issue_queries(self, samples) -> None:
        if self.failure or not self.queue.put(samples):     # nothing left to run them: complete so LoadGen ends
            self._complete(samples)

    def flush_queries(self) -> None:
        pass

    def _complete(self, samples, data: list | None = None, tokens: int | None = None) -> None:
        """Tell LoadGen these samples are done; with `data`, each one's answer (bytes LoadGen copies into its
        accuracy log during the call, so the buffers only have to live until it returns); with `tokens`, how
        many each generated."""
        if not samples:
            return
        if tokens is not None:
            self.lg.QuerySamplesComplete([self.lg.QuerySampleResponse(s.id, 0, 0, tokens) for s in samples])
            return
        if data is None:
            self.lg.QuerySamplesComplete([self.lg.QuerySampleResponse(s.id, 0, 0) for s in samples])
            return
        buffers = [array.array("B", d) for d in data]
        self.lg.QuerySamplesComplete([self.lg.QuerySampleResponse(s.id, *b.buffer_info())
                                      for s, b in zip(samples, buffers, strict=True)])

    def _feed(self, inst) -> None:
        self.ran_on.add(_bind_thread(self.cpus))
        while samples := self.queue.take(self.batch_size, self.fill_s):
            try:
                inst.conn.send(("samples", [s.index for s in samples]) if self.answers else ("run", len(samples)))
                answer = inst.conn.recv()
                if answer[0] == "first":             # a generator's first token: LoadGen's TTFT ends here
                    self.lg.FirstTokenComplete([self.lg.QuerySampleResponse(s.id, 0, 0) for s in samples])
                    answer = inst.conn.recv()
            except (EOFError, OSError):
                answer = ("error", "its process ended during the run")
            if answer[0] == "done":
                with self.lock:
                    self.passes += 1
                self._complete(samples, answer[2] if self.answers else None,
                               answer[2] if self.tokens and not self.answers else None)
            else:
                self.fail(f"instance {inst.index}: {answer[1]}")
                self._complete(samples)

    def fail(self, reason: str) -> None:
        """Stop running: every query queued now or issued later is completed unrun, so LoadGen ends."""
        with self.lock:
            if self.failure is None:
                self.failure = reason
                logger.warning("loadgen: %s; the remaining queries are completed unrun so LoadGen ends", reason)
        self._complete(self.queue.close())

    def stop(self) -> None:
        self._complete(self.queue.close())
        for t in self.threads:
            t.join(30)


def serving_key(scenario: str, target_qps: float | None) -> str:
    """The scenario part of a record's configuration key: a Server test at another rate measures another point
    of the latency curve, so the rate is in it; a peak search is `loadgen-server-peak`."""
    key = f"loadgen-{scenario.lower()}"
    if scenario != "Server":
        return key
    return f"{key}-{target_qps:g}qps" if target_qps else f"{key}-peak"


# A sweep's `serving` table (SweepConfig.serving): its keys and what each accepts
SERVING_KEYS = {"scenarios": "a list of " + ", ".join(SCENARIOS), "target_qps": "a list of rates > 0 (Server)",
                "instances": "a list of whole numbers >= 1", "latency_ms": "a number > 0",
                "duration": "seconds > 0", "min_queries": "a whole number >= 1", "find_peak": "true or false"}


def check_serving(table: dict, specs: list, batch_sizes: list) -> dict:
    """A sweep's serving table, checked as a whole (one line naming the bad value) and with its defaults."""
    if not isinstance(table, dict) or set(table) - set(SERVING_KEYS):
        bad = sorted(set(table) - set(SERVING_KEYS)) if isinstance(table, dict) else [table]
        raise UsageError(f"serving key {bad[0]!r} is unknown; accepted: {', '.join(SERVING_KEYS)}")
    out = {"scenarios": table.get("scenarios", ["Offline"]), "target_qps": table.get("target_qps"),
           "instances": table.get("instances", [1]), "latency_ms": table.get("latency_ms"),
           "duration": table.get("duration", QUICK_DURATION_S), "min_queries": table.get("min_queries"),
           "find_peak": table.get("find_peak", False)}

    def bad(key, value):
        return UsageError(f"serving.{key} {value!r} is invalid; accepted: {SERVING_KEYS[key]}")

    if not isinstance(out["scenarios"], list) or not out["scenarios"]:
        raise bad("scenarios", out["scenarios"])
    for key in ("target_qps", "instances"):
        values = out[key]
        if values is not None and (not isinstance(values, list) or not values or any(
                isinstance(v, bool) or not isinstance(v, (int, float)) or not 0 < v < math.inf for v in values)):
            raise bad(key, values)
    if any(not isinstance(n, int) for n in out["instances"]):
        raise bad("instances", out["instances"])
    if not isinstance(out["find_peak"], bool):
        raise bad("find_peak", out["find_peak"])
    if "Server" in out["scenarios"] and not out["target_qps"] and not out["find_peak"]:
        raise UsageError("serving.scenarios has Server but no serving.target_qps; accepted: a list of rates, "
                         "or find_peak = true")
    for scenario in out["scenarios"]:
        rates = (out["target_qps"] or [1.0]) if scenario == "Server" else [None]
        for rate in rates:        # each test's own checks, before anything runs
            settings = ServingSettings(scenario, duration_s=out["duration"], min_queries=out["min_queries"],
                                       target_qps=rate, latency_ms=out["latency_ms"])
            for spec in specs:
                for b in batch_sizes:
                    check_fits(spec, settings, b)
    return out


def serving_points(serving: dict) -> list[tuple]:
    """(scenario, rate or None, instances) of every LoadGen test a sweep's serving table asks for."""
    tests = []
    for scenario in serving["scenarios"]:
        rates = [None] if scenario != "Server" else ([None] if serving["find_peak"] else serving["target_qps"])
        tests += [(scenario, rate, n) for rate in rates for n in serving["instances"]]
    return tests


def serving_argv(point, serving: dict, out: Path) -> list[str]:
    """The `aio-examples loadgen` process of a sweep's point (its record stamped with the point's id)."""
    scenario, rate, instances = point.serving
    return run_argv(point.model, dict(point.shape), command="loadgen", scenario=scenario, backend=point.backend,
                    precision=point.precision, batch_size=point.batch_size, instances=instances,
                    threads_per_instance=point.threads, target_qps=rate,
                    find_peak=scenario == "Server" and rate is None, latency_ms=serving["latency_ms"],
                    duration=serving["duration"], min_queries=serving["min_queries"], allocator=point.allocator,
                    config_override=list(point.config) or None, output=out, point_id=point.point_id)


def query_s(settings: ServingSettings, pass_ms: float, instances: int, batch_size: int) -> float:
    """Seconds between a scenario's queries: the arrival interval of Server, one query's passes otherwise."""
    if settings.scenario == "Server":
        return 1.0 / settings.target_qps
    samples = MULTISTREAM_SAMPLES if settings.scenario == "MultiStream" else 1
    return pass_ms / 1000 * math.ceil(samples / (instances * batch_size))


def test_settings(lg, settings: ServingSettings, model: str, pass_ms: float, instances: int, batch_size: int,
                  tokens: bool = False):
    """LoadGen's TestSettings for `settings`; the expected latency and throughput from the instances' pass."""
    s = lg.TestSettings()
    s.scenario = getattr(lg.TestScenario, settings.scenario)
    if settings.official:
        s.FromConfig("", MLPERF_NAMES.get(model, model), settings.scenario, 0)     # LoadGen's built-in mlperf.conf
    else:
        s.min_duration_ms = int(settings.duration_s * 1000)
        pace = query_s(settings, pass_ms, instances, batch_size)
        s.min_query_count = settings.min_queries or quick_queries(settings.scenario, pace, settings.duration_s)
    s.mode = lg.TestMode.AccuracyOnly if settings.mode == "accuracy" else lg.TestMode.PerformanceOnly
    per_second = instances * batch_size / (pass_ms / 1000)
    s.single_stream_expected_latency_ns = int(pass_ms * 1e6)
    s.multi_stream_expected_latency_ns = int(query_s(ServingSettings("MultiStream"), pass_ms, instances, batch_size) * 1e9)
    # Offline issues 1.1 x expected rate x min duration samples in one query. Three probe passes on a busy
    # machine can take longer than the steady state: an underestimated rate ends the run before its
    # minimum duration (INVALID), an overestimated one only makes it longer.
    s.offline_expected_qps = per_second * OFFLINE_HEADROOM
    if settings.scenario == "Server":
        s.server_target_qps = settings.target_qps
        if settings.latency_ms is not None or not settings.official:
            s.server_target_latency_ns = int(settings.latency_bound_ms * 1e6)
    if tokens:                # MLPerf's LLM rules: TTFT and TPOT judged from the token timestamps
        s.use_token_latencies = True
        if settings.ttft_ms is not None or not settings.official:
            s.ttft_latency = int((settings.ttft_ms or DEFAULT_TTFT_MS) * 1e6)
        if settings.tpot_ms is not None or not settings.official:
            s.tpot_latency = int((settings.tpot_ms or DEFAULT_TPOT_MS) * 1e6)
    return s


def parse_detail(path: Path) -> dict:
    """key -> value of LoadGen's detail log (`:::MLLOG {json}` lines; the last value of a key wins)."""
    import json

    out = {}
    for line in Path(path).read_text(errors="replace").splitlines():
        if line.startswith(":::MLLOG"):
            try:
                entry = json.loads(line.split(" ", 1)[1])
            except (ValueError, IndexError):
                continue
            out[entry.get("key")] = entry.get("value")
    return out


def verdict(scenario: str, log: dict) -> dict:
    """LoadGen's result: VALID/INVALID, the reasons in plain words, and the scenario's figures."""
    valid = log.get("result_validity") == "VALID"
    reasons = [text for key, text in _REASONS.items() if log.get(key) is False]
    if str(log.get("result_invalid_reason") or "").strip():          # LoadGen's own advice, e.g. reduce the rate
        reasons.append(str(log["result_invalid_reason"]).strip())
    if not valid and not reasons:
        reasons.append("LoadGen judged the run INVALID (see mlperf_log_summary.txt)")
    stopping = [" ".join(str(log.get(k, "")).split()) for k in
                ("early_stopping_result", "early_stopping_ttft_result", "early_stopping_tpot_result")]
    out = {"validity": "VALID" if valid else "INVALID", "reasons": reasons,
           "queries": log.get("result_query_count"), "early_stopping": " ".join(x for x in stopping if x) or None}
    if scenario in PERCENTILES and isinstance(out["queries"], int):
        # Server: queries over the bound the run could have had and stayed VALID; Single/MultiStream: the
        # slowest queries that do not set its early-stopping latency
        out["absorbable_misses"] = absorbable_misses(out["queries"], PERCENTILES[scenario])
    if isinstance(log.get("result_overlatency_query_count"), int):
        out["overlatency_queries"] = log["result_overlatency_query_count"]
    out["latency_ms"] = _percentiles(log, r"result_(\d+\.\d+)_percentile_latency_ns")
    for key in ("result_mean_latency_ns", "result_min_latency_ns", "result_max_latency_ns"):
        if isinstance(log.get(key), (int, float)):
            out["latency_ms"][key.split("_")[1]] = log[key] / 1e6
    ttft = _percentiles(log, r"result_first_token_(\d+\.\d+)_percentile_latency_ns")
    if ttft:              # a text generator under MLPerf's token-latency rules
        out["ttft_ms"] = ttft
        out["tpot_ms"] = _percentiles(log, r"result_time_per_output_token_(\d+\.\d+)_percentile_ns")
        out["tokens_per_s"] = log.get("result_completed_tokens_per_second")
    if scenario == "Offline":
        out["samples_per_s"] = log.get("result_samples_per_second")
    elif scenario == "Server":
        out["samples_per_s"] = log.get("result_completed_samples_per_sec")
        out["scheduled_per_s"] = log.get("result_scheduled_samples_per_sec")
    else:
        out["samples_per_s"] = log.get("result_qps_with_loadgen_overhead")
        if scenario == "SingleStream" and log.get("early_stopping_latency_ss"):
            out["early_stopping_latency_ms"] = log["early_stopping_latency_ss"] / 1e6
        if scenario == "MultiStream" and log.get("early_stopping_latency_ms"):
            out["early_stopping_latency_ms"] = log["early_stopping_latency_ms"] / 1e6
    return out


def _percentiles(log: dict, pattern: str) -> dict:
    """{"p90": ms, ...} of the detail log's keys matching `pattern` (its group: the percentile)."""
    found = {}
    for key, value in log.items():
        match = re.fullmatch(pattern, key or "")
        if match and isinstance(value, (int, float)):
            found[float(match.group(1))] = value / 1e6
    return {f"p{p:g}": found[p] for p in sorted(found)}


def check_fits(spec, settings: ServingSettings, batch_size: int) -> None:
    """A scenario the model or the batch size cannot take: one line, before anything starts."""
    from ..models.base import is_generator

    if is_generator(spec.task):
        if settings.scenario == "MultiStream":
            raise UsageError(f"{spec.name} generates text, and MultiStream is not a scenario of MLPerf's generation "
                             "benchmarks; accepted: SingleStream, Offline or Server")
        if settings.mode == "accuracy":
            raise UsageError(f"--mode accuracy for {spec.name}: its datasets score generation its own way "
                             "(aio-examples run --dataset); accepted: --mode performance under LoadGen")
    elif settings.ttft_ms is not None or settings.tpot_ms is not None:
        raise UsageError(f"--ttft-ms and --tpot-ms bound token latencies, and {spec.name} does not generate text; "
                         "accepted: --latency-ms")
    if settings.scenario == "SingleStream" and batch_size != 1:
        raise UsageError(f"-b {batch_size} does not fit SingleStream (one sample a query); accepted: -b 1")
    if settings.scenario == "MultiStream" and batch_size > MULTISTREAM_SAMPLES:
        raise UsageError(f"-b {batch_size} is larger than a MultiStream query ({MULTISTREAM_SAMPLES} samples); "
                         f"accepted: -b 1 to {MULTISTREAM_SAMPLES}")


class Session:
    """N instance processes x T threads, prepared once, serving any number of LoadGen tests in turn (a peak
    search runs many). Records are appended when the session ends: each instance writes its own (what it
    ran: precision mode, strategy, backend details, peak memory) as it exits, and every test's record takes
    them in."""

    def __init__(self, model: str, backend: str, precision: str, batch_size: int, instances: int,
                 threads_per_instance: int, out: Path, shape: dict | None = None, allocator: str = "default",
                 numa_cpus=None, config: list | None = None, prepare_timeout_s: float = PREPARE_TIMEOUT_S,
                 point_id: str | None = None, run_flags: dict | None = None):
        from ..machine.topology import read_topology
        from ..models import get_model

        try:                      # before any instance starts
            import mlperf_loadgen  # noqa: F401
        except ImportError as exc:
            raise SetupError(f"the serving scenarios need MLPerf LoadGen, which cannot be imported ({exc}): pip install "
                             "-c constraints.txt mlcommons-loadgen (on aarch64 it builds from source with g++ and "
                             "Python's headers; setup.sh does)") from None
        self.model, self.backend, self.precision, self.batch_size = model, backend, precision, batch_size
        self.instances, self.threads, self.out = instances, threads_per_instance, Path(out)
        self.shape, self.allocator, self.config = dict(shape or {}), allocator, list(config or [])
        self.spec = get_model(model).with_config(self.config or None)
        self.topology = read_topology()
        self.cpu_sets = self.topology.disjoint_cpu_sets(instances, threads_per_instance, numa_cpus)
        # LoadGen's issuing thread and the feeders on cores no instance uses, when the layout leaves one
        self.loadgen_cpus = self.topology.spare_cpus(c for cpus in self.cpu_sets for c in cpus)
        self.prepare_timeout_s, self.point_id = prepare_timeout_s, point_id
        # flags each instance's run gets as they are: weights, model folder, dataset, labels, samples
        self.run_flags = {k: v for k, v in (run_flags or {}).items() if v is not None}
        self.group = res.new_run_id()
        self.folder = self.out / "loadgen" / self.group
        self.members: list[_Instance] = []
        self.failure: str | None = None
        self.pass_ms: float | None = None
        self.ttft_ms: float | None = None
        self.pending: list[tuple] = []     # (record, settings, logs, failure, passes, peak summary or None)

    def __enter__(self) -> Self:
        (self.folder / "instances").mkdir(parents=True, exist_ok=True)
        self.scratch = Path(tempfile.mkdtemp(prefix="aio-loadgen-"))
        address = str(self.scratch / "sut.sock")
        self.server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.server.bind(address)
        self.server.listen(self.instances)
        self.server.settimeout(0.2)
        try:
            for index, cores in enumerate(self.cpu_sets):
                binding = probe(plan(self.topology, cores))
                argv = run_argv(self.model, self.shape, backend=self.backend, precision=self.precision,
                                batch_size=self.batch_size, threads=self.threads, timeout=60,
                                output=self.folder / "instances", json=True, instance=f"{index}/{self.instances}",
                                serve=address, group=self.group, config_override=self.config or None,
                                point_id=f"{self.group}-{index}", **self.run_flags)
                child = Isolated(argv, env=child_env(self.threads, self.allocator, binding), prefix=binding.prefix())
                self.members.append(_Instance(index, cores, binding, child))
            self.failure = _connect(self.server, self.members, self.prepare_timeout_s)
        except BaseException:
            self._kill()
            raise
        if self.failure is None:
            self.pass_ms = max(m.facts["pass_ms"] for m in self.members)
            # a text generator's first token (its instances report one): judged on tokens, not whole passes
            self.ttft_ms = self.members[0].facts.get("ttft_ms")
        return self

    def run(self, settings: ServingSettings) -> dict | None:
        """One LoadGen test; its result (None when the instances failed), its record kept for the end."""
        import mlperf_loadgen as lg

        check_fits(self.spec, settings, self.batch_size)
        logs = self.folder / f"{len(self.pending) + 1:02d}-{settings.scenario}-{settings.mode}"
        logs.mkdir(parents=True, exist_ok=True)
        if self.failure is not None:
            self.pending.append((self._blank(settings), settings, logs, self.failure, 0, None))
            return None
        if settings.scenario == "Server" and self.ttft_ms is None and settings.latency_bound_ms < self.pass_ms:
            raise UsageError(f"--latency-ms {settings.latency_bound_ms:g} can never be met: one pass of {self.model} "
                             f"{self.backend}/{self.precision} b{self.batch_size} takes {self.pass_ms:.1f} ms here; "
                             f"accepted: a bound above {self.pass_ms:.1f} ms")
        accuracy = settings.mode == "accuracy"
        samples = self.members[0].facts.get("samples") if accuracy else PERFORMANCE_SAMPLES
        if accuracy and not samples:
            raise UsageError(f"--mode accuracy scores the served answers on a labelled dataset, and {self.model} "
                             "was given none; accepted: --dataset KIND:PATH (or the kind's environment variable, "
                             "docs/datasets.md)")
        fill_s = settings.batch_timeout_ms / 1000 if settings.scenario == "Server" and self.batch_size > 1 else 0.0
        tokens = self.ttft_ms is not None
        if tokens and settings.ttft_ms is not None and settings.ttft_ms < self.ttft_ms:
            raise UsageError(f"--ttft-ms {settings.ttft_ms:g} can never be met: the first token of {self.model} "
                             f"{self.backend}/{self.precision} takes {self.ttft_ms:.1f} ms here; "
                             f"accepted: a bound above it")
        sut = _SUT(lg, self.members, self.batch_size, fill_s, answers=accuracy, tokens=tokens, cpus=self.loadgen_cpus)
        ts = test_settings(lg, settings, self.model, self.pass_ms, self.instances, self.batch_size, tokens)
        logger.info("loadgen: %s %s on %d instance(s) x %d thread(s)%s", settings.scenario, settings.mode,
                    self.instances, self.threads,
                    f" at {settings.target_qps:g} queries/s" if settings.scenario == "Server" else "")
        try:
            _start_test(lg, sut, ts, logs, samples)
        finally:
            sut.stop()
        self.failure = sut.failure
        record = self._blank(settings)
        ran_on = sorted({c for cpus in sut.ran_on for c in cpus})
        record.instance = {"loadgen_threads": {
            "cpus": ran_on, "spare_cores": bool(self.loadgen_cpus),
            **({} if self.loadgen_cpus else {"note": "every core runs an instance: LoadGen's threads share them"})}}
        if accuracy and sut.failure is None:
            record.accuracy = self._score(logs / "mlperf_log_accuracy.json")
        self.pending.append((record, settings, logs, self.failure, sut.passes, None))
        detail = logs / "mlperf_log_detail.txt"
        if sut.failure is None and detail.exists():
            return verdict(settings.scenario, parse_detail(detail))
        return None

    def _score(self, accuracy_log: Path) -> dict | None:
        """The first instance scores the answers LoadGen logged (the dataset and the model are its)."""
        conn = self.members[0].conn
        try:
            conn.send(("score", str(accuracy_log)))
            answer = conn.recv()
        except (EOFError, OSError):
            answer = ("error", "its process ended while scoring")
        if answer[0] != "scored":
            self.failure = f"instance 0: {answer[1]}"
            return None
        return answer[1]

    def _blank(self, settings: ServingSettings) -> res.Result:
        r = res.Result.for_config(self.spec, self.backend, self.precision, self.batch_size, self.threads,
                                  self.spec.shape(**self.shape), instances=self.instances,
                                  point_id=f"{self.group}-{len(self.pending) + 1}")
        r.scenario = {"name": "loadgen", "key": serving_key(settings.scenario, settings.target_qps),
                      **settings.record()}
        if self.ttft_ms is not None and settings.scenario == "Server":
            # a text generator is judged on its token latencies: those bounds, not a whole-query one
            r.scenario.pop("latency_ms", None)
            r.scenario.update(ttft_ms=settings.ttft_ms or DEFAULT_TTFT_MS, tpot_ms=settings.tpot_ms or DEFAULT_TPOT_MS)
        return r

    def __exit__(self, *exc) -> None:
        try:
            for m in self.members:
                if m.conn is not None:
                    try:
                        m.conn.send(("stop",))
                    except OSError:
                        pass
            for m in self.members:
                m.child.wait(None if exc[0] is None else 5)
        finally:
            self._kill()
            self.server.close()
            shutil.rmtree(self.scratch, ignore_errors=True)
        own = res.records_in(self.folder / "instances")
        if self.point_id and self.pending:      # a sweep's point: its answer (the test, or the peak) carries its id
            self.pending[-1][0].point_id = self.point_id
        for record, settings, logs, failure, passes, peak in self.pending:
            _complete_record(record, settings, self.members, own, logs, self.out, failure, passes, peak)
            res.append(self.out, record)
        self.records = [p[0] for p in self.pending]

    def _kill(self) -> None:
        for m in self.members:
            m.child.kill()


def find_peak(session: Session, latency_ms: float | None = None, duration_s: float = QUICK_DURATION_S,
              min_queries: int | None = None, official: bool = False, max_runs: int = 8,
              tolerance: float = 0.05, ttft_ms: float | None = None, tpot_ms: float | None = None,
              tries: int = PEAK_TRIES) -> dict:
    """The highest Server rate LoadGen judges VALID under the latency bound: Offline throughput first, then
    a bisection between 0 and it, each step a real LoadGen Server test, until the bracket is within
    `tolerance` of its top or `max_runs` rates were tried. Offline throughput is one measurement of a
    noisy machine, not a ceiling: when the Server test at the top is VALID, the search steps above it
    (by twice the tolerance) until a rate is INVALID, so a slow Offline moment does not cap the answer.
    A rate judged INVALID with few queries over the bound (a hiccup, not a queue that grows) is tried
    again, up to `tries` times, and VALID when one try is. The summary is a record of its own (scenario
    `loadgen-server-peak`) beside each test's."""
    common = {"duration_s": duration_s, "official": official}
    offline = session.run(ServingSettings("Offline", **common))
    summary = {"latency_bound_ms": latency_ms or DEFAULT_LATENCY_MS, "runs": [], "peak_qps": None, "tries": tries}
    if offline is None:
        summary["reason"] = f"the Offline run failed: {session.failure}"
    else:
        low, high = 0.0, float(offline["samples_per_s"])
        summary["offline_qps"] = high
        target, capped = high, False        # capped: `high` is a rate judged INVALID, not the Offline guess
        for _ in range(max_runs):
            settings = ServingSettings("Server", target_qps=round(target, 3), latency_ms=latency_ms,
                                       min_queries=min_queries, ttft_ms=ttft_ms, tpot_ms=tpot_ms, **common)
            taken = []
            while len(taken) < tries:
                result = session.run(settings)
                if result is None:
                    break
                taken.append({"validity": result["validity"], "p99_ms": result["latency_ms"].get("p99"),
                              "queries": result.get("queries"), "overlatency_queries": result.get("overlatency_queries"),
                              "reasons": result["reasons"]})
                if result["validity"] == "VALID" or not _borderline(result):
                    break
            if result is None:
                summary["reason"] = f"a Server run failed: {session.failure}"
                break
            valid = any(t["validity"] == "VALID" for t in taken)
            last = taken[-1]
            summary["runs"].append({"target_qps": settings.target_qps, "validity": "VALID" if valid else "INVALID",
                                    "p99_ms": last["p99_ms"], "reasons": [] if valid else last["reasons"],
                                    "tries": taken})
            if valid:
                low = settings.target_qps
            else:
                high, capped = settings.target_qps, True
            if not capped:                  # every rate so far VALID, the top one included: look above it
                high = target = low * (1 + 2 * tolerance)
                continue
            if high - low <= tolerance * high:
                break
            target = (low + high) / 2
        summary["peak_qps"] = low or None
        summary.setdefault("reason", None if low else
                           f"no Server rate tried was VALID under {summary['latency_bound_ms']:g} ms "
                           f"(lowest tried {min((r['target_qps'] for r in summary['runs']), default=0):g}/s)")
        summary["bracket_qps"] = [low, high if capped else None]
    blank = session._blank(ServingSettings("Server", target_qps=1.0, latency_ms=latency_ms, **common))
    blank.scenario = {"name": "loadgen", "key": serving_key("Server", None), "scenario": "Server",
                      "latency_ms": summary["latency_bound_ms"], **common}
    session.pending.append((blank, None, session.folder, session.failure if summary["peak_qps"] is None else None,
                            0, summary))
    return summary


def _borderline(result: dict) -> bool:
    """An INVALID Server test that a few slow queries decided: at most BORDERLINE_MISSES of its queries over the
    bound (a rate the instances cannot keep up with queues, and nearly every query misses)."""
    misses, queries = result.get("overlatency_queries"), result.get("queries")
    return isinstance(misses, int) and bool(queries) and misses <= BORDERLINE_MISSES * queries


def _connect(server, members: list, timeout_s: float):
    """Accept every instance's connection and its "ready" (after it prepared and warmed up); an instance
    that ends or fails first ends the session."""
    deadline = time.monotonic() + timeout_s
    waiting = {m.index: m for m in members}
    pending = []
    while waiting and time.monotonic() < deadline:
        try:
            sock, _ = server.accept()
            sock.settimeout(None)
            pending.append(Connection(sock.detach()))
        except TimeoutError:
            pass
        for conn in list(pending):
            if conn.poll(0):
                message = conn.recv()
                pending.remove(conn)
                if message[0] != "ready":
                    return f"an instance did not prepare: {message[1]}"
                member = waiting.pop(message[1]["index"])
                member.conn, member.facts = conn, message[1]
        for m in list(waiting.values()):
            if m.child.proc.poll() is not None:
                return f"instance {m.index} ended before serving (exit code {m.child.proc.returncode})"
    if waiting:
        return f"instances {sorted(waiting)} not ready after {timeout_s:.0f} s"
    return None


def _bind_thread(cpus: tuple) -> tuple[int, ...]:
    """Bind the calling thread, and the threads it starts, to `cpus` (none: leave it); where it may run now."""
    if cpus:
        os.sched_setaffinity(0, cpus)          # pid 0: the calling thread only
    return tuple(sorted(os.sched_getaffinity(0)))


def _start_test(lg, sut: _SUT, ts, logs: Path, samples: int) -> None:
    """LoadGen's test, in a thread of its own (bound with the feeders, so its issuing thread too), so Ctrl-C
    reaches this one: then the queued and later queries are completed unrun and LoadGen ends, leaving no
    thread behind."""
    handle = lg.ConstructSUT(sut.issue_queries, sut.flush_queries)
    qsl = lg.ConstructQSL(samples, samples, lambda indices: None, lambda indices: None)
    log_settings = lg.LogSettings()
    log_settings.log_output.outdir = str(logs)
    log_settings.log_output.copy_summary_to_stdout = False

    def test_thread():
        sut.ran_on.add(_bind_thread(sut.cpus))
        lg.StartTestWithLogSettings(handle, qsl, ts, log_settings)

    test = threading.Thread(target=test_thread, daemon=True)
    test.start()
    try:
        while test.is_alive():
            test.join(0.2)
    except KeyboardInterrupt:
        sut.fail("interrupted (Ctrl-C)")
        test.join()
        raise
    finally:
        if not test.is_alive():
            lg.DestroyQSL(qsl)
            lg.DestroySUT(handle)


def _complete_record(record: res.Result, settings: ServingSettings, members, own, logs: Path, out: Path,
                     failure, passes: int, peak: dict | None = None) -> None:
    record.instance = {"layout": [{"index": m.index, "cores": list(m.cores), "binding": m.binding.method,
                                   "pass_ms": m.facts.get("pass_ms")} for m in members],
                       "loadgen_logs": str(logs.relative_to(out)),       # beside results.jsonl
                       **(record.instance or {})}                        # where LoadGen's threads ran
    record.warnings = [w for m in members for w in m.binding.warnings]
    if own:
        first = own[0]
        record.precision_mode, record.strategy, record.backend_info = first.precision_mode, first.strategy, first.backend_info
        record.weights, record.env, record.check = first.weights, first.env, first.check
        record.dataset = first.dataset
        record.peak_rss_mb = max((r.peak_rss_mb or 0) for r in own) or None
        not_ok = [r for r in own if r.status != "ok"]
        if not_ok:          # an instance's own answer (unsupported, failed) says more than how it ended
            failure = f"instance {not_ok[0].instance.get('index')}: {not_ok[0].reason}"
            record.status = not_ok[0].status
    if peak is not None:               # a peak search's summary: the runs it took are records of their own
        record.metrics = {"loadgen": peak}
        if peak.get("peak_qps") is None and failure is None:
            failure = peak["reason"]
        if failure is not None:
            record.status, record.reason = (record.status if record.status != "ok" else "failed"), failure
        else:
            record.throughput = {"value": peak["peak_qps"], "unit": "queries/s"}
        return
    detail = logs / "mlperf_log_detail.txt"
    if failure is None and not detail.exists():
        failure = "LoadGen wrote no detail log"
    if failure is not None:
        record.status = record.status if record.status != "ok" else "failed"
        record.reason = failure
        logger.warning("loadgen: %s", failure)
    if not detail.exists():
        return
    result = verdict(settings.scenario, parse_detail(detail))
    result["passes"] = passes
    record.metrics = {"loadgen": result}
    if failure is None:
        record.throughput = {"value": result.get("samples_per_s"), "unit": "samples/s"}
        pct = result["latency_ms"]
        record.latency_ms = {"median": pct.get("p50"), "p90": pct.get("p90"), "p99": pct.get("p99"),
                             "mean": pct.get("mean")}
