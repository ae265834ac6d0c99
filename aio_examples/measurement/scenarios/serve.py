"""Serving: this process is one instance of a system under test that MLPerf LoadGen drives (drivers/loadgen.py).

It prepares and warms up its one configuration like any run, measures a few passes so the driver knows what a
pass costs (to refuse a latency bound that can never be met, and to size an Offline run), then connects to
the driver's socket and runs one pass per request until told to stop. LoadGen decides when queries arrive;
the driver hands each instance a batch of samples and reports them complete when the instance answers.

Requests and answers are pickled tuples on a `multiprocessing.connection` socket:
driver -> instance `("run", samples)` and `("stop",)`; instance -> driver `("ready", facts)` once, then
`("done", pass_ns)` per request, or `("error", message)` when a pass raised (the driver fails the run). A
text generator also says `("first",)` the moment its first token is out, and answers `("done", pass_ns,
tokens per sample)`, so LoadGen times the first token and each one after (MLPerf's TTFT and TPOT).
In LoadGen's accuracy mode (a labelled dataset) the driver asks `("samples", indices)` and gets
`("done", pass_ns, answers)`, each sample's outputs as `.npz` bytes, which LoadGen writes to its accuracy log;
then `("score", accuracy_log)` has the instance score exactly those answers: `("scored", accuracy block)`.
"""

import io
import json
import os
import statistics
from multiprocessing.connection import Client
from pathlib import Path

from ...core.errors import UsageError
from .base import Scenario

PROBE_PASSES = 3


def encode(outputs: list) -> bytes:
    """One sample's outputs (numpy arrays, in order) as `.npz` bytes: what LoadGen keeps as its response."""
    import numpy as np

    buffer = io.BytesIO()
    np.savez(buffer, *outputs)
    return buffer.getvalue()


def decode(data: bytes) -> list:
    import numpy as np

    with np.load(io.BytesIO(data)) as archive:
        return [archive[f"arr_{i}"] for i in range(len(archive.files))]


def answers_in(accuracy_log) -> dict:
    """{sample index: outputs} from LoadGen's `mlperf_log_accuracy.json` (each response's bytes in hex)."""
    entries = json.loads(Path(accuracy_log).read_text(encoding="utf-8") or "[]")
    return {int(e["qsl_idx"]): decode(bytes.fromhex(e["data"])) for e in entries}


class ServeScenario(Scenario):
    name = "serve"
    key = "serve"
    serves_samples = True       # given a labelled dataset, the runner hands each measurement its samples

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
            ttft = (getattr(m.fn, "pass_metrics", None) or {}).get("ttft")       # a generator's last probe pass
            conn.send(("ready", {"index": self.index, "pid": os.getpid(), "pass_ms": pass_ms,
                                 "ttft_ms": ttft / 1e6 if ttft else None,
                                 "samples": len(m.samples) if m.samples is not None else None}))
            self._serve(conn, m, on_error)
        finally:
            conn.close()

    def _serve(self, conn, m, on_error) -> None:
        import time

        while True:
            try:
                request = conn.recv()
            except EOFError:              # the driver is gone: nothing more to serve
                break
            try:
                if request[0] == "run" and hasattr(m.fn, "on_first_token"):     # a generator: tokens timed too
                    m.fn.on_first_token = lambda: conn.send(("first",))
                    elapsed = m._pass()
                    m.fn.on_first_token = None
                    answer = ("done", elapsed, m.fn.new_tokens)
                elif request[0] == "run":
                    answer = ("done", m._pass())
                elif request[0] == "samples":
                    start = time.perf_counter_ns()
                    outputs = m.samples.answers(request[1])
                    answer = ("done", time.perf_counter_ns() - start, [encode(o) for o in outputs])
                elif request[0] == "score":
                    answer = ("scored", m.samples.score(answers_in(request[1])))
                else:
                    break
            except Exception as exc:  # noqa: BLE001  (recorded, and told to the driver, which fails the run)
                m.stop_reason = "error"
                on_error(m, exc)
                conn.send(("error", f"{type(exc).__name__}: {exc}"[:300]))
                return
            if answer[0] == "done":
                m.samples_ns.append(answer[1])
                self.served += 1
            conn.send(answer)
        m.stop_reason = "served"

    def annotate(self, result, measurement, task_size):
        result.instance.update({"cores": result.binding.get("cores"), "passes_served": self.served})
