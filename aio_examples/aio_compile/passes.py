"""FX passes over the graph dynamo captured, run before AOT autograd and inductor.

With torch 2.13 dynamo inlines nn.Module calls: a Linear is a call to F.linear (torch._C._nn.linear), a
Conv2d a call to torch.conv2d, and weights arrive as graph inputs. `lift_constants` first makes the
module's weights graph constants, so the passes can transform them once at compile time (concatenate,
cast, quantize) and inductor's freezing folds and prepacks the results for oneDNN.
Each pass returns counts of what it changed, for the report.
"""

import copy
import operator
from collections import Counter, defaultdict

import torch
import torch.nn.functional as F
from torch import fx

_MATMUL_FUNCTIONS = (torch.matmul, operator.matmul, torch.mm, torch.bmm,
                     torch.ops.aten.matmul.default, torch.ops.aten.mm.default, torch.ops.aten.bmm.default)
# A graph of ATen calls (a segment of an exported model, backends/split.py) calls the ATen overloads
_LINEAR = (F.linear, torch.ops.aten.linear.default)
_CONV2D = (torch.conv2d, torch.ops.aten.conv2d.default)
_MATMUL_METHODS = ("matmul", "mm", "bmm", "__matmul__")
# Ops whose result aliases their input: an in-place op on the result mutates the input too.
_ALIASING = frozenset(("getitem", "view", "reshape", "transpose", "permute", "narrow", "select", "expand",
                       "unsqueeze", "squeeze", "t", "flatten", "unflatten", "split", "chunk", "unbind",
                       "detach", "as_strided", "view_as", "contiguous"))
_INT8 = (-128, 127, torch.int8)      # weights: symmetric per output channel


def op_kind(node: fx.Node) -> str | None:
    """The op kind a node is, in the names the filters use (see options.KIND_NAMES)."""
    if node.op == "call_function":
        if node.target in _LINEAR:
            return "Linear"
        if node.target in _CONV2D:
            return "Conv2d"
        if node.target in _MATMUL_FUNCTIONS:
            return "MatMul"
        if node.target is F.embedding_bag:
            return "EmbeddingBag"
    elif node.op == "call_method" and node.target in _MATMUL_METHODS:
        return "MatMul"
    return None


def _arg(node: fx.Node, index: int, name: str, default=None):
    return node.args[index] if len(node.args) > index else node.kwargs.get(name, default)


def _set_arg(node: fx.Node, index: int, name: str, value) -> None:
    if len(node.args) > index:
        node.update_arg(index, value)
    else:
        node.update_kwarg(name, value)


def _constant(gm: fx.GraphModule, arg) -> torch.Tensor | None:
    """The tensor a get_attr node names; None for values computed at run time."""
    if not (isinstance(arg, fx.Node) and arg.op == "get_attr"):
        return None
    value = gm
    for part in arg.target.split("."):
        value = getattr(value, part)
    return value if isinstance(value, torch.Tensor) else None


def _add_constant(gm: fx.GraphModule, tensor: torch.Tensor, hint: str) -> fx.Node:
    hint = hint.removeprefix("_aio_").replace(".", "_")
    name, i = f"_aio_{hint}", 0
    while hasattr(gm, name):
        i += 1
        name = f"_aio_{hint}_{i}"
    gm.register_buffer(name, tensor, persistent=False)
    anchor = next(n for n in gm.graph.nodes if n.op != "placeholder")
    with gm.graph.inserting_before(anchor):
        return gm.graph.get_attr(name)


def _dtype(gm: fx.GraphModule, arg):
    """dtype of a graph value when known: constants, or what dynamo recorded."""
    const = _constant(gm, arg)
    if const is not None:
        return const.dtype
    value = arg.meta.get("example_value") if isinstance(arg, fx.Node) else None
    return value.dtype if isinstance(value, torch.Tensor) else None


def _shape(arg):
    value = arg.meta.get("example_value") if isinstance(arg, fx.Node) else None
    return tuple(value.shape) if isinstance(value, torch.Tensor) else None


def _replace(node: fx.Node, new: fx.Node) -> None:
    node.replace_all_uses_with(new, delete_user_cb=lambda user: user is not new)
    if not node.users:
        node.graph.erase_node(node)


def _drop_unused_constants(gm: fx.GraphModule) -> None:
    for node in list(gm.graph.find_nodes(op="get_attr")):
        if not node.users and node.target.startswith("_aio_"):
            gm.graph.erase_node(node)
            delattr(gm, node.target)


# -- module state as constants -------------------------------------------------------------------------

def _is_module_state(node: fx.Node, value) -> bool:
    """Parameters and buffers of the compiled module (dynamo tags their source), not the user's inputs."""
    if not isinstance(value, torch.Tensor):
        return False
    source = getattr(node.meta.get("grapharg"), "source", None)
    try:
        return bool(source.guard_source.is_unspecialized_nn_module())
    except AttributeError:
        return isinstance(value, torch.nn.Parameter)


def _name(target) -> str:
    return target if isinstance(target, str) else getattr(target, "__name__", "")


def _mutated(node: fx.Node) -> bool:
    """Whether the graph writes to this value (in place, through a view, or as batch-norm statistics)."""
    pending, seen = [node], set()
    while pending:
        current = pending.pop()
        for user in current.users:
            name = _name(user.target)
            if (name.endswith("_") and not name.endswith("__")) or name in ("setitem", "__setitem__") \
                    or "out" in user.kwargs:
                return True
            if user.target is F.batch_norm and _arg(user, 5, "training", False):
                return True
            if name in _ALIASING and user.args and user.args[0] is current and user not in seen:
                seen.add(user)
                pending.append(user)
    return False


def lift_constants(gm: fx.GraphModule, example_inputs, enabled: bool = True) -> tuple[fx.GraphModule, list[int]]:
    """A copy of `gm` whose module parameters/buffers are constants (get_attr) instead of inputs
    (unless not `enabled`: then an unchanged copy).

    Returns the copy and the positions of the inputs it still takes. Inductor's freezing only folds
    constants; dynamo makes weights constants only when freezing is on globally while it traces, so the
    backend does it here instead. Dynamo's own graph is left as it is: its placeholders decide the
    arguments the compiled function is called with.
    """
    graph = copy.deepcopy(gm.graph)
    lifted = fx.GraphModule(gm, graph)
    keep = []
    for i, (node, value) in enumerate(zip(list(graph.find_nodes(op="placeholder")), example_inputs)):
        if enabled and _is_module_state(node, value) and not _mutated(node):
            const = _add_constant(lifted, value.detach(), node.name)
            if "example_value" in node.meta:
                const.meta["example_value"] = node.meta["example_value"]
            node.replace_all_uses_with(const)
            graph.erase_node(node)
        else:
            keep.append(i)
    lifted.recompile()
    return lifted, keep


# -- AIO_MERGE_LINEAR ------------------------------------------------------------------------------------

def _linear_args(node):
    return _arg(node, 0, "input"), _arg(node, 1, "weight"), _arg(node, 2, "bias")


def _row_form(weight) -> str | None:
    """How a linear's weight holds its rows: plain, torchao's weight-only int8 (int8 rows, a scale each) or int4
    (rows packed for the CPU kernel, a scale and zero point per group), else None (rows that do not concatenate)."""
    if type(weight) in (torch.Tensor, torch.nn.Parameter):
        return "plain"
    if getattr(weight, "act_quant_kwargs", None) is not None or getattr(weight, "act_pre_scale", None) is not None:
        return None
    if _int8_weight_only(weight) is not None:
        return "int8"
    if type(weight).__name__ == "Int4OpaqueTensor" and getattr(weight, "scale_and_zero", None) is not None:
        return "int4"
    return None


def _joint_rows(weights: list, form: str) -> torch.Tensor | None:
    """The weights' rows in one tensor of their own kind. A packed int4 layout keeps rows in blocks (64 here), so
    the joint tensor must give, on a probe row, exactly the results of the parts; else None (left unmerged)."""
    if form == "plain":
        return torch.cat(weights).detach()
    first = weights[0]
    if form == "int8":
        joint = type(first)(torch.cat([w.qdata for w in weights]), torch.cat([w.scale for w in weights]),
                            first.block_size, first.dtype)
    else:
        joint = type(first)(torch.cat([w.qdata for w in weights]), torch.cat([w.scale_and_zero for w in weights], 1),
                            first.block_size, [sum(w.shape[0] for w in weights), first.shape[1]])
    probe = torch.randn(1, first.shape[1], generator=torch.Generator().manual_seed(0)).to(first.dtype)
    with torch.no_grad():
        same = torch.equal(F.linear(probe, joint), torch.cat([F.linear(probe, w) for w in weights], -1))
    return joint if same else None


def merge_linears(gm: fx.GraphModule) -> dict:
    """Linears reading the same input with constant weights become one linear over the concatenated
    weights (missing biases as zeros), split back into the original outputs. Plain weights, and torchao's
    weight-only int8 and int4 (rows with their scales concatenated, still that tensor: `_joint_rows`)."""
    groups = defaultdict(list)
    for node in gm.graph.nodes:
        if op_kind(node) != "Linear":
            continue
        x, w, b = _linear_args(node)
        weight, bias = _constant(gm, w), _constant(gm, b)
        if weight is None or weight.dim() != 2 or (b is not None and bias is None):
            continue
        form = _row_form(weight)
        if form is None:
            continue                     # another quantized tensor subclass: its rows cannot be concatenated
        groups[(x, weight.dtype, weight.device, form)].append(node)
    merged_groups = merged = 0
    for (x, dtype, device, form), nodes in groups.items():
        if len(nodes) < 2:
            continue
        weights = [_constant(gm, _linear_args(n)[1]) for n in nodes]
        biases = [_constant(gm, _linear_args(n)[2]) for n in nodes]
        sizes = [w.shape[0] for w in weights]
        joint_weight = _joint_rows(weights, form)
        if joint_weight is None:
            continue
        w_node = _add_constant(gm, joint_weight, "merged_weight")
        b_node = None
        if any(b is not None for b in biases):
            full = [b if b is not None else torch.zeros(size, dtype=dtype, device=device)
                    for b, size in zip(biases, sizes)]
            b_node = _add_constant(gm, torch.cat(full).detach(), "merged_bias")
        with gm.graph.inserting_before(nodes[0]):
            joint = gm.graph.call_function(F.linear, (x, w_node, b_node))
            parts = gm.graph.call_function(torch.split, (joint, sizes, -1))
            outs = [gm.graph.call_function(operator.getitem, (parts, i)) for i in range(len(nodes))]
        for node, out in zip(nodes, outs):
            out.meta.update(node.meta)
            for user in list(node.users):
                # A slice of the joint output has a wider row stride: reshape works wherever view did.
                if user.op == "call_method" and user.target == "view":
                    user.target = "reshape"
            _replace(node, out)
        merged_groups += 1
        merged += len(nodes)
    _drop_unused_constants(gm)
    return {"groups": merged_groups, "linears_merged": merged}


# -- AIO_IMPLICIT_FP16_TRANSFORM_FILTER ------------------------------------------------------------------

# (position, keyword) of the floating-point tensor arguments of each kind.
_FLOAT_ARGS = {"Linear": ((0, "input"), (1, "weight"), (2, "bias")),
               "Conv2d": ((0, "input"), (1, "weight"), (2, "bias")),
               "MatMul": ((0, "input"), (1, "other"))}


def _cast(gm: fx.GraphModule, arg, dtype, before: fx.Node):
    """`arg` in `dtype`: a new constant for constants, a cast at run time otherwise."""
    const = _constant(gm, arg)
    if const is not None:
        return _add_constant(gm, const.to(dtype), f"{arg.target}_{str(dtype).split('.')[-1]}")
    with gm.graph.inserting_before(before):
        return gm.graph.call_method("to", (arg, dtype))


def reduce_precision(gm: fx.GraphModule, kinds, dtype) -> dict:
    """fp32 ops of `kinds` compute in `dtype`: inputs cast down, the result cast back to fp32."""
    converted = Counter()
    for node in list(gm.graph.nodes):
        kind = op_kind(node)
        if kind not in kinds or kind not in _FLOAT_ARGS:
            continue
        args = [(i, key, _arg(node, i, key)) for i, key in _FLOAT_ARGS[kind]]
        if any(isinstance(a, fx.Node) and _dtype(gm, a) not in (torch.float32, None) for _, _, a in args) \
                or _dtype(gm, args[1][2]) != torch.float32:
            continue          # only fp32 ops; int8 ones and already reduced ones stay as they are
        for i, key, arg in args:
            if isinstance(arg, fx.Node):
                _set_arg(node, i, key, _cast(gm, arg, dtype, node))
        with gm.graph.inserting_after(node):
            back = gm.graph.call_method("to", (node, torch.float32))
        node.replace_all_uses_with(back, delete_user_cb=lambda user, back=back: user is not back)
        converted[kind] += 1
    _drop_unused_constants(gm)
    return {"dtype": str(dtype).split(".")[-1], "converted": dict(converted)}


# -- AIO_QUANTIZE_INT8_FILTER ----------------------------------------------------------------------------

def _quantized_decomposed():
    import torch.ao.quantization.fx._decomposed  # defines torch.ops.quantized_decomposed

    return torch.ops.quantized_decomposed


def _int8_linear(gm: fx.GraphModule, node: fx.Node, x, weight: torch.Tensor, bias, out_dtype, act_max: int) -> str:
    """Replace `node` (x @ weight.T + bias) with dynamic int8: the activation quantized per tensor at
    run time (unsigned, asymmetric, 0..act_max), the weight per output channel now, or as torchao's
    weight-only int8 already holds it. Written as quantize/dequantize around an fp32 linear: the form
    inductor's oneDNN passes lower to one int8 GEMM (onednn.qlinear_pointwise)."""
    qd = _quantized_decomposed()
    if (held := _int8_weight_only(weight)) is not None:
        qweight, scale = held[0].contiguous(), held[1].clamp(min=1e-12)
    else:
        w = weight.detach().float().contiguous()
        scale = (w.abs().amax(dim=1) / 127).clamp(min=1e-12)
        qweight = torch.round(w / scale[:, None]).clamp(-128, 127).to(torch.int8)
    g = gm.graph
    qw, sw = _add_constant(gm, qweight, "int8_weight"), _add_constant(gm, scale, "int8_scale")
    zw = _add_constant(gm, torch.zeros_like(scale, dtype=torch.int64), "int8_zero_point")
    b32 = _add_constant(gm, bias.detach().float(), "int8_bias") if bias is not None else None
    with g.inserting_before(node):
        if weight.dtype != torch.float32:
            x = g.call_method("to", (x, torch.float32))
        qparams = g.call_function(qd.choose_qparams.tensor, (x, 0, act_max, torch.finfo(torch.float32).eps, torch.uint8))
        uint8 = (0, act_max, torch.uint8)
        s, z = (g.call_function(operator.getitem, (qparams, i)) for i in (0, 1))
        xq = g.call_function(qd.quantize_per_tensor.tensor, (x, s, z, *uint8))
        xdq = g.call_function(qd.dequantize_per_tensor.tensor, (xq, s, z, *uint8))
        wdq = g.call_function(qd.dequantize_per_channel.default, (qw, sw, zw, 0, *_INT8))
        out = g.call_function(F.linear, (xdq, wdq, b32))
        if out_dtype != torch.float32:
            out = g.call_method("to", (out, out_dtype))
        if out_dtype != weight.dtype:      # the rest of the graph expects the op's own dtype
            out = g.call_method("to", (out, weight.dtype))
    _replace(node, out)
    _keep_inputs_intact(out)
    return "Linear"


def _keep_inputs_intact(out: fx.Node) -> None:
    """Copy a graph input that is added to an int8 linear's result, first. Inductor fuses such an add into the
    int8 GEMM as oneDNN's in-place "sum" post-op, and with the input as the accumulator it would write the
    result into the caller's tensor."""
    g = out.graph
    for user in list(out.users):
        if user.op == "call_function" and user.target in (operator.add, torch.add, torch.ops.aten.add.Tensor):
            for arg in user.args[:2]:
                if isinstance(arg, fx.Node) and arg.op == "placeholder":
                    with g.inserting_before(user):
                        user.replace_input_with(arg, g.call_function(operator.add, (arg, 0)))


def _int8_embedding_bag(gm: fx.GraphModule, node: fx.Node, weight: torch.Tensor, out_dtype) -> str | None:
    """Sum/mean bags over 8-bit row-wise quantized rows (fbgemm's embedding_bag_byte kernels)."""
    indices, offsets = _arg(node, 0, "input"), _arg(node, 2, "offsets")
    mode, psw = _arg(node, 6, "mode", "mean"), _arg(node, 8, "per_sample_weights")
    last = _arg(node, 9, "include_last_offset", False)
    shape = _shape(indices)
    if shape is not None and not all(isinstance(d, int) for d in shape):
        shape = None               # symbolic sizes: leave the op alone
    if mode not in ("sum", "mean") or (mode == "mean" and psw is not None) or shape is None \
            or _arg(node, 3, "max_norm") is not None or _arg(node, 10, "padding_idx") is not None \
            or (offsets is None) != (len(shape) == 2):
        return None
    packed = _add_constant(gm, torch.ops.quantized.embedding_bag_byte_prepack(weight.detach().float()),
                           "int8_embedding")
    g = gm.graph
    with g.inserting_before(node):
        if offsets is None:        # fixed-size bags (B, L): flatten, one offset per row
            rows, width = shape
            offsets = g.call_function(torch.arange, (0, rows * width, width))
            indices = g.call_method("reshape", (indices, -1))
        out = g.call_function(torch.ops.quantized.embedding_bag_byte_rowwise_offsets,
                              (packed, indices, offsets, False, 0, False, psw, None, last))
        if mode == "mean":         # the kernel sums; divide by the bag sizes (empty bags stay 0)
            ends = offsets if last else g.call_function(
                torch.cat, ([offsets, g.call_method("new_full", (offsets, (1,), g.call_method("numel", (indices,))))],))
            counts = g.call_method("clamp", (g.call_function(torch.diff, (ends,)),), {"min": 1})
            out = g.call_function(operator.truediv, (out, g.call_method("unsqueeze", (counts, 1))))
        if out_dtype != torch.float32:
            out = g.call_method("to", (out, out_dtype))
        if out_dtype != weight.dtype:
            out = g.call_method("to", (out, weight.dtype))
    _replace(node, out)
    return "EmbeddingBag"


def quantize_int8(gm: fx.GraphModule, kinds, out_dtype, act_max: int = 255) -> dict:
    """Ops of `kinds` with constant weights run in int8; results come out in `out_dtype`.

    A matmul of two run-time values has no int8 kernel here and is left in floating point (counted
    as skipped), as are ops whose weights are not constants.
    """
    quantized, skipped = Counter(), Counter()
    for node in list(gm.graph.nodes):
        kind = op_kind(node)
        if kind not in kinds:
            continue
        done = None
        if kind == "Linear":
            x, w, b = _linear_args(node)
            weight, bias = _constant(gm, w), _constant(gm, b)
            if weight is not None and weight.dim() == 2 and weight.is_floating_point() \
                    and (b is None or bias is not None):
                done = _int8_linear(gm, node, x, weight, bias, out_dtype, act_max)
        elif kind == "MatMul":
            other = _constant(gm, _arg(node, 1, "other"))
            if other is not None and other.dim() == 2 and other.is_floating_point():
                done = _int8_linear(gm, node, _arg(node, 0, "input"), other.t(), None, out_dtype, act_max)
        elif kind == "EmbeddingBag":
            weight = _constant(gm, _arg(node, 1, "weight"))
            if weight is not None and weight.is_floating_point():
                done = _int8_embedding_bag(gm, node, weight, out_dtype)
        if done:
            quantized[kind] += 1
        else:
            skipped[kind] += 1
    _drop_unused_constants(gm)
    return {"quantized": dict(quantized), "skipped": dict(skipped)}


# -- AIO_STREAM_GEMV -------------------------------------------------------------------------------------

def _rows(arg) -> int | None:
    """How many rows a linear's input holds (every dimension but the last), when dynamo knows them."""
    shape = _shape(arg)
    if not shape or not all(isinstance(d, int) for d in shape):
        return None
    rows = 1
    for d in shape[:-1]:
        rows *= d
    return rows


def _int8_weight_only(weight) -> tuple[torch.Tensor, torch.Tensor] | None:
    """(int8 rows, fp32 scale per row) of torchao's weight-only int8 tensor (`Int8WeightOnlyConfig`: symmetric,
    one scale per output channel), else None."""
    qdata, scale = getattr(weight, "qdata", None), getattr(weight, "scale", None)
    zero = getattr(weight, "zero_point", None)
    if not (isinstance(qdata, torch.Tensor) and qdata.dtype == torch.int8 and qdata.dim() == 2
            and isinstance(scale, torch.Tensor) and scale.numel() == qdata.shape[0]):
        return None
    if isinstance(zero, torch.Tensor) and bool(zero.any()):
        return None
    return qdata.detach(), scale.detach().float().reshape(-1)


def _contiguous(shape) -> list[int]:
    strides, step = [], 1
    for d in reversed(shape):
        strides.insert(0, step)
        step *= d
    return strides


def _materialized():
    """Inductor's own op that makes a value a buffer of its own (with the given strides). Without it, inductor
    computes the row a GEMV reads inside the GEMV's loop: the RMSNorm, the residual add and the embedding
    lookup before it run once per weight row instead of once."""
    import torch._inductor.inductor_prims  # defines the prim

    return torch.ops.prims.inductor_force_stride_order.default


def stream_gemv(gm: fx.GraphModule) -> dict:
    """Linears over a single row (a decode step's GEMVs) become a multiply-and-sum that inductor generates as
    one loop streaming each weight row once, accumulating in fp32. Plain bf16/fp32 weights and torchao's
    weight-only int8 (its int8 rows and scales: converted inside the loop, never expanded in memory); linears
    over more rows keep their GEMM. Off by default: on an AVX-512 EPYC oneDNN's bf16 GEMV was faster
    (docs/generation.md), so this stays an option for CPUs where it is not."""
    done = Counter()
    for node in list(gm.graph.nodes):
        if op_kind(node) != "Linear":
            continue
        x, w, b = _linear_args(node)
        weight, bias = _constant(gm, w), _constant(gm, b)
        if weight is None or _rows(x) != 1 or (b is not None and bias is None):
            continue
        out_dtype = _dtype(gm, x)
        if type(weight) in (torch.Tensor, torch.nn.Parameter) and weight.dim() == 2 \
                and weight.dtype in (torch.float32, torch.bfloat16, torch.float16):
            rows, scale, kind = w, None, str(weight.dtype).split(".")[-1]
        elif (int8 := _int8_weight_only(weight)) is not None:
            rows, kind = _add_constant(gm, int8[0], "gemv_int8_weight"), "int8"
            scale = _add_constant(gm, int8[1], "gemv_int8_scale")
        else:
            continue
        g = gm.graph
        with g.inserting_before(node):
            xf = g.call_function(_materialized(), (g.call_method("to", (x, torch.float32)), _contiguous(_shape(x))))
            xf = g.call_method("unsqueeze", (xf, -2))
            out = g.call_method("sum", (g.call_function(operator.mul, (xf, rows)), -1))
            if scale is not None:
                out = g.call_function(operator.mul, (out, scale))
            if b is not None:
                out = g.call_function(operator.add, (out, g.call_method("to", (b, torch.float32))))
            if out_dtype not in (None, torch.float32):
                out = g.call_method("to", (out, out_dtype))
        out.meta.update(node.meta)
        _replace(node, out)
        done[kind] += 1
    _drop_unused_constants(gm)
    return {"linears": dict(done)}


# -- AIO_DECODE_ATTENTION --------------------------------------------------------------------------------

_SDPA = (F.scaled_dot_product_attention, torch.ops.aten.scaled_dot_product_attention.default)


def _unrepeated(node) -> fx.Node | None:
    """The cache's own keys or values when `node` is transformers' `repeat_kv` of them:
    `x[:, :, None].expand(b, kv, groups, s, d).reshape(b, kv * groups, s, d)`, a copy of the whole cache per
    step that grouped-query attention does not need."""
    if not (isinstance(node, fx.Node) and node.op == "call_method" and node.target == "reshape"):
        return None
    expand = node.args[0]
    if not (isinstance(expand, fx.Node) and expand.op == "call_method" and expand.target == "expand"):
        return None
    index = expand.args[0]
    if not (isinstance(index, fx.Node) and index.target is operator.getitem and isinstance(index.args[1], tuple)
            and len(index.args[1]) == 5 and index.args[1][2] is None):
        return None
    source, shape = index.args[0], _shape(expand)
    if _shape(source) is None or shape is None or len(shape) != 5:
        return None
    return source


def decode_attention(gm: fx.GraphModule) -> dict:
    """Attention of a single query row (a decode step) over a static KV cache, as two small fp32 matmuls and a
    softmax: the query heads grouped per key head, so the cache is read as it is stored instead of copied out
    per query head (`repeat_kv`) for every layer at every step, and no flash-attention kernel built for long
    query blocks runs for one row (it took a quarter of a Llama 3.2 1B decode step here, docs/generation.md).
    Causal masks of one query row are all or nothing per key, so only `attn_mask` (boolean or additive) is
    kept; `is_causal`, dropout and other query lengths are left to SDPA."""
    done = Counter()
    for node in list(gm.graph.nodes):
        if node.op != "call_function" or node.target not in _SDPA:
            continue
        q, k, v = (_arg(node, i, name) for i, name in ((0, "query"), (1, "key"), (2, "value")))
        mask, dropout = _arg(node, 3, "attn_mask"), _arg(node, 4, "dropout_p", 0.0)
        causal, scale = _arg(node, 5, "is_causal", False), _arg(node, 6, "scale")
        qs, ks = _shape(q), _shape(k)
        if qs is None or ks is None or len(qs) != 4 or qs[2] != 1 or causal or dropout or \
                not all(isinstance(d, int) for d in (*qs, *ks)):
            continue
        ms = _shape(mask) if mask is not None else (1, 1, 1, ks[2])
        if ms is None or len(ms) != 4 or ms[1] != 1 or ms[2] != 1:
            continue                                # a mask per head or per query row: SDPA's
        repeated = (k, v)
        if (kk := _unrepeated(k)) and (vv := _unrepeated(v)):
            k, v = kk, vv
        heads = _shape(k)[1]
        if qs[1] % heads or _shape(v)[1] != heads:
            continue
        groups = qs[1] // heads                     # query heads per cache head (SDPA's enable_gqa, or repeat_kv's)
        b, _, _, d = qs
        g = gm.graph
        with g.inserting_before(node):
            qg = g.call_method("reshape", (q, b, heads, groups, d))
            scores = g.call_function(torch.matmul, (g.call_method("float", (qg,)),
                                                    g.call_method("transpose", (g.call_method("float", (k,)), -1, -2))))
            scores = g.call_function(operator.mul, (scores, scale if scale is not None else d ** -0.5))
            if mask is not None:
                if _dtype(gm, mask) == torch.bool:
                    scores = g.call_method("masked_fill", (scores, g.call_method("logical_not", (mask,)), float("-inf")))
                else:
                    scores = g.call_function(operator.add, (scores, g.call_method("float", (mask,))))
            probs = g.call_method("softmax", (scores, -1))
            out = g.call_function(torch.matmul, (probs, g.call_method("float", (v,))))
            out = g.call_method("to", (g.call_method("reshape", (out, b, qs[1], 1, d)), _dtype(gm, q)))
        out.meta.update(node.meta)
        _replace(node, out)
        for unread in repeated:                     # repeat_kv's reshape, expand and index, when no longer read
            while isinstance(unread, fx.Node) and not unread.users and unread.target in ("reshape", "expand",
                                                                                          operator.getitem):
                source = unread.args[0]
                gm.graph.erase_node(unread)
                unread = source
        done["grouped" if groups > 1 else "plain"] += 1
    return {"attention": dict(done)}
