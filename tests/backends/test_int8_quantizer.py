"""The PT2E quantizer follows the CPU: torchao's Arm inductor quantizer on aarch64, the x86 one elsewhere."""

import platform

import pytest
import torch
from torch import nn

from aio_examples.backends import int8 as quantize


class ConvNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.features = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(),
                                      nn.Conv2d(8, 16, 3, padding=1), nn.ReLU())
        self.head = nn.Sequential(nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(16, 4))

    def forward(self, x):
        return self.head(self.features(x))


def _activation_dtypes(graph) -> set:
    """The dtypes activations are quantized to: the last argument of each quantize_per_tensor call."""
    return {n.args[-1] for n in graph.graph.nodes
            if n.op == "call_function" and str(n.target).startswith("quantized_decomposed.quantize_per_tensor")}


@pytest.mark.parametrize("machine, name", [("aarch64", "ArmInductorQuantizer"), ("arm64", "ArmInductorQuantizer"),
                                           ("x86_64", "X86InductorQuantizer"), ("AMD64", "X86InductorQuantizer")])
@pytest.mark.parametrize("dynamic", [False, True])
def test_the_quantizer_is_chosen_by_the_machine(machine, name, dynamic):
    quantizer, info = quantize.pt2e_quantizer(dynamic, machine)
    assert type(quantizer).__name__ == name
    assert info["quantizer"] == f"torchao {name} ({'dynamic' if dynamic else 'static'})"
    assert info["quantizer_for"] == machine
    assert ("reduce_range" in info) == (name == "X86InductorQuantizer")   # a VNNI matter, x86 only


def test_this_machine_gets_its_own_quantizer():
    _, info = quantize.pt2e_quantizer(False)
    assert info["quantizer_for"] == platform.machine()


@pytest.mark.parametrize("machine, activations", [("aarch64", {torch.int8}), ("x86_64", {torch.uint8})])
def test_the_arm_quantizer_annotates_a_conv_net_here(machine, activations):
    """Only the annotation runs here: inductor's x86 lowering takes uint8 activations, so an Arm graph is
    lowered to int8 kernels only on Arm (where `lowered_int8_kernels` checks it did)."""
    net, x = ConvNet().eval(), torch.rand(2, 3, 16, 16, generator=torch.Generator().manual_seed(0))
    graph, info = quantize.pt2e_int8(net, (x,), machine=machine)
    assert info["quantizer_for"] == machine and info["calibration_batches"] == 1
    assert _activation_dtypes(graph) == activations
    assert info["qdq_ops"]["quantize_per_tensor"] >= 3        # both convolutions and the classifier's input
    with torch.no_grad():
        assert torch.nn.functional.cosine_similarity(graph(x).flatten(), net(x).flatten(), 0) > 0.99
