"""PyTorch eager mode: the reference every speedup is measured against."""

from ..core import precision as prec
from ..machine.fpmath import TORCH_MODES
from . import int8 as quantize
from .base import Backend, Prepared


class EagerBackend(Backend):
    name = "eager"
    description = "PyTorch eager mode"
    fpmath_modes = TORCH_MODES            # set for the process by the runner (machine/fpmath.py)

    def prepare(self, model, example_inputs, precision, threads, ctx):
        if precision in ("int8", "int4") and quantize.is_generation_step(model):
            model, mode, info = quantize.weight_only(model, precision)
            return Prepared(model, example_inputs, mode, info)
        if precision == "int8":
            model, mode, info = quantize.eager_int8(model, example_inputs)
            return Prepared(model, example_inputs, mode, info)
        model, inputs, mode = prec.cast(model, example_inputs, precision)
        return Prepared(model, inputs, mode)
