"""Multi-instance throughput: N processes x T threads on disjoint cores, started together.

Each instance prepares and warms up on its own, says it is ready (a file in a shared folder), then
waits for the start time this driver writes once all are ready; from that instant it runs passes for
the window (the window scenario, measurement/scenarios/window.py, is the instance's side). The aggregate throughput is the *sum* of work completed by all instances in the window in which all
of them were running, divided by that window; an average of per-instance figures would hide a slow
instance. Per-instance latencies are kept in their own records.
"""

import shutil
import tempfile
import time
from pathlib import Path

from ..core import records as res
from ..core.log import logger
from ..core.paths import write_json_atomic
from ..core.processes import Isolated
from ..machine.binding import plan, probe
from ..measurement.scenarios.window import GO_FILE, ready_file
from ..measurement.stats import summarize
from .worker import run_argv

START_DELAY_S = 0.5           # between "all ready" and the common start: every instance sees the go file


def aggregate(instances: list[dict]) -> dict:
    """Sum the work all instances completed in the window in which all of them were running.

    `instances`: per instance `{"window_start_ns", "pass_ends_ns" (absolute), "task_size"}`.
    """
    start = max(i["window_start_ns"] for i in instances)
    end = min(i["pass_ends_ns"][-1] for i in instances if i["pass_ends_ns"]) if all(
        i["pass_ends_ns"] for i in instances) else start
    seconds = (end - start) / 1e9
    if seconds <= 0:
        return {"window_s": 0.0, "work": 0, "throughput": None, "per_instance": [0 for _ in instances]}
    per_instance = [sum(1 for t in i["pass_ends_ns"] if start < t <= end) * i["task_size"] for i in instances]
    return {"window_s": seconds, "work": sum(per_instance), "throughput": sum(per_instance) / seconds,
            "per_instance": [w / seconds for w in per_instance]}


def run_throughput(model: str, backend: str, precision: str, batch_size: int, instances: int,
                   threads_per_instance: int, window_s: float, out: Path, shape: dict | None = None,
                   allocator: str = "default", prepare_timeout_s: float = 900.0, numa_cpus=None) -> list[dict]:
    """Run the instances, then append and return their records followed by the aggregate record."""
    from ..machine.topology import read_topology
    from ..models import get_model
    from .sweep import Point, point_env

    spec = get_model(model)
    shape = dict(shape or {})
    topology = read_topology()
    cpu_sets = topology.disjoint_cpu_sets(instances, threads_per_instance, numa_cpus)
    group = res.new_run_id()
    barrier = Path(tempfile.mkdtemp(prefix="aio-instances-"))
    point = Point(model, backend, precision, batch_size, threads_per_instance, allocator, tuple(sorted(shape.items())))
    children, bindings = [], []
    try:
        for index, cores in enumerate(cpu_sets):
            binding = probe(plan(topology, cores))
            bindings.append(binding)
            argv = run_argv(model, shape, backend=backend, precision=precision, batch_size=batch_size,
                            threads=threads_per_instance, timeout=window_s, output=out, json=True,
                            instance=f"{index}/{instances}", barrier=barrier, group=group,
                            point_id=f"{group}-{index}")
            children.append(Isolated(argv, env=point_env(point, binding), prefix=binding.prefix()))
        failure = _wait_ready(children, barrier, prepare_timeout_s)
        if failure is None:
            write_json_atomic(barrier / GO_FILE, {"start_ns": time.monotonic_ns() + int(START_DELAY_S * 1e9)})
            outcomes = [c.wait(window_s + 120) for c in children]
            bad = [(i, o) for i, o in enumerate(outcomes) if o.crashed]
            if bad:
                failure = ("timeout" if bad[0][1].timed_out else "failed", f"instance {bad[0][0]}: {bad[0][1].reason}")
    except BaseException:
        for c in children:
            c.kill()
        raise
    finally:
        shutil.rmtree(barrier, ignore_errors=True)
    records = [r for r in res.records_in(out) if r.instance and r.instance.get("group") == group]
    records.sort(key=lambda r: r.instance["index"])
    agg = _aggregate_record(spec, point, shape, instances, cpu_sets, bindings, records, group, failure)
    res.append(out, agg)
    return [*records, agg]


def _wait_ready(children, barrier: Path, timeout_s: float):
    """Wait until every instance has warmed up; a child that dies first ends the run (killing the rest)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if all(ready_file(barrier, i).exists() for i in range(len(children))):
            return None
        for i, c in enumerate(children):
            if c.proc.poll() is not None:
                outcome = c.wait(0)
                for other in children:
                    other.kill()
                return "failed", f"instance {i} ended before the start: {outcome.reason}"
        time.sleep(0.05)
    for c in children:
        c.kill()
    return "timeout", f"instances not ready after {timeout_s:.0f} s"


def _aggregate_record(spec, point, shape, instances, cpu_sets, bindings, records, group, failure) -> res.Result:
    layout = [{"index": i, "cores": list(cores), "binding": b.method, "membind": list(b.membind or []) or None}
              for i, (cores, b) in enumerate(zip(cpu_sets, bindings))]
    r = res.Result.for_config(spec, point.backend, point.precision, point.batch_size, point.threads,
                              spec.shape(**shape), instances=instances, point_id=f"{group}-aggregate",
                              warnings=[w for b in bindings for w in b.warnings])
    r.instance = {"aggregate": True, "group": group, "layout": layout}
    r.scenario = {"name": "window", "key": "window"}
    not_ok = [x for x in records if x.status != "ok"]
    if not_ok:         # an instance's own answer (e.g. unsupported) says more than how its process ended
        failure = (not_ok[0].status, f"instance {not_ok[0].instance['index']}: {not_ok[0].reason}")
    elif failure is None and len(records) != instances:
        failure = ("failed", f"{len(records)} of {instances} instances wrote a record")
    if failure is not None:
        r.status, r.reason = failure
        logger.warning("throughput: %s", r.reason)
        return r
    agg = aggregate([x.instance for x in records])
    unit = records[0].throughput["unit"]
    r.throughput = {"value": agg["throughput"], "unit": unit}
    r.instance.update({"window_s": agg["window_s"], "work_in_window": agg["work"]})
    for entry, x, per in zip(layout, records, agg["per_instance"]):
        entry.update({"median_ms": x.median_ms, "throughput": per, "observed_cores": x.binding.get("observed_cores"),
                      "contention": (x.contention or {}).get("busy_elsewhere_cores")})
    pooled = [s for x in records for s in x.samples_ms]
    r.latency_ms = summarize(pooled).to_dict() if pooled else None
    r.env = records[0].env
    strategies = {x.strategy for x in records}
    r.strategy = strategies.pop() if len(strategies) == 1 else "mixed: " + ", ".join(sorted(map(str, strategies)))
    r.metrics = {k: records[0].metrics[k] for k in ("flops_per_pass", "units_per_pass") if k in records[0].metrics}
    r.check = {"passed": all(x.check["passed"] for x in records if x.check)}
    read = [x.contention for x in records if x.contention]
    if read:     # each instance's cores are its own: what others took of them adds up over the instances
        r.contention = {"busy_elsewhere_cores": round(sum(c["busy_elsewhere_cores"] for c in read), 2),
                        "threshold_cores": sum(c.get("threshold_cores", 0.25) for c in read),
                        "contended": any(c.get("contended") for c in read)}
        if r.contention["contended"]:
            r.warnings.append("other processes held the cores of an instance while it measured (see layout): "
                              "the aggregate throughput is not representative")
    return r
