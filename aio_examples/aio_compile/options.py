"""What the aio backend does to a graph: environment variables, overridable by `torch.compile(options=...)`.

Read when a graph is compiled (not at import), so a script may set them after importing torch.
Imports no torch: the CLI validates these before torch loads.
"""

import os
import re
from dataclasses import dataclass

from ..core.errors import UsageError

ENV_MERGE_LINEAR = "AIO_MERGE_LINEAR"
ENV_STREAM_GEMV = "AIO_STREAM_GEMV"
ENV_DECODE_ATTENTION = "AIO_DECODE_ATTENTION"
ENV_FP16_FILTER = "AIO_IMPLICIT_FP16_TRANSFORM_FILTER"
ENV_INT8_FILTER = "AIO_QUANTIZE_INT8_FILTER"
ENV_INT8_OUT = "AIO_QUANTIZE_INT8_CONVERT_OUT_DTYPE"

# Op kinds the filters select, each under the names users know it by (PyTorch, ONNX, Ampere's docs).
# A filter is a regular expression; a kind is selected when the expression matches one of its names in full.
KIND_NAMES = {
    "Linear": ("Linear", "FullyConnected", "Gemm"),
    "Conv2d": ("Conv2d", "Conv"),
    "MatMul": ("MatMul", "Matmul", "BatchMatMul", "mm", "bmm"),
    "EmbeddingBag": ("EmbeddingBag",),
}
FP16_KINDS = ("Linear", "Conv2d", "MatMul")
INT8_KINDS = ("Linear", "MatMul", "EmbeddingBag")
INT8_OUT_DTYPES = ("FP32", "FP16", "BF16")
# The implicit transform's reduced precision: AUTO is bf16 where the CPU has bf16 instructions, else fp16;
# `-p fp16` asks for FP16 by name (a run labelled fp16 must compute in fp16).
FP16_DTYPES = ("AUTO", "FP16", "BF16")

OPTION_KEYS = ("modelname", "threads", "merge_linear", "stream_gemv", "decode_attention", "implicit_fp16_filter", "implicit_fp16_dtype",
               "quantize_int8_filter", "int8_out_dtype", "cpp_wrapper", "max_autotune")


@dataclass(frozen=True)
class AioOptions:
    modelname: str = "model"
    threads: int | None = None                 # None: torch.get_num_threads() at compile time
    merge_linear: bool = True
    decode_attention: bool = True   # one query row's attention on the cache as stored (passes.decode_attention)
    stream_gemv: bool = False       # single-row linears as a streaming multiply-and-sum (passes.stream_gemv)
    fp16_filter: str | None = None
    fp16_kinds: frozenset = frozenset()
    fp16_dtype: str = "AUTO"
    int8_filter: str | None = None
    int8_kinds: frozenset = frozenset()
    int8_out_dtype: str = "FP32"
    # inductor's own settings (options only, no variable): the optimized backend tries them as tuning knobs
    cpp_wrapper: bool = False       # the graph's kernels called from generated C++, not Python
    max_autotune: bool = False      # GEMMs from autotuned C++ templates (AMX/AVX-512 microkernels) or ATen

    def to_dict(self) -> dict:
        """What the report records: the settings as given and the op kinds they selected."""
        return {"merge_linear": self.merge_linear, "stream_gemv": self.stream_gemv,
                "decode_attention": self.decode_attention,
                "implicit_fp16_filter": self.fp16_filter, "implicit_fp16_kinds": sorted(self.fp16_kinds),
                "implicit_fp16_dtype": self.fp16_dtype,
                "quantize_int8_filter": self.int8_filter, "quantize_int8_kinds": sorted(self.int8_kinds),
                "int8_out_dtype": self.int8_out_dtype, "cpp_wrapper": self.cpp_wrapper,
                "max_autotune": self.max_autotune}


def _names(kinds) -> str:
    return ", ".join(name for kind in kinds for name in KIND_NAMES[kind])


def select_kinds(label: str, raw, supported: tuple[str, ...]) -> tuple[str | None, frozenset]:
    """Compile filter `raw` and return it with the kinds it selects; empty or None means off."""
    if raw is None or str(raw).strip() == "":
        return None, frozenset()
    pattern = str(raw).strip()
    try:
        regex = re.compile(pattern)
    except re.error as exc:
        raise UsageError(f"{label}={pattern!r} is not a valid regular expression ({exc}); "
                         f"accepted: a regex over {_names(supported)}, or '.*' for all") from None
    kinds = frozenset(k for k in supported if any(regex.fullmatch(name) for name in KIND_NAMES[k]))
    if not kinds:
        raise UsageError(f"{label}={pattern!r} selects no supported op; "
                         f"accepted: a regex over {_names(supported)}, or '.*' for all")
    return pattern, kinds


def _flag(label: str, raw) -> bool:
    if isinstance(raw, bool):
        return raw
    text = str(raw).strip()
    if text in ("0", "1"):
        return text == "1"
    raise UsageError(f"{label}={raw!r} is invalid; accepted: 1 (on) or 0 (off)")


def _dtype(label: str, raw, accepted: tuple[str, ...]) -> str:
    text = str(raw).strip().upper()
    if text not in accepted:
        raise UsageError(f"{label}={raw!r} is invalid; accepted: {', '.join(accepted)}")
    return text


def _threads(raw) -> int:
    if isinstance(raw, bool) or not isinstance(raw, int) or raw < 1:
        raise UsageError(f"options['threads']={raw!r} is invalid; accepted: a whole number >= 1")
    return raw


def resolve_options(options: dict | None = None, environ=None) -> AioOptions:
    """Settings for one compile: `options` keys win over the environment variables.

    Raises UsageError naming the variable (or options key), the bad value and what is accepted.
    """
    options = dict(options or {})
    environ = os.environ if environ is None else environ
    unknown = sorted(set(options) - set(OPTION_KEYS))
    if unknown:
        raise UsageError(f"options key {unknown[0]!r} is unknown to backend 'aio'; accepted: {', '.join(OPTION_KEYS)}")

    def pick(key: str, env: str, default=None):
        if key in options:
            return f"options[{key!r}]", options[key]
        return env, environ.get(env, default)

    merge = _flag(*pick("merge_linear", ENV_MERGE_LINEAR, "1"))
    gemv = _flag(*pick("stream_gemv", ENV_STREAM_GEMV, "0"))
    attention = _flag(*pick("decode_attention", ENV_DECODE_ATTENTION, "1"))
    fp16_filter, fp16_kinds = select_kinds(*pick("implicit_fp16_filter", ENV_FP16_FILTER), FP16_KINDS)
    int8_filter, int8_kinds = select_kinds(*pick("quantize_int8_filter", ENV_INT8_FILTER), INT8_KINDS)
    out_dtype = _dtype(*pick("int8_out_dtype", ENV_INT8_OUT, "FP32"), INT8_OUT_DTYPES)
    fp16_dtype = _dtype("options['implicit_fp16_dtype']", options.get("implicit_fp16_dtype", "AUTO"), FP16_DTYPES)
    threads = _threads(options["threads"]) if options.get("threads") is not None else None
    return AioOptions(modelname=str(options.get("modelname", "model")), threads=threads, merge_linear=merge, stream_gemv=gemv,
                      decode_attention=attention,
                      fp16_filter=fp16_filter, fp16_kinds=fp16_kinds, fp16_dtype=fp16_dtype, int8_filter=int8_filter,
                      int8_kinds=int8_kinds, int8_out_dtype=out_dtype,
                      cpp_wrapper=_flag("options['cpp_wrapper']", options.get("cpp_wrapper", False)),
                      max_autotune=_flag("options['max_autotune']", options.get("max_autotune", False)))
