"""The dataset seam: the runner takes its inputs from the dataset it is handed; synthetic is the default."""

import pytest
import torch

from aio_examples.core.errors import UsageError
from aio_examples.datasets import DATASETS, Dataset, get_dataset
from aio_examples.machine.threads import ThreadChoice
from aio_examples.measurement.runner import RunRequest, run
from aio_examples.measurement.timing import StopRule
from aio_examples.models import get_model


class Ramp(Dataset):
    """A dataset made here, as a new one would be: fixed images, and it counts what it was asked for."""

    name = "ramp"

    def __init__(self):
        self.asked = []

    def example_inputs(self, spec, batch_size, shape, module):
        self.asked.append("example")
        side = shape["input_size"]
        return (torch.linspace(0, 1, batch_size * 3 * side * side).reshape(batch_size, 3, side, side),)


def test_the_runner_measures_on_the_inputs_of_its_dataset_and_records_its_name(tmp_path):
    ramp = Ramp()
    spec = get_model("squeezenet")
    [r] = run(RunRequest(spec, ["eager"], "fp32", 2, ThreadChoice(1, "--threads"), {"input_size": 32},
                         rule=StopRule(timeout_s=0.3), dataset=ramp), tmp_path)
    assert ramp.asked == ["example"] and r.status == "ok"
    assert r.dataset == "ramp" and r.key().dataset == "ramp"
    assert ramp.calibration_inputs(spec, 1, {"input_size": 32}, None, 3)[0][0].shape == (1, 3, 32, 32)
    assert ramp.evaluation(spec, None) is None and list(ramp.batches(spec, 1, {}, None)) == []


def test_synthetic_is_the_default_and_gives_each_models_own_inputs():
    spec = get_model("squeezenet")
    synthetic = get_dataset("synthetic")
    assert isinstance(synthetic, DATASETS["synthetic"]) and not synthetic.labelled
    ours = synthetic.example_inputs(spec, 2, {"input_size": 32}, None)
    theirs = spec.example_inputs(2, {"input_size": 32}, None)
    assert len(ours) == len(theirs) and all(torch.equal(a, b) for a, b in zip(ours, theirs, strict=True))
    with pytest.raises(UsageError, match="dataset 'imagenette' is unknown; accepted: synthetic, imagenet"):
        get_dataset("imagenette")
