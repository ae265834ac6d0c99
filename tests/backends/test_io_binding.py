"""The runtimes' io_binding knob (aio's): inputs bound once must never serve a stale answer."""

import numpy as np
import pytest
import torch
from torch import nn

from aio_examples.backends import PrepareContext, get_backend
from aio_examples.backends.artifacts import weights_digest


class Gated(nn.Module):
    """Two inputs, two outputs: each input must be bound, each output copied out."""

    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(32, 32)

    def forward(self, x, gate):
        return self.lin(x) * torch.sigmoid(gate), (x - gate).abs().mean(-1)


def _expected(module, inputs) -> list[np.ndarray]:
    with torch.no_grad():
        return [t.numpy() for t in module(*inputs)]


def _close(got, want):
    assert len(got) == len(want)
    for g, w in zip(got, want):
        np.testing.assert_allclose(g, w, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("name", ["onnxruntime", "openvino"])
def test_a_new_array_is_bound_again_data_changed_in_place_is_read_and_each_pass_keeps_its_outputs(name):
    backend = get_backend(name)
    if backend.unavailable_reason():
        pytest.skip(backend.unavailable_reason())
    torch.manual_seed(0)
    module = Gated().eval()
    gen = torch.Generator().manual_seed(1)
    inputs = (torch.randn(4, 32, generator=gen), torch.randn(4, 32, generator=gen))
    ctx = PrepareContext(model_name=f"io-binding-{name}", task="custom", family="custom", shape={}, batch_size=4,
                         weights_id=weights_digest(module), knobs={"io_binding": True})
    prepared = backend.prepare(module, inputs, "fp32", 1, ctx)
    assert "bound once" in prepared.info["io_binding"]
    first = prepared.fn(*prepared.inputs)
    _close(first, _expected(module, inputs))
    kept = [a.copy() for a in first]
    other = (torch.randn(4, 32, generator=gen), torch.randn(4, 32, generator=gen))
    _close(prepared.fn(*prepared.convert(other)), _expected(module, other))     # new arrays: bound again
    mine = prepared.inputs
    prepared.fn(*mine)                     # bound to these arrays again
    mine[0][...] *= -1                     # then changed in place: no new binding, the new data must be read
    _close(prepared.fn(*mine), _expected(module, tuple(torch.from_numpy(a.copy()) for a in mine)))
    for a, b in zip(first, kept):          # the first pass's outputs were not overwritten by the later ones
        np.testing.assert_array_equal(a, b)
