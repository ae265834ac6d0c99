"""What a dataset is: where a run's inputs come from, and how a batch of outputs is scored into task metrics.

A dataset hands the runner the example inputs it measures with and the calibration inputs of static int8,
and, when it has labels, batches of (inputs, targets) and a `score` that turns the outputs of those batches
into the task's metrics (top-1 accuracy, mAP, F1, ...). Every run goes through one, so every task has one
code path: without a real dataset it is `synthetic` (made-up inputs, no labels, no metrics).
"""

from collections.abc import Iterator
from dataclasses import dataclass


@dataclass(frozen=True)
class Batch:
    """One batch of a labelled dataset: inputs as the model takes them, and what the answers should be."""

    inputs: tuple
    targets: object


class Dataset:
    """Base class. Subclasses set `name` (the registry key, recorded in every result) and override what
    they provide; see synthetic.py for the smallest."""

    name: str = ""
    labelled: bool = False            # whether it has targets, so `batches` and `score` mean something
    tasks: tuple = ()                 # the model tasks it serves (empty: every task)

    def example_inputs(self, spec, batch_size: int, shape: dict, module) -> tuple:
        """The inputs the timed passes run on."""
        raise NotImplementedError

    def calibration_inputs(self, spec, batch_size: int, shape: dict, module, n: int) -> list[tuple]:
        """`n` input tuples for static int8 calibration (by default the example inputs again)."""
        return [self.example_inputs(spec, batch_size, shape, module)] * n

    def batches(self, spec, batch_size: int, shape: dict, module, limit: int | None = None) -> Iterator[Batch]:
        """Labelled batches for scoring, at most `limit` of them."""
        return iter(())

    def score(self, outputs: list, targets: list) -> dict:
        """Task metrics of the outputs of `batches` against their targets (empty without labels)."""
        return {}
