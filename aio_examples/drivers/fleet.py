"""Sweeps across a Ray cluster: every point on every kind of machine, each run as a plain sweep runs it.

`aio-examples sweep --cluster ADDRESS` connects to a Ray cluster (`local` starts one on this machine), starts a
`PointRunner` actor on each node it may use, and groups the nodes into machine kinds by hardware fingerprint
(core/records.py). Every point of the sweep is measured once on each kind, by whichever node of the kind is
free: on the node it runs exactly as in a plain sweep (`sweep.run_point`: its own process, numactl-bound to its
cores, under its timeout) into a node-local folder, and its records come back to this driver, which appends
them to the sweep's results.jsonl: the only copy, written once.

A node runs one point at a time, so no two benchmarks share a machine, unless `points_per_node` splits its CPUs
into that many disjoint sets, one point on each. Ray places each actor on its node (`NodeAffinitySchedulingStrategy`)
and ships this package's code to the nodes (`runtime_env.py_modules`); the libraries must already be there,
the same versions as the driver's (`bash setup.sh` on each node), or the sweep refuses before any point.

A node lost in the middle of a point (its actor dies with it) has the point retried on another node of the same
kind; with none left, the point's record says so with `stop_reason` "node_lost", and a rerun retries it. A rerun
skips the points each kind already has. Ctrl-C kills the actors, and with them the points' processes.
"""

import os
import shutil
import socket
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from ..core import interrupts
from ..core import records as res
from ..core.errors import UsageError
from ..core.log import logger
from ..machine.environment import MACHINE_CPUS_ENV, MACHINE_TYPE_ENV, PACKAGES, capture
from .sweep import Point, SweepConfig, SweepSummary, finished_points, run_point

MACHINE_LABEL = "machine"         # the node label naming a machine's kind (an instance type), for prices
CONNECT_TIMEOUT_S = 5.0
FACTS_TIMEOUT_S = 300.0           # a node's first actor imports this package and reads the machine
RAY_CLIENT_PORT = 10001
PACKAGE = Path(__file__).resolve().parents[1]      # aio_examples/, shipped to the nodes


def check_address(address: str) -> str | None:
    """`address` as ray.init takes it (None: a new local cluster), after checking within seconds that something
    answers there; one line naming the address otherwise."""
    if not isinstance(address, str) or not address.strip():
        raise UsageError(f"--cluster {address!r} is invalid; accepted: ray://HEAD:{RAY_CLIENT_PORT}, HEAD:6379 or local")
    address = address.strip()
    if address == "local":
        return None
    hostport = address.removeprefix("ray://")
    host, _, port = hostport.rpartition(":")
    if not host or not port.isdigit():
        raise UsageError(f"--cluster {address!r} is invalid; accepted: ray://HEAD:{RAY_CLIENT_PORT} (Ray Client), "
                         "HEAD:6379 (the head's GCS address, from a machine of the cluster) or local")
    try:
        socket.create_connection((host, int(port)), timeout=CONNECT_TIMEOUT_S).close()
    except OSError as exc:
        raise UsageError(f"--cluster {address!r}: no Ray cluster answers there ({exc.strerror or exc}); accepted: "
                         f"the address of a running cluster (`ray start --head` prints it) or local") from None
    return address


@dataclass(frozen=True)
class NodeSelector:
    """`--nodes`: nodes with a label of a value (`machine=c7g.4xlarge`) or a custom resource (`c7g`); any of a
    comma-separated list."""

    terms: tuple = ()

    @classmethod
    def parse(cls, text: str | None) -> "NodeSelector":
        if text is None:
            return cls()
        terms = tuple(t.strip() for t in str(text).split(","))
        if not all(terms) or any(t.count("=") > 1 or t.startswith("=") for t in terms):
            raise UsageError(f"--nodes {text!r} is invalid; accepted: LABEL=VALUE or a custom resource name, "
                             "comma-separated")
        return cls(terms)

    def matches(self, node: dict) -> bool:
        if not self.terms:
            return True
        labels, resources = node.get("Labels") or {}, node.get("Resources") or {}
        for term in self.terms:
            key, eq, value = term.partition("=")
            if (eq and labels.get(key) == value) or (not eq and (resources.get(key, 0) > 0 or key in labels)):
                return True
        return False

    @property
    def label(self) -> str | None:
        """The label the user sorts machines by, when the selector names one."""
        return next((t.partition("=")[0] for t in self.terms if "=" in t), None)


def _user_labels(node: dict) -> dict:
    return {k: v for k, v in (node.get("Labels") or {}).items() if not k.startswith("ray.io/")}


def _custom_resources(node: dict) -> list[str]:
    return [k for k in node.get("Resources") or {} if k not in ("CPU", "GPU", "memory", "object_store_memory")
            and not k.startswith("node:") and not k.startswith("accelerator_type")]


class PointRunner:
    """A Ray actor on one node (or one disjoint CPU set of it): runs a point as a plain sweep does and hands back
    its records."""

    def __init__(self, share: tuple | None, machine_type: str | None, node: dict):
        from ..machine.topology import read_topology

        # The machine as the node offers it, before a point's binding narrows its process to some cores
        os.environ[MACHINE_CPUS_ENV] = str(len(os.sched_getaffinity(0)))
        if machine_type:
            os.environ[MACHINE_TYPE_ENV] = machine_type
        # The point's process imports the code Ray shipped to this node, the driver's, like this actor
        parent = str(PACKAGE.parent)
        os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (parent, os.environ.get("PYTHONPATH")) if p)
        self.cpus = _share_of(read_topology(), *share) if share else None
        self.node = node

    def facts(self) -> dict:
        from ..core.records import machine_fingerprint
        from ..machine.topology import read_topology

        env = capture()
        topology = read_topology()
        cpus = self.cpus if self.cpus is not None else topology.allowed_cpus
        threads = sorted({t for t in topology.default_thread_counts() if t <= len(cpus)} | {len(cpus)})
        return {"fingerprint": machine_fingerprint(env), "env": env, "cpus": list(cpus), "default_threads": threads,
                "numactl": shutil.which("numactl"), "python": sys.version.split()[0], **self.node}

    def run(self, point: Point, cfg: SweepConfig) -> list[dict]:
        from ..machine.topology import read_topology
        from .sweep import _record

        topology = read_topology()
        with tempfile.TemporaryDirectory(prefix="aio-fleet-") as folder:      # the driver keeps the only copy
            out = Path(folder)
            try:
                topology.pick_cpus(point.threads * (point.serving[2] if point.serving else 1), self.cpus)
            except UsageError as exc:
                _record(out, point, point.spec, "unsupported", f"this machine: {exc}", None)
            else:
                run_point(point, cfg, out, topology, self.cpus)
            found = res.records_in(out)
        for r in found:                   # where it ran, beside the machine it ran on
            r.env["node"] = dict(self.node)
        return [r.to_dict() for r in found]


@dataclass
class Runner:
    actor: object
    facts: dict
    busy: tuple | None = None          # (point, ref) it is running
    alive: bool = True


@dataclass
class Kind:
    """The nodes of one machine kind (fingerprint) and the points it still has to measure."""

    fingerprint: str
    runners: list = field(default_factory=list)
    queue: list = field(default_factory=list)
    tried: dict = field(default_factory=dict)        # point_id -> node ids it was lost on

    @property
    def name(self) -> str:
        env = self.runners[0].facts["env"]
        kind = f" {env['machine_type']}" if env.get("machine_type") else ""
        nodes = len({r.facts["node_id"] for r in self.runners})
        return (f"{self.fingerprint}{kind} ({res.machine_description(env)}, {env.get('machine_cpus')} offered; "
                f"{nodes} node(s), {len(self.runners) // nodes} point(s) at a time each)")


def run_fleet(cfg: SweepConfig, address: str, nodes: str | None = None, points_per_node: int = 1,
              quiet: bool = False) -> SweepSummary:
    """Run the sweep's points on each machine kind of the Ray cluster at `address`; see the module docstring."""
    target = check_address(address)
    selector = NodeSelector.parse(nodes)
    if isinstance(points_per_node, bool) or not isinstance(points_per_node, int) or points_per_node < 1:
        raise UsageError(f"--points-per-node {points_per_node!r} is invalid; accepted: a whole number >= 1")
    try:
        import ray
    except ImportError:
        raise UsageError("--cluster needs Ray, which is not installed; accepted: pip install 'ray[client]' "
                         "-c constraints.txt (setup.sh installs it)") from None
    out = res.check_output_dir(cfg.output)
    with res.lock_output(out, f"a fleet sweep of {', '.join(cfg.models)}"):
        _connect(ray, target)
        try:
            return _drive(ray, cfg, out, selector, points_per_node, quiet)
        finally:
            ray.shutdown()


# A Ray client server that answered but failed to start this client's session: tried again after these pauses.
# Its per-client server is a forked process, and a fork while gRPC threads are busy can die at birth ("epoll_wait
# error: Bad file descriptor" in its log): the next try gets a new process.
CONNECT_RETRY_PAUSES_S = (2.0, 5.0)


def _connect(ray, address: str | None) -> None:
    runtime_env = {"py_modules": [str(PACKAGE)],
                   "excludes": ["__pycache__", "*.pyc"]}
    settings = {"runtime_env": runtime_env, "log_to_driver": False, "logging_level": "ERROR"}
    for pause in (*CONNECT_RETRY_PAUSES_S, None):
        try:
            if address is None:
                ray.init(address="local", include_dashboard=False, **settings)
            else:
                ray.init(address=address, **settings)
            return
        except (ConnectionError, RuntimeError, TimeoutError) as exc:
            # ConnectionAbortedError: the server answered and failed this session (its reason inside); any other
            # error (nothing answers, a refused address) is not worth a second try
            if not isinstance(exc, ConnectionAbortedError) or pause is None:
                raise UsageError(f"--cluster {address or 'local'!r}: Ray could not connect ({_reason(exc)})") from None
            logger.warning("--cluster %s: Ray could not start this client's session (%s); trying again in %.0f s",
                           address, _reason(exc), pause)
            ray.shutdown()
            time.sleep(pause)


def _reason(exc: Exception) -> str:
    """An exception's first line, and its last when there are more (a server's traceback ends with its error).
    Unlike core.errors.short_error, which keeps the first line only: Ray puts the server's reason last."""
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    if len(lines) < 2:
        return (lines[0] if lines else type(exc).__name__)[:300]
    return f"{lines[0].rstrip(':')}: {lines[-1]}"[:300]


def _start_runners(ray, selector: NodeSelector, points_per_node: int) -> list[Runner]:
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    alive = [n for n in ray.nodes() if n.get("Alive")]
    chosen = [n for n in alive if selector.matches(n)]
    if not chosen:
        labels = sorted({f"{k}={v}" for n in alive for k, v in _user_labels(n).items()})
        resources = sorted({r for n in alive for r in _custom_resources(n)})
        raise UsageError(f"--nodes {','.join(selector.terms)!r} matches no node of the cluster ({len(alive)} alive); "
                         f"accepted: a label the nodes have ({', '.join(labels) or 'none'}) or a custom resource "
                         f"({', '.join(resources) or 'none'})")
    remote = ray.remote(PointRunner)
    runners = []
    for n in chosen:
        labels = _user_labels(n)
        machine_type = labels.get(MACHINE_LABEL) or (labels.get(selector.label) if selector.label else None)
        node = {"node_id": n["NodeID"][:12], "address": n.get("NodeManagerAddress"), "labels": labels}
        where = NodeAffinitySchedulingStrategy(n["NodeID"], soft=False)
        for share in [None] if points_per_node == 1 else [(i, points_per_node) for i in range(points_per_node)]:
            actor = remote.options(num_cpus=0, max_restarts=0, scheduling_strategy=where).remote(share, machine_type,
                                                                                                   node)
            runners.append(Runner(actor, {}))
    facts = ray.get([r.actor.facts.remote() for r in runners], timeout=FACTS_TIMEOUT_S)
    for runner, f in zip(runners, facts, strict=True):
        runner.facts = f
    return runners


def _share_of(topology, index: int, count: int) -> tuple:
    """The `index`-th of `count` disjoint CPU sets of a node: whole physical cores (SMT siblings together), split
    as evenly as they go; empty when the node has fewer cores than sets."""
    cores: dict = {}
    for cpu in topology.allowed_cpus:
        cores.setdefault(topology.core_of.get(cpu, (0, cpu)), []).append(cpu)
    ordered = [cores[c] for c in sorted(cores)]
    size, extra = divmod(len(ordered), count)
    first = index * size + min(index, extra)
    return tuple(cpu for core in ordered[first:first + size + (index < extra)] for cpu in core)


def _check_environments(runners: list[Runner]) -> None:
    """The same libraries as the driver on every node, and numactl: one line naming what a node lacks."""
    mine = capture().get("versions") or {}
    for r in runners:
        f = r.facts
        where = f"node {f['address']} ({f['node_id']})"
        if not f["cpus"]:
            raise UsageError(f"--points-per-node: {where} has fewer cores than points per node; accepted: at most "
                             "one point per physical core of the smallest node")
        if not f["numactl"]:
            raise UsageError(f"{where} lacks numactl, which binds each point to its cores; accepted: nodes with "
                             "numactl installed (bash setup.sh installs it)")
        theirs = f["env"].get("versions") or {}
        for package in PACKAGES:
            if mine.get(package) and theirs.get(package) != mine[package]:
                raise UsageError(f"{where} has {package} {theirs.get(package) or 'not installed'} where the driver "
                                 f"has {mine[package]}; accepted: the same pinned requirements on every node "
                                 "(bash setup.sh on each)")


def _drive(ray, cfg: SweepConfig, out: Path, selector: NodeSelector, points_per_node: int,
           quiet: bool) -> SweepSummary:
    from ray.exceptions import RayActorError, RayTaskError, WorkerCrashedError

    runners = _start_runners(ray, selector, points_per_node)
    _check_environments(runners)
    kinds: dict[str, Kind] = {}
    for r in runners:
        kinds.setdefault(r.facts["fingerprint"], Kind(r.facts["fingerprint"])).runners.append(r)
    total = skipped = 0
    for kind in kinds.values():
        points = cfg.points(kind.runners[0].facts["default_threads"])
        done = finished_points(out, kind.fingerprint)
        kind.queue = [p for p in points if p.point_id not in done and p.legacy_point_id not in done]
        total, skipped = total + len(points), skipped + len(points) - len(kind.queue)
        logger.info("fleet: machine %s: %d point(s) to run, %d done", kind.name, len(kind.queue),
                    len(points) - len(kind.queue))
    statuses: dict[str, int] = {}
    ran: list[str] = []
    start = time.perf_counter()
    interrupted = None
    lost: list[str] = []
    try:
        with interrupts.deferred():      # Ctrl-C is answered between Ray calls, never inside one
            while True:
                interrupts.check()
                for kind in kinds.values():
                    _assign(kind, cfg)
                pending = {r.busy[1]: (kind, r) for kind in kinds.values() for r in kind.runners if r.busy}
                if not pending:
                    break
                ready, _ = ray.wait(list(pending), num_returns=1, timeout=1.0)
                for ref in ready:
                    kind, runner = pending[ref]
                    point = runner.busy[0]
                    runner.busy = None
                    try:
                        records = ray.get(ref)
                    except (RayActorError, WorkerCrashedError) as exc:
                        lost.append(_lose(kind, runner, point, exc, out))
                        continue
                    except RayTaskError as exc:          # the actor's own code failed: the point's record says how
                        records = [_failure(point, runner.facts, f"on the node: {_first_line(exc.cause or exc)}")]
                    for d in records:
                        r = res.Result.from_dict(d)
                        res.append(out, r)
                        if r.point_id == point.point_id and not r.is_instance:
                            statuses[r.status] = statuses.get(r.status, 0) + 1
                            ran.append(r.point_id)
                    if not quiet:
                        print(f"[{runner.facts['node_id']}] {point.label}: "
                              f"{records[-1]['status'] if records else 'no record'}", file=sys.stderr)
    except KeyboardInterrupt as stop:
        interrupted = stop
        for r in runners:                 # a killed actor's point process dies with it (die_with_parent)
            ray.kill(r.actor)
    left = sum(len(k.queue) for k in kinds.values())
    mine = [r for r in res.records_in(out) if r.point_id in set(ran)]
    summary = SweepSummary(total, skipped, statuses, sum(r.prepare_s or 0 for r in mine),
                           sum((r.warmup or {}).get("seconds") or 0 for r in mine), sum(r.measured_s or 0 for r in mine),
                           time.perf_counter() - start, interrupted)
    summary.notes = [f"machine {k.name}" for k in kinds.values()] + lost
    if left and not interrupted:
        summary.notes.append(f"{left} point(s) not run: no node of their machine kind is left; rerun to resume")
    return summary


def _assign(kind: Kind, cfg: SweepConfig) -> None:
    """Give each free runner of `kind` the next point it has not been lost on."""
    for runner in kind.runners:
        if runner.busy or not runner.alive:
            continue
        node = runner.facts["node_id"]
        pick = next((p for p in kind.queue if node not in kind.tried.get(p.point_id, ())), None)
        if pick is None:
            continue
        kind.queue.remove(pick)
        runner.busy = (pick, runner.actor.run.remote(pick, cfg))


def _lose(kind: Kind, runner: Runner, point: Point, exc: Exception, out: Path) -> str:
    """The runner's node (or its actor) died during `point`: retry it on another node of the kind, else record
    that it was lost. Returns a line for the summary."""
    node = runner.facts["node_id"]
    for r in kind.runners:               # every actor of a lost node goes with it
        if r.facts["node_id"] == node:
            r.alive = False
    kind.tried.setdefault(point.point_id, set()).add(node)
    reason = f"node {runner.facts['address']} ({node}) was lost during the point: {_first_line(exc)}"
    others = [r for r in kind.runners if r.alive and r.facts["node_id"] not in kind.tried[point.point_id]]
    if others:
        kind.queue.insert(0, point)
        logger.warning("fleet: %s; retrying %s on another node of its kind", reason, point.label)
        return f"retried on another node: {point.label} ({reason})"
    res.append(out, res.Result.from_dict(_failure(
        point, runner.facts, reason + "; no other node of this machine kind to retry it on; rerun to retry",
        stop_reason="node_lost")))
    logger.warning("fleet: %s: %s", point.label, reason)
    return f"lost: {point.label} ({reason})"


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0][:200] if text else type(exc).__name__


def _failure(point: Point, facts: dict, reason: str, **fields) -> dict:
    """The record of a point that ended without one of its own, on the machine of the node it ran on."""
    r = res.Result.for_config(point.spec, point.backend, point.precision, point.batch_size, point.threads,
                              point.spec.shape(**dict(point.shape)), status="failed", reason=reason,
                              point_id=point.point_id, fpmath={"mode": point.fpmath} if point.precision == "fp32"
                              else None, **fields)
    r.env = {**facts["env"], "allocator": point.allocator, "env_axes": point.env_axes,
             "node": {k: facts[k] for k in ("node_id", "address", "labels")}}
    return r.to_dict()
