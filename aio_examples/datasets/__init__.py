"""Dataset registry: one line per dataset, each in its own module (see base.py for what one provides)."""

from ..core.registry import lookup
from .base import Batch, Dataset
from .synthetic import SyntheticDataset

DATASETS: dict[str, Dataset] = {d.name: d for d in (
    SyntheticDataset(),
)}

DEFAULT_DATASET = "synthetic"


def get_dataset(name: str) -> Dataset:
    return lookup(DATASETS, name, "dataset")


__all__ = ["DATASETS", "DEFAULT_DATASET", "Batch", "Dataset", "get_dataset"]
