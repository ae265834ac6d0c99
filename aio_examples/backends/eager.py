"""PyTorch eager mode: the reference every speedup is measured against."""

from .. import precision as prec
from .base import Backend, Prepared


class EagerBackend(Backend):
    name = "eager"
    description = "PyTorch eager mode"

    def prepare(self, model, example_inputs, precision, threads, ctx):
        model, inputs, mode = prec.cast(model, example_inputs, precision)
        return Prepared(model, inputs, mode)
