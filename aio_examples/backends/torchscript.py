"""TorchScript: trace (or script, where the model needs it), freeze, optimize for inference."""

from .. import precision as prec
from .base import Backend, Prepared


class TorchScriptBackend(Backend):
    name = "torchscript"
    description = "torch.jit trace/script + freeze + optimize_for_inference"

    def prepare(self, model, example_inputs, precision, threads, ctx):
        import torch

        model, inputs, mode = prec.cast(model, example_inputs, precision)
        how = getattr(model, "jit_mode", "trace")
        with torch.no_grad():
            scripted = torch.jit.script(model) if how == "script" else torch.jit.trace(model, inputs, strict=False)
            frozen = torch.jit.freeze(scripted.eval())
            optimized = torch.jit.optimize_for_inference(frozen)
        return Prepared(optimized, inputs, mode, {"jit": how, "frozen": True, "optimize_for_inference": True})
