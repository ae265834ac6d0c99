"""Dataset registry: one line per dataset kind, each in its own module (see base.py for what one provides).

A run's dataset comes from `--dataset KIND:PATH` (with `--labels`), else from the environment variables of
the kind that serves the model's task (ImageNet's, COCO's, SQuAD's...), else it is `synthetic`.
"""

import os

from ..core.errors import UsageError
from ..core.registry import lookup
from .base import Batch, Dataset, Evaluation, LabelledDataset
from .coco import Coco
from .glue import Glue
from .imagenet import ImageNet
from .lambada import Lambada
from .librispeech import LibriSpeech
from .masked_text import MaskedText
from .squad import Squad
from .synthetic import SyntheticDataset
from .text import Text

DATASETS: dict[str, type[Dataset]] = {d.name: d for d in (
    SyntheticDataset,
    ImageNet,
    Coco,
    Squad,
    Glue,
    MaskedText,
    Text,
    Lambada,
    LibriSpeech,
)}

# kind -> (variable of its path, variable of its labels or annotation file)
ENVIRONMENT = {
    "imagenet": ("IMAGENET_IMG_PATH", "IMAGENET_LABELS_PATH"),
    "coco": ("COCO_IMG_PATH", "COCO_ANNO_PATH"),
    "squad": ("SQUAD_V1_1_PATH", ""),       # "": no labels variable (os.environ.get refuses None)
    "glue": ("GLUE_TSV_PATH", ""),
    "masked-text": ("MASKED_TEXT_PATH", ""),
    "text": ("TEXT_DATASET_PATH", ""),
    "lambada": ("LAMBADA_PATH", ""),
    "librispeech": ("LIBRISPEECH_DATASET_PATH", ""),
}

DEFAULT_DATASET = "synthetic"


def get_dataset(name: str) -> Dataset:
    """A dataset kind that needs no path (synthetic, or one a test registers)."""
    return lookup(DATASETS, name, "dataset")()


def open_dataset(kind: str, path: str | None = None, labels: str | None = None,
                 num_samples: int | None = None) -> Dataset:
    """An opened dataset: its sample list read and checked now, before any model is built."""
    cls = lookup(DATASETS, kind, "dataset")
    if not cls.labelled:
        if path or labels or num_samples:
            raise UsageError(f"dataset {kind!r} takes no path, labels or --num-samples; "
                             f"accepted: {', '.join(k for k, c in DATASETS.items() if c.labelled)} with a path")
        return cls()
    if not path:
        raise UsageError(f"dataset {kind!r} needs a path; accepted: --dataset {kind}:PATH"
                         + (f" or {ENVIRONMENT[kind][0]}" if kind in ENVIRONMENT else ""))
    return cls(path, labels, num_samples)


def resolve(task: str, dataset: str | None = None, labels: str | None = None, num_samples: int | None = None,
            environ=os.environ) -> Dataset:
    """The dataset of a run: `--dataset KIND[:PATH]` and `--labels` win over the environment variables of the
    kind serving `task`; without either, synthetic. A kind that does not serve `task` is refused."""
    if dataset:
        kind, _, path = dataset.partition(":")
        variables = ENVIRONMENT.get(kind, (None, None))
        path = path or environ.get(variables[0] or "", "")
        labels = labels or environ.get(variables[1] or "", "") or None
    else:
        kind = next((k for k, (var, _) in ENVIRONMENT.items() if task in DATASETS[k].tasks and environ.get(var)),
                    DEFAULT_DATASET)
        path = environ.get(ENVIRONMENT[kind][0]) if kind in ENVIRONMENT else None
        labels = labels or (environ.get(ENVIRONMENT[kind][1]) or None if kind in ENVIRONMENT else None)
        if kind == DEFAULT_DATASET and (labels or num_samples):
            raise UsageError(f"{'--labels' if labels else '--num-samples'} needs a dataset; accepted: "
                             "--dataset KIND:PATH or the dataset's environment variable (docs/datasets.md)")
    cls = lookup(DATASETS, kind, "dataset")
    if cls.tasks and task not in cls.tasks:
        serving = [k for k, c in DATASETS.items() if not c.tasks or task in c.tasks]
        raise UsageError(f"dataset {kind!r} is for {', '.join(cls.tasks)}, not {task}; accepted: {', '.join(serving)}")
    return open_dataset(kind, path or None, labels, num_samples)


__all__ = ["DATASETS", "DEFAULT_DATASET", "ENVIRONMENT", "Batch", "Dataset", "Evaluation", "LabelledDataset",
           "get_dataset", "open_dataset", "resolve"]
