"""What a scenario is: how a prepared model is driven, and what of it a record says.

The runner prepares every configuration and hands the scenario their measurements (timing.Measurement: a
pass function, its stop rule and what it measured); the scenario decides when passes run and adds what
only it knows to each record. A record's `scenario` is `record()`: its name, the `key` that identifies
what it measures in a configuration key (core/records.py), and its parameters.
"""


class Scenario:
    """Base class. Subclasses set `name` (the registry key) and `key`, and implement `measure`."""

    name: str = ""
    key: str = ""            # what is measured: two scenarios with one key measure the same thing

    def params(self) -> dict:
        return {}

    def record(self) -> dict:
        return {"name": self.name, "key": self.key, **self.params()}

    @property
    def instances(self) -> int:
        """Processes measured side by side (the record's `instances`)."""
        return 1

    def instance(self) -> dict | None:
        """This process's place among them (the record's `instance`)."""
        return None

    def measure(self, measurements: list, on_error, probe, timeout_s: float) -> None:
        """Drive the measurements until each is done. `on_error(measurement, exc)`: a pass raised; `probe`:
        a machine/probe.py MachineProbe to read after every round, or None."""
        raise NotImplementedError

    def annotate(self, result, measurement, task_size: int) -> None:
        """Add what this scenario knows to a measured configuration's record."""
