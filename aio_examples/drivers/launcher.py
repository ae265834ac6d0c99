"""Each configuration of a run in a process of its own, measured in interleaved rounds across the processes.

A native crash in one engine (a segfault, an illegal instruction, an abort), the OOM killer, or a hang kills only
the process of that configuration: it becomes a record with status `crashed` (or `timeout`), the signal and the
last lines of its stderr, and the run's other configurations are measured and recorded as usual. Each process
also gives back its memory when it ends, so a notebook or a script calling `benchmark()` again and again does
not grow.

The processes are started one at a time (each prepares and warms up with the machine to itself), then this
driver hands out the interleaved rounds that `measurement.timing.measure` runs in one process: a new seeded
order every round, each round under the configuration's own stop rule, a configuration done at its confidence
target kept in the rounds while another still runs (measurement/scenarios/turns.py is the process's side).
When the processes would not fit in memory together (the estimate that refuses an oversized run), they are
measured in groups, one group after another, and each record says which configurations shared its rounds.
"""

import contextlib
import os
import random
import signal
import tempfile
from dataclasses import dataclass
from pathlib import Path

from ..backends import crashes
from ..core import interrupts
from ..core import records as res
from ..core.errors import PROG, AioError, UsageError
from ..core.log import logger
from ..measurement.timing import ORDER_SEED, ROUND_S
from .turns import Taker
from .worker import failure_of, record_failure

# How long a configuration's process may take before it is killed as hung: to prepare and warm up (aio's
# tuning, a compile, an export), for one round (a round is at least one pass: a whole generation), and to
# write its record once told to stop (accuracy on a dataset and profiles run then).
PREPARE_TIMEOUT_S = 3600.0
ROUND_TIMEOUT_S = 600.0
STOP_TIMEOUT_S = 3600.0
ERROR_LINE = f"{PROG}: error: "      # a process's one-line usage error: said by this driver instead
PROCESS_BYTES = 600 << 20       # a process with torch and the libraries loaded, before the model
MEMORY_MARGIN = 1 << 30         # left free beside the estimates


@dataclass
class Config:
    """One configuration of the run: what its process is started with, and what its record needs."""

    backend: str
    precision: str
    memory: float = 0.0          # bytes its process is estimated to hold
    fpmath: str = "strict"       # fp32's fast-math mode (core/precision.py): set in its process only

    @property
    def label(self) -> str:
        return f"{self.backend}/{self.precision}" + (f" fpmath {self.fpmath}" if self.fpmath != "strict" else "")

    @property
    def identity(self) -> tuple:
        """What tells its record from the others' of the run."""
        return self.backend, self.precision, self.fpmath

    @property
    def is_reference(self) -> bool:
        """Eager fp32 strict: the speedups' reference."""
        return self.identity == ("eager", "fp32", "strict")


def identity(record: res.Result) -> tuple:
    return record.backend, record.precision, record.fpmath_mode


@dataclass
class Run:
    """What every configuration's process shares: the worker's argv without backend, precision and fast-math
    mode, and what a record of a process that died needs (spec, batch, threads, shape)."""

    argv: list
    spec: object
    batch_size: int
    threads: int
    shape: dict
    run_id: str
    timeout_s: float             # measured seconds per configuration (the stop rule's)


def configs_of(spec, backends: list[str], precisions: list[str], batch_size: int, shape: dict,
               reference: bool, fpmath_modes=("strict",)) -> list[Config]:
    """The run's configurations (eager fp32 strict first when it is the run's `reference` and not asked for):
    each backend at each precision, fp32 in each fast-math mode (core/precision.fpmath_configs), each with the
    memory its process is estimated to hold: the libraries, the built model and a pass, its own copy."""
    from ..backends import get_backend
    from ..core.precision import fpmath_configs
    from ..models import is_generator

    triples = [(b, p, m) for p, m in fpmath_configs(precisions, list(fpmath_modes)) for b in backends]
    if reference and ("eager", "fp32", "strict") not in triples:
        triples.insert(0, ("eager", "fp32", "strict"))
    weights, generator = spec.weight_bytes(), is_generator(spec.task)
    base = PROCESS_BYTES + spec.memory_estimate(batch_size, shape) + weights
    return [Config(b, p, base + (0 if (b, p) == ("eager", "fp32") else
                                 get_backend(b).memory_estimate(weights, p, generator)), m) for b, p, m in triples]


def groups(configs: list[Config], available: float) -> list[list[Config]]:
    """Configurations in the order given, cut into groups whose processes fit in `available` bytes together; a
    configuration too large even alone gets a group of its own (its process refuses it, saying why)."""
    out, used = [[]], 0.0
    for c in configs:
        if out[-1] and used + c.memory > available:
            out.append([])
            used = 0.0
        out[-1].append(c)
        used += c.memory
    return out


def run_configs(run: Run, configs: list[Config], out_dir: Path | None, echo: bool = True) -> list[res.Result]:
    """Prepare and measure every configuration in its own process, taking turns; return their records in the
    order given (each appended to `out_dir` by its process, or here for one that died). Ctrl-C (or SIGTERM) stops
    every process, which writes what it measured, then KeyboardInterrupt is raised."""
    import psutil

    with tempfile.TemporaryDirectory(prefix="aio-run-") as scratch:
        out = Path(out_dir) if out_dir is not None else Path(scratch)
        start = res.end_offset(out)
        parts = groups(configs, psutil.virtual_memory().available - MEMORY_MARGIN)
        if len(parts) > 1:
            logger.info("the %d configurations would not fit in memory together: measured in %d groups, one after "
                        "another (%s)", len(configs), len(parts),
                        "; ".join(", ".join(c.label for c in g) for g in parts))
        reference_ms = None
        for number, group in enumerate(parts, 1):
            reference_ms = _run_group(run, group, out, start, (number, len(parts)), reference_ms, echo,
                                      Path(scratch))
        mine = {identity(r): r for r in res.records_in(out, start) if r.run_id == run.run_id}
    return [mine[c.identity] for c in configs if c.identity in mine]


def _run_group(run: Run, group: list[Config], out: Path, since: int, place: tuple, reference_ms: float | None,
               echo: bool, scratch: Path) -> float | None:
    """Start the group's processes one at a time, hand out rounds until every one is done, stop them (eager fp32
    first, so the others learn its median): the eager fp32 median, if this group measured it."""
    takers = []
    try:
        with interrupts.stop_on_signals():
            for config in group:
                taker = _start(run, config, out, since, echo, scratch)
                if taker is not None:
                    takers.append(taker)
            _rounds(takers, run.timeout_s)
            shared = {"processes": "one per configuration", "with": [t.context.label for t in takers],
                      **({"group": list(place)} if place[1] > 1 else {})}
            takers.sort(key=lambda t: not t.context.is_reference)
            while takers:
                taker = takers.pop(0)
                told = {"rounds": shared, **({"reference_ms": reference_ms} if reference_ms else {})}
                record = _finish(run, taker, out, since, "measuring" if taker.alive else "measuring (no answer)", told)
                if taker.context.is_reference and record is not None and record.status == "ok":
                    reference_ms = record.median_ms
    finally:
        for taker in takers:         # interrupted: whoever measured writes what it has, saying so
            _finish(run, taker, out, since, "measuring", {}, interrupted=True)
    return reference_ms


def _start(run: Run, config: Config, out: Path, since: int, echo: bool, scratch: Path) -> Taker | None:
    """The configuration's process, prepared and warmed up (None: it ended, and its record says why). A process
    that crashed while aio tried a candidate (its journal says which: backends/crashes.py) is started once more:
    aio then leaves that candidate out, and its record says why; so is the next, up to MAX_ATTEMPTS in all."""
    argv = [*run.argv, "--backend", config.backend, "-p", config.precision, "--fpmath-mode", config.fpmath,
            "--output", str(out), "--run-id", run.run_id]
    for attempt in range(1, MAX_ATTEMPTS + 1):
        journal = scratch / f"{'-'.join(config.identity)}-{attempt}.journal"
        logger.debug("%s: starting its process", config.label)
        taker = Taker.spawn(argv, {**os.environ, crashes.JOURNAL_ENV: str(journal)}, None, 0, context=config,
                            echo=echo, flag="--rounds", hold=ERROR_LINE.encode())
        if taker.wait_ready(PREPARE_TIMEOUT_S):
            return taker
        # it ended (a refusal, a failure: its record says why) or crashed preparing
        if _finish(run, taker, out, since, "preparing", {}, journal=journal, retry=attempt < MAX_ATTEMPTS) != RETRY:
            return None
    return None


RETRY = "retry"
MAX_ATTEMPTS = 4        # a process that crashed on a new candidate each time: compiled, ONNX Runtime, OpenVINO


def _rounds(takers: list[Taker], timeout_s: float) -> None:
    """The interleaved rounds of measurement.timing.measure, each handed to a process: a configuration not done
    runs a round under its stop rule; one done at its confidence target is kept in the rounds while another is
    not done and its own timeout leaves room. One alone runs to its end in one go."""
    seconds = ROUND_S if len(takers) > 1 else float("inf")
    order, shuffle = list(takers), random.Random(ORDER_SEED).shuffle
    for t in takers:
        t.state = {"done": False}
    while pending := [t for t in takers if t.alive and not t.state["done"]]:
        for t in order:
            if not t.alive:
                continue
            keep = (t.state["done"] and t.state.get("stop_reason") == "confidence"
                    and t.state.get("measured_s", 0) < timeout_s and any(p is not t for p in pending))
            if not t.state["done"] or keep:
                t.turn(ROUND_TIMEOUT_S + min(seconds, timeout_s), seconds, keep)
        shuffle(order)


def _finish(run: Run, taker: Taker, out: Path, since: int, phase: str, told: dict, interrupted: bool = False,
            journal: Path | None = None, retry: bool = False):
    """Stop a configuration's process and wait for its record (in what the run appended to `out` after offset
    `since`); one that died without writing it gets one saying how (crashed, timeout): that record, or None.
    A crash whose `journal` names a candidate is remembered; with `retry` the answer is then RETRY, no record."""
    config = taker.context
    if interrupted:      # mid-round it reads no pipe: Ctrl-C reaches it as it would a run of its own
        with contextlib.suppress(ProcessLookupError):
            os.killpg(taker.proc.proc.pid, signal.SIGINT)
    outcome = taker.stop(STOP_TIMEOUT_S, interrupted=interrupted, told=told)
    written = [r for r in res.records_in(out, since) if r.run_id == run.run_id and identity(r) == config.identity]
    stopped = outcome.returncode in (130, 143)       # Ctrl-C or SIGTERM reached it (maybe from a library of its own)
    if stopped and not interrupted:                  # the run stops as the process did, keeping what it wrote
        raise interrupts.Terminated() if outcome.returncode == 143 else KeyboardInterrupt()
    if written:
        return written[-1]
    if stopped:                                      # stopped before it measured anything: no record
        return None
    said = [line[len(ERROR_LINE):] for line in outcome.stderr_tail if line.startswith(ERROR_LINE)]
    if said and outcome.returncode in (1, 2):
        # bad input the process found (a file, a folder: exit 2), or what stops any run here (its record could not
        # be written, a broken install: exit 1): the run's error too, in its words
        raise (UsageError if outcome.returncode == 2 else AioError)(said[-1])
    status, reason, crash = failure_of(outcome, phase)
    learned = crashes.remember(journal, outcome.signal_name) if journal and outcome.signal_name else None
    if learned:
        logger.warning("%s: %s crashed its process with %s while %s: it is left out from now on on this CPU with "
                       "%s", config.label, learned["strategy"], learned["signal"], learned["stage"], learned["engine"])
        if retry:
            return RETRY
        crash["candidate"] = learned
    logger.warning("%s: %s", config.label, reason)
    return record_failure(out, run.spec, config.backend, config.precision, run.batch_size, run.threads, run.shape,
                          status, reason, crash=crash, run_id=run.run_id, fpmath=config.fpmath)
