"""int8 quantization shared by the torch backends: which scheme fits a model, applying it, and proof it ran.

Two schemes, chosen by `is_conv_net` (do convolutions or Linear layers do most of the work):

- Linear-heavy models (transformers, ViT) take *dynamic* int8: weights are int8 ahead of time and
  activations are quantized on each call from their own range, so no calibration is needed.
  Without a compiler (eager, TorchScript) that is torch.ao `quantize_dynamic`, which swaps each
  `nn.Linear` for a module calling the `quantized::linear_dynamic` kernel (`dynamic_int8`); summing
  `nn.EmbeddingBag` tables (a recommender's) get 8-bit rows with their own scale and offset there too.
  Dynamo cannot trace those modules' packed weights (it breaks the graph at each one), so inductor
  takes the PT2E flow instead (`pt2e_int8(..., dynamic=True)`).
- Conv nets take *static* int8: activation scales come from calibration batches. That is the PT2E
  flow (`torch.export`, torchao's inductor quantizer for the CPU, calibrate, convert): the converted graph is
  quantize/dequantize around fp32 ops, and only inductor's lowering turns it into oneDNN int8
  convolutions. Run as it is, it would be fp32 work labelled int8, so no backend without that
  lowering may run it (`eager_int8` refuses conv nets).

Every path proves int8 executed: `quantized_modules`, `torchscript_int8_kernels` and `lowered_int8_kernels`
count the int8 kernels that will run, and raise `UnsupportedError` when there are none.
"""

import logging
import math
import re
from collections import Counter
from contextlib import contextmanager

from ..core.errors import UnsupportedError
from ..core.log import logger

DYNAMIC_LINEAR = "int8-dynamic-linear"    # torch.ao quantize_dynamic: int8 Linear kernels, no compiler
ROWWISE_TABLES = "int8-dynamic-linear+rowwise-embedding-bags"   # and 8-bit row-wise EmbeddingBag tables (DLRM)
PT2E_STATIC = "int8-pt2e-static"          # PT2E, calibrated activation scales, lowered by inductor
PT2E_DYNAMIC = "int8-pt2e-dynamic"        # PT2E, per-call activation scales, lowered by inductor
CALIBRATION_BATCHES = 8
NEEDS_TORCHAO = "int8 through inductor needs torchao's PT2E quantizer ({exc}); pip install torchao"
STATIC_NEEDS_INDUCTOR = ("static int8 for conv nets runs through inductor lowering; "
                         "use --backend inductor or aio")
GENERATION_STEP = ("int8 PT2E captures one fixed graph, but a generation step takes a KV cache that it "
                   "mutates and changes shape between prefill and decoding")
DATA_DEPENDENT = ("int8 PT2E captures one fixed graph, but {name} has data-dependent control flow and shapes "
                  "(it is scripted, not traced), which torch.export cannot capture")
# Calls of int8 kernels in inductor's generated wrapper code.
_LOWERED_INT8 = re.compile(r"torch\.ops\.(onednn\.q\w+|quantized\.\w+|aten\._int_mm)\b")


def work_split(module, example_inputs: tuple | None = None) -> tuple[int, int]:
    """(convolution, Linear) work in `module`: multiply-accumulates of one pass over `example_inputs`
    when given, else parameter counts (which rank VGG's big Linear classifier above its convolutions)."""
    import torch
    from torch import nn

    layers = [m for m in module.modules() if isinstance(m, (nn.modules.conv._ConvNd, nn.Linear))]
    if example_inputs is None:
        conv = sum(p.numel() for m in layers if isinstance(m, nn.modules.conv._ConvNd) for p in m.parameters(False))
        return conv, sum(p.numel() for m in layers if isinstance(m, nn.Linear) for p in m.parameters(False))
    macs = {"conv": 0, "linear": 0}

    def count(layer, _inputs, out):
        if isinstance(layer, nn.Linear):
            macs["linear"] += out.numel() * layer.in_features
        else:
            macs["conv"] += out.numel() * layer.in_channels // layer.groups * math.prod(layer.kernel_size)

    handles = [m.register_forward_hook(count) for m in layers]
    try:
        with torch.no_grad():
            module(*example_inputs)
    finally:
        for handle in handles:
            handle.remove()
    return macs["conv"], macs["linear"]


def is_conv_net(module, example_inputs: tuple | None = None) -> bool:
    """True when convolutions do most of the work (static int8 with calibration suits these);
    Linear-heavy models (transformers, ViT) take dynamic int8 instead. Pass `example_inputs` to
    weigh the work one pass does rather than the parameters."""
    if callable(getattr(module, "is_conv_net", None)):   # a model that is a file (an ONNX graph) counts its own
        return module.is_conv_net()
    conv, linear = work_split(module, example_inputs)
    return conv > linear


def is_generation_step(module) -> bool:
    """A decoding step over a KV cache (it makes its own cache): one exported graph cannot serve it."""
    return callable(getattr(module, "new_cache", None))


def hf_conv1d_to_linear(module) -> int:
    """Replace transformers' `Conv1D` (GPT-2's projections: `x @ W + b`, weight stored (in, out)) by the
    equivalent `nn.Linear`, so Linear quantizers see them. Returns how many were replaced."""
    import torch
    from torch import nn

    try:
        from transformers.pytorch_utils import Conv1D
    except ImportError:
        return 0
    replaced = 0
    for parent in list(module.modules()):
        for name, child in list(parent.named_children()):
            if isinstance(child, Conv1D):
                linear = nn.Linear(child.weight.shape[0], child.nf, dtype=child.weight.dtype)
                with torch.no_grad():
                    linear.weight.copy_(child.weight.t())
                    linear.bias.copy_(child.bias)
                setattr(parent, name, linear)
                replaced += 1
    return replaced


def quantized_modules(module) -> int:
    """How many dynamically quantized int8 Linear modules `module` holds."""
    from torch.ao.nn.quantized.dynamic import Linear as DynamicQuantLinear

    return sum(isinstance(m, DynamicQuantLinear) for m in module.modules())


INT4_GROUP = 128       # weights per int4 scale: the usual size of published w4a16 checkpoints (GPTQ, AWQ)
INT4_ONLY_GENERATION = ("int4 is weight-only quantization for text generation, whose decoding is bound by the "
                        "bytes of weights it reads; accepted for this model: int8")


def weight_only(model, precision: str):
    """Weight-only int8 or int4 of a generation step's Linear layers with bf16 activations (torchao): the
    weights read on every decoded token shrink 2x or 4x. Returns (model, precision_mode, info).

    int8: `Int8WeightOnlyConfig` (per-channel scales). int4: `PrototypeInt4WeightOnlyConfig` (groups of
    INT4_GROUP, packed for `aten._weight_int4pack_mm_for_cpu`); layers whose shapes the packing refuses (out
    features not a multiple of 16, in features not a multiple of the group) stay bf16 and are counted.
    torchao's dynamic int8 activations are not offered: under inductor they returned wrong logits here.
    """
    import torch
    from torch import nn

    try:
        with _quiet_torchao():
            from torchao.prototype.quantization.int4 import PrototypeInt4WeightOnlyConfig
            from torchao.quantization import Int8WeightOnlyConfig, quantize_
    except ImportError as exc:
        raise UnsupportedError(f"weight-only {precision} needs torchao ({exc}); pip install torchao") from None
    converted = hf_conv1d_to_linear(model)
    model = model.to(torch.bfloat16)
    linears = [m for m in model.modules() if isinstance(m, nn.Linear)]
    if precision == "int8":
        config, fits, mode = Int8WeightOnlyConfig(), (lambda m: True), "w8a16"
    else:
        config, mode = PrototypeInt4WeightOnlyConfig(group_size=INT4_GROUP), f"w4a16-g{INT4_GROUP}"
        fits = lambda m: m.out_features % 16 == 0 and m.in_features % INT4_GROUP == 0
    chosen = {id(m) for m in linears if fits(m)}
    if not chosen:
        raise UnsupportedError(f"weight-only {precision}: no Linear layer of {type(model).__name__} has a shape "
                               "it packs")
    try:
        quantize_(model, config, filter_fn=lambda m, fqn: id(m) in chosen)
    except (RuntimeError, NotImplementedError) as exc:      # a CPU without the packed kernel
        raise UnsupportedError(f"weight-only {precision} does not run here: {str(exc).splitlines()[0][:200]}") from None
    info = {"quantizer": f"torchao {type(config).__name__}", "activations": "bf16", "quantized_linears": len(chosen),
            "linears_left_bf16": len(linears) - len(chosen)}
    if precision == "int4":
        info["group_size"] = INT4_GROUP
    if converted:
        info["conv1d_converted_to_linear"] = converted
    return model, mode, info


@contextmanager
def _quiet_torchao():
    """torchao reports, for each of its CUDA-only libraries, that it cannot load it on this build."""
    ao_logger = logging.getLogger("torchao")
    level = ao_logger.level
    if not logger.isEnabledFor(logging.DEBUG):
        ao_logger.setLevel(logging.ERROR)
    try:
        yield
    finally:
        ao_logger.setLevel(level)


def dynamic_int8(model):
    """Dynamic int8 for every `nn.Linear`, and 8-bit row-wise weights for every summing `nn.EmbeddingBag` (in
    place): returns (model, info).

    The tables are a recommender's bytes: each row gets its own fp32 scale and offset (torch.ao's
    float_qparams_weight_only_qconfig) and fbgemm's embedding_bag_byte kernel sums the rows, the usual DLRM int8.
    That kernel always sums and ignores padding_idx and max_norm, so other bags stay fp32.
    Runs in eager mode and survives tracing; raises UnsupportedError when nothing was quantized.
    """
    import torch
    from torch import nn
    from torch.ao.quantization import default_dynamic_qconfig, float_qparams_weight_only_qconfig

    converted = hf_conv1d_to_linear(model)
    conv_left = sum(p.numel() for m in model.modules() if isinstance(m, nn.modules.conv._ConvNd)
                    for p in m.parameters(recurse=False))
    tables = [name for name, m in model.named_modules() if type(m) is nn.EmbeddingBag and m.mode == "sum"
              and m.padding_idx is None and m.max_norm is None]
    spec = {nn.Linear: default_dynamic_qconfig, **dict.fromkeys(tables, float_qparams_weight_only_qconfig)}
    model = torch.ao.quantization.quantize_dynamic(model, spec, inplace=True)
    count = quantized_modules(model)
    if not count:
        raise UnsupportedError(f"dynamic int8 found no nn.Linear to quantize in {type(model).__name__}")
    info = {"quantizer": "torch.ao.quantization.quantize_dynamic(nn.Linear, qint8)",
            "quantized_engine": torch.backends.quantized.engine, "quantized_modules": count}
    rowwise = sum(isinstance(m, torch.ao.nn.quantized.EmbeddingBag) for m in model.modules())
    if rowwise:
        info["quantizer"] += " + EmbeddingBag(float_qparams_weight_only_qconfig: 8-bit rows)"
        info["rowwise_int8_embedding_bags"] = rowwise
    if converted:
        info["conv1d_converted_to_linear"] = converted
    if conv_left:
        info["conv_params_left_fp32"] = conv_left
    # e.g. nn.MultiheadAttention's output projection, which quantize_dynamic leaves alone
    linear_left = sum(isinstance(m, nn.Linear) for m in model.modules())
    if linear_left:
        info["linear_left_fp32"] = linear_left
    return model, info


def eager_int8(model, example_inputs: tuple):
    """int8 that runs without a compiler: dynamic int8 Linear layers (and 8-bit row-wise tables). Returns
    (model, precision_mode, info).

    Conv nets raise UnsupportedError: their static int8 only becomes int8 kernels through inductor.
    """
    if is_conv_net(model, example_inputs):
        raise UnsupportedError(STATIC_NEEDS_INDUCTOR)
    model, info = dynamic_int8(model)
    return model, ROWWISE_TABLES if info.get("rowwise_int8_embedding_bags") else DYNAMIC_LINEAR, info


def _import_pt2e():
    """torchao's PT2E entry points (importing a quantizer also registers inductor's int8 lowering)."""
    try:
        with _quiet_torchao():
            from torchao.quantization.pt2e.quantize_pt2e import convert_pt2e, prepare_pt2e
    except ImportError as exc:
        raise UnsupportedError(NEEDS_TORCHAO.format(exc=exc)) from None
    return prepare_pt2e, convert_pt2e


def pt2e_quantizer(dynamic: bool, machine: str | None = None):
    """The PT2E quantizer for the CPU `machine` names (`platform.machine()`, this one, by default), set up for
    static or dynamic int8: (quantizer, info for the record).

    aarch64 takes torchao's ArmInductorQuantizer: signed int8 activations, which the int8 kernels of
    oneDNN with the Arm Compute Library take. Every other machine takes X86InductorQuantizer: unsigned
    activations for oneDNN's x86 int8 kernels, 7 of their 8 bits where the CPU has no VNNI.
    """
    import platform

    import torch

    from ..machine.cpuinfo import ARM_MACHINES

    machine = machine or platform.machine()
    try:
        with _quiet_torchao():
            if machine in ARM_MACHINES:
                from torchao.quantization.pt2e.quantizer import arm_inductor_quantizer as aiq

                quantizer, extra = aiq.ArmInductorQuantizer(), {}
                config = aiq.get_default_arm_inductor_quantization_config(is_dynamic=dynamic)
            else:
                from torchao.quantization.pt2e.quantizer import x86_inductor_quantizer as xiq

                extra = {"reduce_range": not _has_vnni()}
                quantizer = xiq.X86InductorQuantizer()
                config = xiq.get_default_x86_inductor_quantization_config(is_dynamic=dynamic, **extra)
    except ImportError as exc:
        raise UnsupportedError(NEEDS_TORCHAO.format(exc=exc)) from None
    # Dynamic int8 is for the linears; left global, the quantizer also annotates other ops, some of them on
    # integer tensors (roberta's position ids), which dynamic quantization cannot take.
    quantizer = quantizer.set_module_type_qconfig(torch.nn.Linear, config) if dynamic else quantizer.set_global(config)
    return quantizer, {"quantizer": f"torchao {type(quantizer).__name__} ({'dynamic' if dynamic else 'static'})",
                       "quantizer_for": machine, **extra}


def _export(model, example_inputs):
    """torch.export graph module, and how it was captured.

    Strict (dynamo) capture first: non-strict capture groups every call of a reused module (a ReLU
    applied twice in a ResNet block) into one partition, which the quantizer's fusion rules reject.
    """
    import torch

    if isinstance(model, torch.fx.GraphModule) and getattr(model, "exported_segment", False):
        # a segment of an exported graph (backends/split.py): its nodes keep the export's metadata (which
        # module each op came from, for the quantizer's patterns); exporting it again would lose that
        return model, "a segment of the model's export"
    errors = []
    for strict in (True, False):
        capture = "strict" if strict else "non-strict"
        try:
            return torch.export.export(model, example_inputs, strict=strict).module(), capture
        except Exception as exc:  # noqa: BLE001  (try the other capture, then report both)
            first_line = (str(exc).strip().splitlines() or [""])[0]
            errors.append(f"{capture}: {type(exc).__name__}: {first_line[:200]}")
    raise UnsupportedError(f"int8 PT2E needs a torch.export graph of the model; export failed ({'; '.join(errors)})")


def pt2e_int8(model, example_inputs: tuple, calibration: list[tuple] | None = None, dynamic: bool = False,
              machine: str | None = None):
    """Quantize `model` with PT2E and the quantizer for this CPU (`pt2e_quantizer`; `machine` names another, as
    `platform.machine()` would): returns (graph module, info).

    `dynamic` quantizes activations per call (no calibration; one pass observes the weights);
    otherwise activation scales come from `calibration` (input tuples; the example inputs when None).
    The result still computes in fp32 until inductor lowers it: compile it (freezing on) and check
    with `lowered_int8_kernels`.
    """
    import torch

    prepare_pt2e, convert_pt2e = _import_pt2e()
    quantizer, info = pt2e_quantizer(dynamic, machine)
    name = type(quantizer).__name__
    graph, capture = _export(model, example_inputs)
    try:
        prepared = prepare_pt2e(graph, quantizer)
    except ValueError as exc:   # the quantizer's pattern matching rejects some graphs
        raise UnsupportedError(f"{name} could not annotate the graph: {exc}") from None
    batches = [example_inputs] if dynamic or calibration is None else list(calibration)
    with torch.no_grad():
        for batch in batches:
            prepared(*batch)
    converted = convert_pt2e(prepared)
    ops = Counter(str(n.target).split(".")[1] for n in converted.graph.nodes
                  if n.op == "call_function" and str(n.target).startswith("quantized_decomposed."))
    if not ops:
        raise UnsupportedError(f"{name} found nothing to quantize in the model")
    info.update({"export": capture, "qdq_ops": dict(ops)})
    if not dynamic:
        info["calibration_batches"] = len(batches)
    return converted, info


def _has_vnni() -> bool:
    """Without VNNI, x86 int8 kernels can saturate on full-range uint8 activations: use 7 bits then."""
    import torch

    probe = getattr(torch.cpu, "_is_vnni_supported", None)
    return bool(probe and probe())


def inductor_int8(model, example_inputs: tuple, calibration: list[tuple] | None):
    """The PT2E scheme that fits `model`: static for conv nets, dynamic otherwise.

    Returns (graph module to compile, precision_mode, info).
    """
    from torch import nn

    if is_generation_step(model):
        raise UnsupportedError(GENERATION_STEP)
    if getattr(model, "jit_mode", "trace") == "script":   # the model says a trace would freeze one path
        raise UnsupportedError(DATA_DEPENDENT.format(name=type(model).__name__))
    if is_conv_net(model, example_inputs):
        graph, info = pt2e_int8(model, example_inputs, calibration, dynamic=False)
        return graph, PT2E_STATIC, info
    hf_conv1d_to_linear(model)
    bags = sum(isinstance(m, nn.EmbeddingBag) for m in model.modules())
    graph, info = pt2e_int8(model, example_inputs, dynamic=True)
    if bags:                    # the quantizer annotates Linear layers only: a recommender's tables stay fp32
        info["embedding_bags_left_fp32"] = bags
    return graph, PT2E_DYNAMIC, info


@contextmanager
def captured_inductor_code():
    """Collect the Python wrapper code inductor generates (or loads from its cache) inside the block."""
    from unittest import mock

    from torch._inductor.graph import GraphLowering

    codes: list[str] = []
    with mock.patch.object(GraphLowering, "save_output_code", codes.append):
        yield codes


def count_int8_kernels(code: str) -> dict:
    """int8 kernel calls by name in inductor's generated code."""
    return dict(Counter(_LOWERED_INT8.findall(code)))


def lowered_int8_kernels(compiled, inputs: tuple) -> dict:
    """Run `compiled` once (compiling it) and count the int8 kernels in what inductor generated.

    Raises UnsupportedError when there are none: the quantized graph would run in fp32. Runs without
    autograd, as every timed pass does: freezing, which does the int8 lowering, only applies then.
    """
    import torch

    with captured_inductor_code() as codes, torch.no_grad():
        compiled(*inputs)
    kernels = count_int8_kernels("\n".join(codes))
    if not kernels:
        raise UnsupportedError("inductor did not lower the quantized graph to int8 kernels "
                               f"({len(codes)} graph(s) generated, none calls one)")
    return kernels


def torchscript_int8_kernels(module) -> dict:
    """int8 ops in a scripted/traced module's graph (all blocks); UnsupportedError when there are none."""
    ops = dict(Counter(kind for kind in _graph_kinds(module.graph) if kind.startswith("quantized::")))
    if not ops:
        raise UnsupportedError("the TorchScript graph holds no int8 op after tracing the quantized model")
    return ops


def _graph_kinds(graph):
    for node in graph.nodes():
        yield node.kind()
        for block in node.blocks():
            yield from _graph_kinds(block)
