"""What the torch backends share for a generation step (a decoding step over a static KV cache): the copy they
start from, its weights at a precision, and compiling its decode step while the prefill runs eager."""

import copy

from ..core import precision as prec
from .int8 import is_generation_step, weight_only

GENERATION_IN_BF16 = ("bf16", "int8", "int4")     # a generation step's precisions whose weights start at bf16


def generation_copy(model, precision: str):
    """The copy of a built fp32 model a backend prepares at `precision`. A generation step at bf16, int8 or int4
    runs bf16 weights (cast, or quantized weight-only from bf16 with bf16 activations), so it is copied straight
    at bf16; anything else is copied as it is."""
    if is_generation_step(model) and precision in GENERATION_IN_BF16:
        return prec.cast_copy(model, "bf16")
    return copy.deepcopy(model)


def generation_weights(model, example_inputs: tuple, precision: str):
    """A generation step at `precision`: weight-only int8/int4 (`weight_only`), else the model cast.
    Returns (model, precision_mode, info)."""
    if precision in ("int8", "int4"):
        return weight_only(model, precision)
    model, _, mode = prec.cast(model, example_inputs, precision)
    return model, mode, {}


class CompiledDecode:
    """A generation step whose decode steps run compiled (one static-shape graph, weights frozen) and whose
    prefill runs eager. Compiling the prefill too would add a second graph with its own frozen, repacked copy
    of every weight (2.5 GB more for Llama 3.2 1B at bf16), and its GEMMs over the whole prompt gained nothing
    from compiling here (docs/generation.md). The generation loop calls `prefill` on a new cache, then the
    step itself; other attributes (`new_cache`, `_orig_mod`) are the compiled module's."""

    def __init__(self, step, compiled):
        self.step, self.compiled = step, compiled

    def __call__(self, *args):
        return self.compiled(*args)

    def prefill(self, *args):
        out = self.step(*args)
        _unmark_static(args[-2])
        return out

    def __getattr__(self, name):
        if name in ("step", "compiled"):       # not set yet (a copy being made): no recursion
            raise AttributeError(name)
        return getattr(self.compiled, name)


def _unmark_static(cache) -> None:
    """transformers marks a static cache's tensors as static addresses when an eager call first fills them;
    a graph compiled with freezing would then fold the first cache's tensors in as constants, and every later
    cache would be written through the first one's. Unmarked, they stay inputs of the decode graph."""
    import torch

    from ..models.nlp import cache_layers

    for layer in cache_layers(cache):
        for value in vars(layer).values():
            if isinstance(value, torch.Tensor) and hasattr(value, "_dynamo_static_input_type"):
                del value._dynamo_static_input_type
