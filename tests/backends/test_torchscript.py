"""The TorchScript backend on graphs its oneDNN rewrite (optimize_for_inference) refuses."""

import torch
from torch import nn

from aio_examples.backends import BACKENDS, PrepareContext


def test_a_shape_optimize_for_inference_refuses_runs_on_the_frozen_graph():
    # Adaptive pooling from 4x4 up to 7x7, like vgg_16 below 224x224: the oneDNN rewrite cannot.
    net = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.AdaptiveAvgPool2d(7), nn.Flatten(),
                        nn.Linear(8 * 49, 4)).eval()
    x = (torch.randn(1, 3, 4, 4),)
    ctx = PrepareContext(model_name="pool", task="custom", family="vision", shape={}, batch_size=1,
                         weights_id="-", calibration=lambda n: [x] * n)
    with torch.no_grad():
        prepared = BACKENDS["torchscript"].prepare(net, x, "fp32", 1, ctx)
        torch.testing.assert_close(prepared.fn(*prepared.inputs), net(*x))
    assert prepared.info["optimize_for_inference"] is False
    assert "not divisible" in prepared.info["optimize_for_inference_refused"]
