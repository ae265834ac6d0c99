"""`torch.compile(model, backend="aio", options={"modelname": "m"})`: Ampere's torch.compile interface on
open components: FX passes steered by Ampere's environment variables, then inductor with freezing.

- `AIO_MERGE_LINEAR` (default 1): linears reading the same input run as one linear over concatenated weights.
- `AIO_IMPLICIT_FP16_TRANSFORM_FILTER` (regex over Linear/FullyConnected, Conv2d/Conv, MatMul): those ops
  run in bf16 where the CPU has bf16 instructions, else fp16, with fp32 in and out.
- `AIO_QUANTIZE_INT8_FILTER` (regex over FullyConnected, Matmul, EmbeddingBag) and
  `AIO_QUANTIZE_INT8_CONVERT_OUT_DTYPE` (FP32, FP16, BF16): int8 weights, activations quantized on the fly.

`options` keys `merge_linear`, `implicit_fp16_filter`, `quantize_int8_filter`, `int8_out_dtype` override
the variables; `implicit_fp16_dtype` (AUTO, FP16, BF16) pins the implicit transform's precision (`-p fp16`
pins FP16); `threads` sets inductor's thread count. `last_report(modelname)` says what the passes did.

Importing this package does not import torch (`import aio_examples` calls `install()`).
"""

from .options import AioOptions, resolve_options
from .registration import install, provider, register
from .reports import last_report


def __getattr__(name):
    # Lazy: these import torch.
    if name in ("aio_backend", "prepare_module"):
        from . import backend

        return getattr(backend, name)
    raise AttributeError(name)


__all__ = ["AioOptions", "aio_backend", "install", "last_report", "prepare_module", "provider", "register",
           "resolve_options"]
