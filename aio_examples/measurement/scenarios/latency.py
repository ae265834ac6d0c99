"""Latency: every configuration of the run in interleaved one-second rounds, each to its stop rule."""

from ..timing import measure
from .base import Scenario


class LatencyScenario(Scenario):
    name = "latency"
    key = "latency"

    def measure(self, measurements, on_error, probe, timeout_s):
        measure(measurements, on_error=on_error, probe=probe)
