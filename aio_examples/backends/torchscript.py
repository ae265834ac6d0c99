"""TorchScript: trace (or script, where the model needs it), freeze, optimize for inference."""

from ..core import precision as prec
from ..core.errors import UnsupportedError
from ..machine.fpmath import TORCH_MODES
from . import int8 as quantize
from .base import Backend, Prepared


class TorchScriptBackend(Backend):
    name = "torchscript"
    description = "torch.jit trace/script + freeze + optimize_for_inference"
    fpmath_modes = TORCH_MODES            # set for the process by the runner (machine/fpmath.py)

    def prepare(self, model, example_inputs, precision, threads, ctx):
        import torch

        if precision == "int8":   # quantize first: the trace then records the int8 Linear kernels
            model, mode, info = quantize.eager_int8(model, example_inputs)
            inputs = example_inputs
        else:
            model, inputs, mode = prec.cast(model, example_inputs, precision)
            info = {}
        how = getattr(model, "jit_mode", "trace")
        # optimize_for_inference turns Linear into matmul on a transposed weight, which has no fast fp16
        # CPU kernel (bert_base ran about 20x slower than without it): fp16 stops at freezing.
        optimize = precision != "fp16"
        with torch.no_grad():
            scripted = torch.jit.script(model) if how == "script" else torch.jit.trace(model, inputs, strict=False)
            frozen = torch.jit.freeze(scripted.eval())
            optimized = torch.jit.optimize_for_inference(frozen) if optimize else frozen
            try:   # the interpreter specializes the graph on its first pass; a missing kernel shows up here
                optimized(*inputs)
            except Exception as exc:
                gap = prec.kernel_gap(exc)
                if gap:
                    raise UnsupportedError(f"{precision} on torchscript: {gap}") from None
                if not optimize:
                    raise
                # optimize_for_inference's oneDNN rewrites refuse some shapes (e.g. adaptive pooling up to a
                # larger size, vgg_16 below 224x224): the frozen graph without them still runs.
                optimized, optimize = torch.jit.freeze(scripted.eval()), False
                optimized(*inputs)
                # TorchScript puts the cause on the last line of its error, under its own traceback.
                info["optimize_for_inference_refused"] = str(exc).strip().splitlines()[-1][:300]
        if precision == "int8":
            info["int8_kernels"] = quantize.torchscript_int8_kernels(optimized)
        return Prepared(optimized, inputs, mode, {**info, "jit": how, "frozen": True, "optimize_for_inference": optimize})
