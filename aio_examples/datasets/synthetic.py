"""The default dataset: each model's own made-up inputs (models/), no labels and so no task metrics."""

from .base import Dataset


class SyntheticDataset(Dataset):
    name = "synthetic"

    def example_inputs(self, spec, batch_size, shape, module):
        return spec.example_inputs(batch_size, shape, module)

    def calibration_inputs(self, spec, batch_size, shape, module, n):
        return spec.calibration_inputs(batch_size, shape, module, n)
