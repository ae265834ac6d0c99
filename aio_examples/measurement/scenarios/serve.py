"""Serving: this process is one instance of a system under test that MLPerf LoadGen drives (drivers/loadgen.py).

It prepares and warms up its one configuration like any run, measures a few passes so the driver knows what a
pass costs (to refuse a latency bound that can never be met, and to size an Offline run), then connects to
the driver's socket and runs one pass per request until told to stop. LoadGen decides when queries arrive;
the driver hands each instance a batch of samples and reports them complete when the instance answers.

Requests and answers are pickled tuples on a `multiprocessing.connection` socket:
driver -> instance `("run", samples)` and `("stop",)`; instance -> driver `("ready", facts)` once, then
`("done", pass_ns)` per request, or `("error", message)` when a pass raised (the driver fails the run).
"""

import os
import statistics
from multiprocessing.connection import Client

from ...core.errors import UsageError
from .base import Scenario

PROBE_PASSES = 3


class ServeScenario(Scenario):
    name = "serve"
    key = "serve"

    def __init__(self, address: str, index: int, of: int, group: str):
        self.address, self.index, self.of, self.group = address, index, of, group
        self.served = 0

    @classmethod
    def parse(cls, address: str, spec: str, group: str) -> "ServeScenario":
        try:
            index, of = (int(x) for x in (spec or "0/1").split("/"))
        except ValueError:
            index, of = -1, 0
        if not 0 <= index < of:
            raise UsageError(f"--instance {spec!r} is invalid; accepted: INDEX/COUNT with 0 <= INDEX < COUNT")
        return cls(address, index, of, group)

    @property
    def instances(self):
        return self.of

    def instance(self):
        return {"index": self.index, "of": self.of, "group": self.group}

    def measure(self, measurements, on_error, probe, timeout_s):
        conn = Client(self.address, family="AF_UNIX")
        try:
            if len(measurements) != 1:        # refused by its backend (its record says why): tell the driver
                conn.send(("error", "the configuration did not prepare: see this instance's record"))
                return
            m = measurements[0]
            try:
                m.warm_up()
                pass_ms = statistics.median(m._pass() for _ in range(PROBE_PASSES)) / 1e6
            except Exception as exc:  # noqa: BLE001  (this instance's failure, recorded and told)
                m.stop_reason = "error"
                on_error(m, exc)
                conn.send(("error", f"{type(exc).__name__}: {exc}"[:300]))
                return
            conn.send(("ready", {"index": self.index, "pid": os.getpid(), "pass_ms": pass_ms}))
            self._serve(conn, m, on_error)
        finally:
            conn.close()

    def _serve(self, conn, m, on_error) -> None:
        while True:
            try:
                request = conn.recv()
            except EOFError:              # the driver is gone: nothing more to serve
                break
            if request[0] != "run":
                break
            try:
                elapsed = m._pass()
            except Exception as exc:  # noqa: BLE001
                m.stop_reason = "error"
                on_error(m, exc)
                conn.send(("error", f"{type(exc).__name__}: {exc}"[:300]))
                return
            m.samples_ns.append(elapsed)
            self.served += 1
            conn.send(("done", elapsed))
        m.stop_reason = "served"

    def annotate(self, result, measurement, task_size):
        result.instance.update({"cores": result.binding.get("cores"), "passes_served": self.served})
