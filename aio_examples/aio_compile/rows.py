"""Only the rows the output uses: a row picked from a sequence pushed up the graph (slice push-down).

A classifier on a transformer reads one token of the last block's output (BERT's and ViT's `[CLS]`,
`hidden[:, 0]`). Every row-wise op before that pick (linear layers, norms, activations, residual adds, the
query side of attention) then computes 127 rows in 128 that nothing reads: in the last block, the query
projection, the attention output projection and the feed-forward layers, about 10/12 of that block's GEMM
work. The pass walks back from the pick ("demanded elements", as compilers call it), marks each node
whose every user needs only that row along one dimension, and recomputes the marked nodes on one row.
Keys and values keep every row: attention mixes them. The result is the same computation, not an
approximation: `prune` checks it against the original on the example inputs before handing it back.
"""

import dataclasses
import math

import torch
from torch import fx

aten = torch.ops.aten

# Ops that act on each element (with broadcasting) or return their input's values unchanged in layout
_ELEMENTWISE = {aten.add.Tensor, aten.sub.Tensor, aten.mul.Tensor, aten.div.Tensor, aten.gelu.default,
                aten.relu.default, aten.silu.default, aten.tanh.default, aten.sigmoid.default, aten.erf.default,
                aten.dropout.default, aten.clone.default, aten.contiguous.default, aten.alias.default,
                aten._to_copy.default, aten.to.dtype, aten.to.dtype_layout, aten.pow.Tensor_Scalar,
                aten.rsqrt.default, aten.sqrt.default, aten.exp.default, aten.neg.default, aten.where.self,
                aten.masked_fill.Scalar, aten.masked_fill.Tensor, aten.add.Scalar, aten.mul.Scalar,
                aten.div.Scalar, aten.sub.Scalar}
_RESHAPES = {aten.view.default, aten.reshape.default, aten._unsafe_view.default}
_PICKS = {aten.select.int, aten.slice.Tensor}


def _shape(node) -> tuple | None:
    val = node.meta.get("val") if isinstance(node, fx.Node) else None
    return tuple(val.shape) if isinstance(val, torch.Tensor) else None


def _pick(node: fx.Node) -> tuple[int, int] | None:
    """(dim, row) when `node` takes one row of its input along one dim (select, or a slice of length 1)."""
    if node.target not in _PICKS or not isinstance(node.args[0], fx.Node):
        return None
    shape = _shape(node.args[0])
    if shape is None:
        return None
    dim = node.args[1] if len(node.args) > 1 else 0
    dim %= len(shape)
    if node.target == aten.select.int:
        row = node.args[2]
    else:
        start, end = (list(node.args[2:4]) + [None, None])[:2]
        step = node.args[4] if len(node.args) > 4 else 1
        start = 0 if start is None else start
        end = shape[dim] if end is None or end > shape[dim] else end
        if step != 1 or start < 0 or end - start != 1:
            return None
        row = start
    return dim, row % shape[dim]


def _operand_dims(node: fx.Node, dim: int) -> dict[int, int] | None:
    """For `node` computed on one row along `dim` of its output: which of its operands (by argument position)
    it then needs on one row, and along which of their dims. None when the op cannot be computed on one row."""
    out = _shape(node)
    if out is None or node.op != "call_function":
        return None
    t, args = node.target, node.args
    if t in _ELEMENTWISE:
        need = {}
        for i, a in enumerate(args):
            shape = _shape(a)
            if shape is None:
                continue
            d = dim - (len(out) - len(shape))
            if d >= 0 and shape[d] > 1:
                need[i] = d
        return need
    if t == aten.linear.default:
        return {0: dim} if dim < len(out) - 1 else None
    if t == aten.layer_norm.default:
        return {0: dim} if dim < len(out) - len(args[1]) else None
    inp = _shape(args[0]) if args else None
    if inp is None:
        return None
    if t in _RESHAPES:
        before = math.prod(out[:dim])
        for d in range(len(inp)):
            if math.prod(inp[:d]) == before and inp[d] == out[dim]:
                return {0: d}
        return None
    if t == aten.transpose.int:
        a, b = (x % len(out) for x in args[1:3])
        return {0: b if dim == a else a if dim == b else dim}
    if t == aten.permute.default:
        return {0: args[1][dim] % len(inp)}
    if t == aten.unsqueeze.default:
        u = args[1] % len(out)
        return None if dim == u else {0: dim if dim < u else dim - 1}
    if t == aten.squeeze.dim:
        s = args[1] % len(inp)
        return {0: dim if dim < s else dim + 1}
    if t == aten.select.int:
        s = args[1] % len(inp)
        return {0: dim if dim < s else dim + 1}
    if t == aten.unflatten.int:
        u, sizes = args[1] % len(inp), args[2]
        if dim < u:
            return {0: dim}
        if dim >= u + len(sizes):
            return {0: dim - len(sizes) + 1}
        return None
    if t == aten.expand.default:
        d = dim - (len(out) - len(inp))
        return {0: d} if d >= 0 and inp[d] > 1 else {}
    if t == aten.scaled_dot_product_attention.default:
        # the output's query rows come from the query's rows; keys and values are needed whole. A causal
        # mask is aligned to the query's first row, so a row taken alone would see a different mask.
        causal = args[5] if len(args) > 5 else node.kwargs.get("is_causal", False)
        if causal or dim != len(out) - 2:
            return None
        need = {0: dim}
        mask = args[3] if len(args) > 3 else node.kwargs.get("attn_mask")
        shape = _shape(mask)
        if shape is not None and len(shape) >= 2 and shape[-2] > 1:
            if len(args) <= 3:
                return None         # a mask passed by keyword: left alone, the op stays whole
            need[3] = len(shape) - 2
        return need
    return None


def demanded_rows(gm: fx.GraphModule) -> dict[fx.Node, tuple[int, int]]:
    """The nodes whose every use reads one row along one dim: node -> (dim, row)."""
    demand: dict[fx.Node, tuple[int, int]] = {}
    for node in reversed(gm.graph.nodes):
        if node.op != "call_function" or not node.users or _shape(node) is None:
            continue
        needs = set()
        for user in node.users:
            picked = _pick(user)
            if picked is not None and user.args[0] is node:
                needs.add(picked)
                continue
            if user not in demand:
                needs.add(None)
                break
            dim, row = demand[user]
            mapping = _operand_dims(user, dim) or {}
            positions = [i for i, a in enumerate(user.args) if a is node]
            dims = {mapping.get(i) for i in positions}
            needs.add((dims.pop(), row) if len(dims) == 1 and None not in dims else None)
        if len(needs) == 1 and None not in needs:
            dim, row = needs.pop()
            if _shape(node)[dim] > 1 and _operand_dims(node, dim) is not None:
                demand[node] = (dim, row)
    return demand


def _row_shape(shape: tuple, dim: int) -> list:
    return [1 if i == dim else s for i, s in enumerate(shape)]


def prune_rows(gm: fx.GraphModule) -> int:
    """Rewrite `gm` in place so the nodes `demanded_rows` finds run on their one row; returns how many do."""
    graph, demand = gm.graph, demanded_rows(gm)
    if not demand:
        return 0
    narrowed: dict[fx.Node, fx.Node] = {}

    def one_row(node: fx.Node, dim: int, row: int) -> fx.Node:
        """`node` narrowed to its row: the rewritten node when it was demanded so, else a slice of it."""
        if narrowed.get(node) is not None and demand.get(node) == (dim, row):
            return narrowed[node]
        with graph.inserting_after(node):
            return graph.call_function(aten.slice.Tensor, (node, dim, row, row + 1))

    for node in list(graph.nodes):
        if node not in demand:
            continue
        dim, row = demand[node]
        mapping = _operand_dims(node, dim)
        args = list(node.args)
        for i, d in mapping.items():
            args[i] = one_row(args[i], d, row)
        if node.target in _RESHAPES or node.target == aten.expand.default:
            args[1] = _row_shape(_shape(node), dim)
        with graph.inserting_after(node):
            new = graph.call_function(node.target, tuple(args), dict(node.kwargs))
        narrowed[node] = new
    for node, new in narrowed.items():
        for user in list(node.users):
            if user is new or user in narrowed.values():
                continue
            picked = _pick(user)
            if picked is None:
                continue
            # the pick now reads row 0 of the one-row result
            args = list(user.args)
            args[0] = new
            if user.target == aten.select.int:
                args[2] = 0
            else:
                args[2:4] = [0, 1]
            user.args = tuple(args)
    for node in reversed(list(narrowed)):     # the whole-row originals (DCE keeps dropout: it counts as random)
        if not node.users:
            graph.erase_node(node)
    graph.eliminate_dead_code()
    graph.lint()
    gm.recompile()
    return len(narrowed)


def _same(a, b) -> bool:
    import torch.utils._pytree as pytree

    fa, fb = pytree.tree_leaves(a), pytree.tree_leaves(b)
    return len(fa) == len(fb) and all(
        not isinstance(x, torch.Tensor) or (x.shape == y.shape and torch.allclose(x, y, rtol=1e-4, atol=1e-5))
        for x, y in zip(fa, fb, strict=True))


@dataclasses.dataclass
class Pruned:
    module: fx.GraphModule      # the rewritten graph, called like the model
    narrowed: int               # ops now computed on one row
    flops: int                  # one pass's matmul, convolution and attention FLOPs, before and after
    flops_pruned: int           # (torch.utils.flop_counter)

    @property
    def flops_saved(self) -> float:
        return 1 - self.flops_pruned / self.flops if self.flops else 0.0


def _flops(fn, args) -> tuple[int, object]:
    from torch.utils.flop_counter import FlopCounterMode

    with FlopCounterMode(display=False) as counter:
        out = fn(*args)
    return counter.get_total_flops(), out


def prune(model, example_inputs: tuple) -> Pruned | None:
    """The model exported (`torch.export`, static shapes) and rewritten to compute only the rows its output
    uses; None when nothing narrows, it does not export, or the rewritten graph's outputs differ from the
    model's on the example inputs."""
    try:
        exported = torch.export.export(model, tuple(example_inputs), strict=False).module()
    except Exception:  # noqa: BLE001  (a model that does not export keeps all its rows)
        return None
    # a plain GraphModule: the exported one refuses eval(), which converters and compilers call
    gm = fx.GraphModule(exported, exported.graph)
    try:
        with torch.no_grad():
            if not demanded_rows(gm):
                return None
            # FLOPs of the same ATen graph before and after (a module's own fused kernels, such as
            # nn.MultiheadAttention's fast path, have no FLOP formula)
            flops, _ = _flops(gm, example_inputs)
            count = prune_rows(gm)
            flops_pruned, got = _flops(gm, example_inputs)
            if not _same(got, model(*example_inputs)):
                return None
    except Exception:  # noqa: BLE001  (an op this pass maps wrongly fails here: the model keeps all its rows)
        return None
    return Pruned(gm, count, flops, flops_pruned)

