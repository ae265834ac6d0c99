"""torch.compile with inductor, freezing on, threads fixed at compile time."""

import time

import torch

from .. import precision as prec
from ..log import logger
from .base import Backend, Prepared


class InductorBackend(Backend):
    name = "inductor"
    description = "torch.compile(backend='inductor') with freezing"

    def prepare(self, model, example_inputs, precision, threads):
        import torch._inductor.config as inductor_config

        model, inputs, mode = prec.cast(model, example_inputs, precision)
        # Inductor bakes the thread count into its generated kernels: set it before compiling.
        inductor_config.cpp.threads = threads
        inductor_config.freezing = True
        compiled = torch.compile(model, backend="inductor")
        start = time.perf_counter()
        with torch.no_grad():
            compiled(*inputs)          # compiles now, so preparation time includes it
        compile_s = time.perf_counter() - start
        logger.debug("inductor compiled %s in %.1f s", type(model).__name__, compile_s)
        return Prepared(compiled, inputs, mode, {"freezing": True, "cpp_threads": threads,
                                                 "compile_call_s": round(compile_s, 3)})
