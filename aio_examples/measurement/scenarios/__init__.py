"""Scenario registry: how a prepared model is driven; one line per scenario, each in its own module."""

from .base import Scenario
from .generation import GenerationScenario
from .latency import LatencyScenario
from .serve import ServeScenario
from .turns import Turns, TurnsScenario
from .window import InstanceSync, WindowScenario

# name -> class; the constructor of each takes what its worker flags carry (drivers/worker.py builds them)
SCENARIOS: dict[str, type[Scenario]] = {s.name: s for s in (
    LatencyScenario,
    GenerationScenario,
    TurnsScenario,
    WindowScenario,
    ServeScenario,
)}

__all__ = ["SCENARIOS", "GenerationScenario", "InstanceSync", "LatencyScenario", "Scenario", "ServeScenario", "Turns", "TurnsScenario", "WindowScenario"]
