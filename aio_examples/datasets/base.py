"""What a dataset is: where a run's inputs come from and, when it has labels, how outputs become task metrics.

A dataset hands the runner the example inputs it measures with and the calibration inputs of static int8.
A labelled one (`LabelledDataset`) also reads its sample list when opened (so a missing or malformed dataset
fails before any model is built), yields padded batches of real samples, and gives an `Evaluation` that turns
the outputs of those batches into the task's metrics and a predictions file anyone can rescore. Every run
goes through one: without a real dataset it is `synthetic` (made-up inputs, no labels, no metrics).
"""

import hashlib
import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from ..core.errors import UsageError


@dataclass(frozen=True)
class Batch:
    """One batch: inputs as the eager model takes them (padded to the batch size by repeating the last
    sample, so every backend sees the shape it was prepared for) and the targets of its real samples."""

    inputs: tuple
    targets: list

    @property
    def count(self) -> int:
        return len(self.targets)


class Evaluation:
    """One configuration's scoring: `add` each batch's outputs (numpy arrays, flattened in the eager model's
    order, padded rows included), then `metrics()` and `predictions()`."""

    def add(self, batch: Batch, outputs: list) -> None:
        raise NotImplementedError

    def metrics(self) -> dict:
        raise NotImplementedError

    def predictions(self):
        """Every prediction, JSON-serialisable, in the form the field rescores (e.g. COCO results)."""
        raise NotImplementedError


class Dataset:
    """Base class. Subclasses set `name` (the registry key, recorded in every result) and override what
    they provide; see synthetic.py for the smallest."""

    name: str = ""
    labelled: bool = False            # whether it has targets, so `batches` and `evaluation` mean something
    tasks: tuple = ()                 # the model tasks it serves (empty: every task)

    def example_inputs(self, spec, batch_size: int, shape: dict, module) -> tuple:
        """The inputs the timed passes run on."""
        raise NotImplementedError

    def calibration_inputs(self, spec, batch_size: int, shape: dict, module, n: int) -> list[tuple]:
        """`n` input tuples for static int8 calibration (by default the example inputs again)."""
        return [self.example_inputs(spec, batch_size, shape, module)] * n

    def batches(self, spec, batch_size: int, shape: dict, module) -> Iterator[Batch]:
        """Labelled batches for scoring (none without labels)."""
        return iter(())

    def evaluation(self, spec, module) -> Evaluation | None:
        """A fresh scorer for one configuration (None without labels)."""
        return None

    # A dataset for a generator may define `drive(step, inputs) -> list of numpy arrays`: how one batch is run
    # through a prepared generation step (which only predicts the next token over its own KV cache, e.g.
    # teacher-forced over a window for perplexity). Without it, a batch is one call of the prepared model.

    def describe(self) -> dict:
        """What the record's accuracy block says about the data: kind, path, digest of the sample list."""
        return {"kind": self.name}

    def protocol(self, spec, shape: dict) -> dict | None:
        """Which reference evaluation the scoring follows for `spec` (the accuracy block's `protocol`):
        `{"protocol": "reference", "follows": what, "shape": the inputs it scored at}`, with `timed_shape`
        when the timed passes run at another shape than the protocol's (a fixed square for speed). None
        when the dataset follows no published protocol."""
        return None


class LabelledDataset(Dataset):
    """A dataset of real samples on disk. Subclasses implement `_index` (the sample list, validated),
    `_inputs` (a list of samples as one batch of model inputs), `_target` and `evaluation`."""

    labelled = True
    path_kind = "a folder"            # what `path` must be, for messages

    def __init__(self, path: str, labels: str | None = None, num_samples: int | None = None):
        if num_samples is not None and num_samples < 1:
            raise UsageError(f"--num-samples {num_samples} is invalid; accepted: a whole number >= 1")
        self.path = Path(path).expanduser()
        self.labels = Path(labels).expanduser() if labels else None
        if not self.path.exists():
            raise UsageError(f"{self.name} dataset {str(self.path)!r} does not exist; accepted: {self.path_kind}")
        samples = self._index()
        if not samples:
            raise UsageError(f"{self.name} dataset {str(self.path)!r} holds no samples; accepted: {self.path_kind}")
        self.samples = samples[:num_samples] if num_samples else samples
        key = json.dumps([self._describe_sample(s) for s in self.samples], sort_keys=True, default=str)
        self.digest = hashlib.sha256(key.encode()).hexdigest()[:16]

    def _index(self) -> list:
        raise NotImplementedError

    def _describe_sample(self, sample):
        """What identifies a sample in the digest (its file and label, not where the dataset lies)."""
        return sample

    def _inputs(self, spec, shape: dict, module, samples: list) -> tuple:
        raise NotImplementedError

    def _target(self, sample):
        return sample

    def describe(self) -> dict:
        return {"kind": self.name, "path": str(self.path.resolve()), "digest": self.digest,
                **({"labels": str(self.labels.resolve())} if self.labels else {})}

    def batches(self, spec, batch_size, shape, module):
        for start in range(0, len(self.samples), batch_size):
            chunk = self.samples[start:start + batch_size]
            padded = chunk + [chunk[-1]] * (batch_size - len(chunk))
            yield Batch(self._inputs(spec, shape, module, padded), [self._target(s) for s in chunk])

    def example_inputs(self, spec, batch_size, shape, module):
        """The first batch of real samples: timings are measured on real inputs."""
        return next(self.batches(spec, batch_size, shape, module)).inputs

    def calibration_inputs(self, spec, batch_size, shape, module, n):
        """The first `n` batches (cycled when the dataset has fewer)."""
        batches = []
        for batch in self.batches(spec, batch_size, shape, module):
            batches.append(batch.inputs)
            if len(batches) == n:
                break
        return [batches[i % len(batches)] for i in range(n)]


def tokenizer_of(dataset: Dataset, module):
    """The model folder's tokenizer, which a text dataset needs (the runner refuses one without a folder)."""
    tokenizer = getattr(module, "tokenizer", None)
    if tokenizer is None:
        raise UsageError(f"dataset {dataset.name!r} needs a tokenizer; accepted: --model-dir with a folder "
                         "holding the model's tokenizer")
    return tokenizer


def load_image(path: Path, transform):
    """`transform` of the image file at `path`, or one line saying it cannot be decoded."""
    from PIL import Image

    try:
        with Image.open(path) as image:
            return transform(image)
    except OSError as exc:
        raise UsageError(f"image {str(path)!r} cannot be decoded ({exc}); accepted: an image file") from None


def read_text(path: Path, what: str) -> str:
    """A dataset file's text, or one line saying why it cannot be read."""
    try:
        return path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise UsageError(f"{str(path)!r} cannot be read ({exc.__class__.__name__}); accepted: {what}") from None


def read_json(path: Path, what: str):
    try:
        return json.loads(read_text(path, what))
    except json.JSONDecodeError as exc:
        raise UsageError(f"{str(path)!r} is not JSON (line {exc.lineno}); accepted: {what}") from None
