"""Dataset registry: one line per dataset, each in its own module (see base.py for what one provides)."""

from ..core.errors import UsageError
from .base import Batch, Dataset
from .synthetic import SyntheticDataset

DATASETS: dict[str, Dataset] = {d.name: d for d in (
    SyntheticDataset(),
)}

DEFAULT_DATASET = "synthetic"


def get_dataset(name: str) -> Dataset:
    try:
        return DATASETS[name]
    except KeyError:
        raise UsageError(f"dataset {name!r} is unknown; accepted: {', '.join(DATASETS)}") from None


__all__ = ["DATASETS", "DEFAULT_DATASET", "Batch", "Dataset", "get_dataset"]
