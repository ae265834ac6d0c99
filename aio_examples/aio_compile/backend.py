"""The compiler function behind backend "aio", and the module preparation that goes with it."""

import operator
from collections import Counter

import torch
from torch._dynamo.utils import counters

from . import passes, reports
from .cpu import int8_activation_max, reduced_dtype
from .options import resolve_options

_OUT_DTYPES = {"FP32": torch.float32, "FP16": torch.float16, "BF16": torch.bfloat16}


def _qlinear_lowered() -> int:
    return counters["inductor"]["qlinear_weight_prepack_matcher_count"]


FOLDED_GRAPHS_MAX = 4       # graphs with other instances' weights folded in; past it, one taking weights as inputs


def aio_backend(gm: torch.fx.GraphModule, example_inputs, options: dict | None = None, mode: str | None = None,
                fold: bool = True):
    """Compile one dynamo graph: the AIO_* passes, then inductor with freezing.

    The module's parameters and buffers become constants, as with inductor's freezing: inductor folds
    what the passes add and prepacks weights for oneDNN, and later changes to the weights are not seen
    (compile again, after torch._dynamo.reset()). Folding needs the first call to run without autograd
    (torch.no_grad() or torch.inference_mode()). `cpp.threads` is fixed to `options["threads"]` or
    torch's current thread count, because inductor bakes it into its kernels.
    Layout is the caller's choice: conv nets run best with the module and 4-D inputs in channels-last,
    which `prepare_module` does.
    """
    from torch._inductor import list_mode_options
    from torch._inductor.compile_fx import compile_fx

    opts = resolve_options(options)
    threads = opts.threads or torch.get_num_threads()
    # With autograd on, weights must stay inputs that gradients reach: no constants, no freezing.
    freezing = fold and not torch.is_grad_enabled()
    lifted, keep = passes.lift_constants(gm, example_inputs, enabled=freezing)
    report = {"provider": "aio_examples", "options": opts.to_dict(), "constants": len(example_inputs) - len(keep)}
    if opts.merge_linear:
        report["merge_linear"] = passes.merge_linears(lifted)
    if opts.stream_gemv:
        report["stream_gemv"] = passes.stream_gemv(lifted)
    if opts.decode_attention:
        report["decode_attention"] = passes.decode_attention(lifted)
    if opts.int8_kinds:
        act_max, why = int8_activation_max()
        report["quantize_int8"] = {**passes.quantize_int8(lifted, opts.int8_kinds, _OUT_DTYPES[opts.int8_out_dtype],
                                                          act_max), "out_dtype": opts.int8_out_dtype, "why": why}
    if opts.fp16_kinds:
        dtype, why = reduced_dtype() if opts.fp16_dtype == "AUTO" else \
            (_OUT_DTYPES[opts.fp16_dtype], f"{opts.fp16_dtype} asked for by name")
        report["implicit_fp16"] = {**passes.reduce_precision(lifted, opts.fp16_kinds, dtype), "why": why}
    lifted.graph.lint()
    lifted.recompile()
    report["graph_ops"] = dict(Counter(k for k in map(passes.op_kind, lifted.graph.nodes) if k))

    patches = {**(list_mode_options(mode) if mode else {}), "freezing": True, "cpp.threads": threads}
    if opts.cpp_wrapper:
        patches["cpp_wrapper"] = True
    if opts.max_autotune:           # inductor's CPU GEMM templates against ATen's, each shape benchmarked once
        patches.update(max_autotune=True, max_autotune_gemm_backends="CPP,ATEN")
    lowered = _qlinear_lowered()
    with torch._inductor.config.patch(patches):
        compiled = compile_fx(lifted, [example_inputs[i] for i in keep])
    report["inductor"] = {"freezing": freezing, "cpp_threads": threads, "cpp_wrapper": opts.cpp_wrapper,
                          "max_autotune": opts.max_autotune}
    if "quantize_int8" in report:
        report["quantize_int8"]["onednn_int8_linears"] = _qlinear_lowered() - lowered
    reports.record(opts.modelname, options, report)
    if len(keep) == len(example_inputs):
        return compiled
    # Dynamo guards no parameter's identity unless inductor's freezing is on globally while it traces, so
    # another instance of the same module class (other weights, the same code) reaches this graph and its
    # weights arrive as the inputs folded away: this graph would answer with the first instance's weights.
    # So the folded inputs are checked by identity (a few microseconds for hundreds of tensors), and other
    # weights get a graph of their own (a few; weights that are new objects at every call, one unfolded graph).
    folded = [i for i in range(len(example_inputs)) if i not in set(keep)]
    # itemgetter of one index gives the item, not a 1-tuple
    pick_folded = operator.itemgetter(*folded) if len(folded) > 1 else (lambda xs: (xs[folded[0]],))
    own = pick_folded(example_inputs)
    others: list = []       # (the folded inputs, the graph compiled for them)
    unfolded = []

    def run(*args):
        seen = pick_folded(args)
        if all(map(operator.is_, seen, own)):
            return compiled(*[args[i] for i in keep])
        for weights, fn in others:
            if all(map(operator.is_, seen, weights)):
                return fn(*args)
        if len(others) < FOLDED_GRAPHS_MAX:
            others.append((seen, aio_backend(gm, list(args), options, mode)))
            return others[-1][1](*args)
        if not unfolded:
            unfolded.append(aio_backend(gm, list(args), options, mode, fold=False))
        return unfolded[0](*args)

    return run


def _has_conv2d(model) -> bool:
    return any(isinstance(m, torch.nn.Conv2d) for m in model.modules())


def prepare_module(model, inputs: tuple, channels_last: bool | None = None):
    """(model, inputs) in the layout the aio backend runs fastest: channels-last for conv nets.

    With `channels_last=None` that means modules containing Conv2d. Only 4-D floating inputs change.
    """
    if channels_last is None:
        channels_last = _has_conv2d(model)
    if not channels_last:
        return model, inputs
    fmt = torch.channels_last
    model = model.to(memory_format=fmt)
    inputs = tuple(x.contiguous(memory_format=fmt) if isinstance(x, torch.Tensor) and x.dim() == 4
                   and x.is_floating_point() else x for x in inputs)
    return model, inputs
