"""torch.compile with inductor, freezing on, threads fixed at compile time."""

from .. import precision as prec
from .base import Backend, Prepared


class InductorBackend(Backend):
    name = "inductor"
    description = "torch.compile(backend='inductor') with freezing"

    def prepare(self, model, example_inputs, precision, threads, ctx):
        import torch
        import torch._inductor.config as inductor_config

        model, inputs, mode = prec.cast(model, example_inputs, precision)
        # Inductor bakes the thread count into its generated kernels: set it before compiling.
        inductor_config.cpp.threads = threads
        inductor_config.freezing = True
        compiled = torch.compile(model, backend="inductor")
        return Prepared(compiled, inputs, mode, {"freezing": True, "cpp_threads": threads},
                        compiles_on_first_call=True)
