"""The compiled strategy: torch.compile(backend="aio") (aio_compile/) at the precision's implicit mode, checked
once its first call has compiled it; a generation step with static shapes, a conv net's int8 through inductor."""

import os

from ...core.errors import UnsupportedError
from ..base import Backend, Prepared


def knob_reasons(knobs, model, example_inputs, precision) -> dict:
    """Each of these of the compiled strategy's KNOBS -> why it cannot apply to this model at this precision, or
    None (the conv-net test, a pass with hooks, runs at most once for them all)."""
    import torch

    from ..int8 import is_conv_net

    pt2e = bool(knobs) and precision == "int8" and is_conv_net(model, example_inputs)
    no_conv = not any(isinstance(m, torch.nn.Conv2d) for m in model.modules())
    return {knob: "the layout knob applies to conv nets, and this model has no Conv2d"
            if knob == "channels_last" and no_conv
            else "the compiled strategy's knobs apply to aio's own graph, not to PT2E int8" if pt2e else None
            for knob in knobs}


def prepare(model, example_inputs, precision, threads, ctx, inductor: Backend | None = None) -> Prepared:
    """torch.compile(backend="aio") with the precision's implicit mode, channels-last for conv nets."""
    import torch

    from ... import aio_compile
    from ...core import precision as prec
    from ..int8 import is_conv_net, is_generation_step

    options = {"modelname": ctx.model_name, "threads": threads}
    inputs, mode = example_inputs, "native"
    if is_generation_step(model):
        return _compiled_generation(model, example_inputs, precision, options)
    reasons = knob_reasons(ctx.knobs, model, example_inputs, precision)
    reason = reasons.get("channels_last") or next(filter(None, reasons.values()), None)    # the layout's first
    if reason:
        raise UnsupportedError(reason)
    knobs = dict(ctx.knobs)
    channels_last = knobs.pop("channels_last", None)
    options.update(knobs)         # inductor's cpp_wrapper, max_autotune
    if precision == "bf16":
        model, inputs, mode = prec.cast(model, example_inputs, "bf16")
    elif precision == "fp16":
        options["implicit_fp16_filter"] = os.environ.get("AIO_IMPLICIT_FP16_TRANSFORM_FILTER") or ".*"
        options["implicit_fp16_dtype"] = "FP16"       # the label says fp16: not the CPU's preferred bf16
    elif precision == "int8":
        if is_conv_net(model, example_inputs):
            # The implicit int8 kinds (FullyConnected, Matmul, EmbeddingBag) would leave the convolutions in
            # fp32: conv nets take static PT2E int8 lowered by inductor instead.
            if inductor is None:
                raise UnsupportedError("int8 conv nets run on the inductor backend, and none was handed in")
            prepared = inductor.prepare(model, example_inputs, precision, threads, ctx)
            prepared.info["int8_path"] = "PT2E static int8 lowered by inductor (conv net)"
            return prepared
        options["quantize_int8_filter"] = os.environ.get("AIO_QUANTIZE_INT8_FILTER") or ".*"
    aio_compile.resolve_options(options)          # bad AIO_* values stop here, before compiling
    provider = aio_compile.register()
    model, inputs = aio_compile.prepare_module(model, inputs, channels_last)
    compiled = torch.compile(model, backend="aio", options=options)
    info = {"provider": provider, "options": options, "passes": {}}

    def check():
        """After the first call (the compile): say what the passes did, and refuse a label the graph does not
        honour."""
        report = aio_compile.last_report(ctx.model_name) or {}
        info["passes"] = report
        if precision == "fp16":
            dtype = (report.get("implicit_fp16") or {}).get("dtype")
            if dtype not in (None, "float16", "fp16", "torch.float16"):
                raise UnsupportedError(f"implicit reduced precision runs {dtype} on this CPU, not fp16")
        int8 = report.get("quantize_int8") or {}
        if precision == "int8" and not (int8.get("quantized") or int8.get("onednn_int8_linears")):
            raise UnsupportedError("no op of this model was quantized by the implicit int8 pass")

    return Prepared(_CheckedOnFirstCall(compiled, check), inputs,
                    f"implicit-{precision}" if precision in ("fp16", "int8") else mode, info,
                    compiles_on_first_call=True)


def _compiled_generation(model, example_inputs, precision, options) -> Prepared:
    """A generation step through backend "aio" with static shapes (one prefill graph, one decode graph):
    q/k/v and gate/up projections merged into one GEMM each (fewer, larger weight reads per token), weights
    frozen; int8/int4 as weight-only quantization (torchao) first, whose rows merge too. int8's decode GEMVs run
    with int8 activations (the prefill keeps bf16 ones)."""
    import torch

    from ... import aio_compile
    from ..generation import CompiledDecode, generation_weights

    model, mode, info = generation_weights(model, example_inputs, precision)
    info.update(dynamic=False, prefill="eager")
    if precision == "int8":
        # The decode graph's GEMVs take the int8 weights with int8 activations quantized per call (one row: per
        # token), oneDNN's u8 x s8 kernels, where the weight-only path converts each weight back to bf16.
        options.update(quantize_int8_filter=os.environ.get("AIO_QUANTIZE_INT8_FILTER") or "Linear",
                       int8_out_dtype="BF16")
        mode = "w8a8-dynamic"
        info["activations"] = "bf16 in the prefill; int8 in decoding, quantized per token at run time (asymmetric u8)"
    aio_compile.resolve_options(options)
    info["provider"] = aio_compile.register()
    # Dynamo checks its guards on every module attribute before each call, about 0.1 ms a layer per token here
    # (docs/generation.md). This copy of the model is the harness's own and never changes once compiled, so
    # those guards are dropped; the inputs' guards stay, and aio's folded graphs still check by identity the
    # weights they are given.
    compiled = torch.compile(model, backend="aio", dynamic=False, options={
        **options, "guard_filter_fn": torch.compiler.skip_guard_on_all_nn_modules_unsafe})
    info["options"] = options
    info["guards"] = "module guards skipped (torch.compiler.skip_guard_on_all_nn_modules_unsafe)"

    def check():
        info["passes"] = aio_compile.last_report(options["modelname"]) or {}
        if precision == "int8" and not (info["passes"].get("quantize_int8") or {}).get("onednn_int8_linears"):
            raise UnsupportedError(f"no Linear of the decode step reached oneDNN's int8 GEMM (AIO_QUANTIZE_INT8_FILTER="
                                   f"{options['quantize_int8_filter']!r}); accepted: a filter selecting Linear")

    return Prepared(_CheckedOnFirstCall(CompiledDecode(model, compiled), check), example_inputs, mode, info,
                    compiles_on_first_call=True)


class _CheckedOnFirstCall:
    """The compiled module, checked once its first call has compiled it. Other attributes are the module's
    (a generation step's `new_cache`), as with any torch.compile result."""

    def __init__(self, compiled, check):
        self.compiled, self.check = compiled, check

    def __call__(self, *args):
        out = self.compiled(*args)
        if self.check is not None:
            check, self.check = self.check, None
            check()
        return out

    def __getattr__(self, name):
        if name in ("compiled", "check"):      # not set yet (a copy being made): no recursion
            raise AttributeError(name)
        return getattr(self.compiled, name)
