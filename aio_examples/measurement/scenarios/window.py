"""Multi-instance window: this process is one of several started together on disjoint cores.

Each instance prepares and warms up on its own, says it is ready (a file in a shared folder), then waits for
the start time the driver (drivers/instances.py) writes once all are ready. From that instant it runs
passes for the window and records when each pass ended (`time.monotonic_ns`, one clock for the machine), so
the driver can sum the work of all instances over the window in which all of them ran.
"""

import json
import time
from dataclasses import dataclass
from pathlib import Path

from ...core.errors import UsageError
from .base import Scenario

GO_FILE = "go.json"


def ready_file(barrier: Path, index: int) -> Path:
    return Path(barrier) / f"ready-{index}"


@dataclass(frozen=True)
class InstanceSync:
    """A child's side of the start barrier."""

    index: int
    of: int
    group: str
    barrier: Path

    @classmethod
    def parse(cls, spec: str, barrier: str, group: str) -> "InstanceSync":
        try:
            index, of = (int(x) for x in spec.split("/"))
        except ValueError:
            index, of = -1, 0
        if not 0 <= index < of:
            raise UsageError(f"--instance {spec!r} is invalid; accepted: INDEX/COUNT with 0 <= INDEX < COUNT")
        return cls(index, of, group, Path(barrier))

    def describe(self) -> dict:
        return {"index": self.index, "of": self.of, "group": self.group}

    def ready(self) -> None:
        ready_file(self.barrier, self.index).touch()

    def wait_go(self, timeout_s: float = 3600.0) -> int:
        """Block until the driver publishes the common start time; return it (monotonic ns)."""
        deadline = time.monotonic() + timeout_s
        path = self.barrier / GO_FILE
        while time.monotonic() < deadline:
            try:
                return int(json.loads(path.read_text())["start_ns"])
            except (OSError, ValueError, KeyError):
                time.sleep(0.01)
        raise TimeoutError(f"no start signal in {timeout_s:.0f} s")


class WindowScenario(Scenario):
    name = "window"
    key = "window"

    def __init__(self, sync: InstanceSync):
        self.sync = sync
        self.start_ns, self.ends = None, []

    @property
    def instances(self):
        return self.sync.of

    def instance(self):
        return self.sync.describe()

    def measure(self, measurements, on_error, probe, timeout_s):
        """Warm up, tell the driver we are ready, then measure the window every instance shares."""
        if len(measurements) != 1:       # refused by its backend (recorded as such), or asked for more than one
            self.sync.ready()
            if len(measurements) > 1:
                raise UsageError("a throughput instance measures exactly one backend at one precision")
            return
        m = measurements[0]
        try:
            m.warm_up()
            self.sync.ready()
            self.start_ns = self.sync.wait_go()
            self.ends = m.run_window(self.start_ns, timeout_s)
        except Exception as exc:  # noqa: BLE001  (recorded as this instance's failure)
            m.stop_reason = "error"
            on_error(m, exc)
            self.sync.ready()          # never leave the driver waiting for a failed instance

    def annotate(self, result, measurement, task_size):
        result.instance.update({"cores": result.binding.get("cores"), "window_start_ns": self.start_ns,
                                "pass_ends_ns": self.ends, "task_size": task_size})
