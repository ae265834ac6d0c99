"""torch.compile with inductor, freezing on, threads fixed at compile time."""

from ..core import precision as prec
from ..machine.fpmath import TORCH_MODES
from . import int8 as quantize
from .base import Backend, Prepared
from .generation import CompiledDecode, generation_weights


class InductorBackend(Backend):
    name = "inductor"
    description = "torch.compile(backend='inductor') with freezing"
    copies_held = 2.0
    fpmath_modes = TORCH_MODES            # set for the process by the runner (machine/fpmath.py)

    def prepare(self, model, example_inputs, precision, threads, ctx):
        import torch
        import torch._inductor.config as inductor_config

        # Inductor bakes the thread count into its generated kernels: set it before compiling.
        inductor_config.cpp.threads = threads
        inductor_config.freezing = True    # int8 lowering (weight prepacking) happens in freezing passes
        info = {"freezing": True, "cpp_threads": threads}
        if quantize.is_generation_step(model):
            return self._generation(model, example_inputs, precision, info)
        if precision == "int8":
            calibration = ctx.calibration_inputs(example_inputs, quantize.CALIBRATION_BATCHES)
            graph, mode, qinfo = quantize.inductor_int8(model, example_inputs, calibration)
            compiled = torch.compile(graph, backend="inductor")
            # Compile now, to prove from the generated code that int8 kernels run.
            qinfo["int8_kernels"] = quantize.lowered_int8_kernels(compiled, example_inputs)
            return Prepared(compiled, example_inputs, mode, {**qinfo, **info})
        model, inputs, mode = prec.cast(model, example_inputs, precision)
        compiled = torch.compile(model, backend="inductor")
        return Prepared(compiled, inputs, mode, info, compiles_on_first_call=True)

    @staticmethod
    def _generation(model, example_inputs, precision, info):
        """A decoding step over a static KV cache: the decode step compiled with static shapes, one graph for
        every step (cache positions are tensors, so no step recompiles), weights frozen; the prefill eager."""
        import torch

        model, mode, qinfo = generation_weights(model, example_inputs, precision)
        info.update(qinfo, dynamic=False, prefill="eager")
        compiled = CompiledDecode(model, torch.compile(model, backend="inductor", dynamic=False))
        return Prepared(compiled, example_inputs, mode, info, compiles_on_first_call=True)
