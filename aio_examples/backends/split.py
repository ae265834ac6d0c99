"""A model's graph cut into contiguous segments, each run by the engine fastest on it: aio's `split` strategy.

The model is exported once (`torch.export`, static shapes) and its ATen graph cut, in the order it runs, at
points where few tensors cross (a CNN's stage boundary: one activation; a transformer's layer boundary: the
hidden state and the mask), balancing the GEMM/convolution count between segments. Each segment is a
`torch.fx.GraphModule` of its own, with its weights, that any backend prepares as it would a model; the
split pass feeds each segment the tensors the ones before it made (numpy and torch tensors share memory
across the boundary; bf16 goes to a runtime as fp32, which its own precision hint then lowers).
"""

import dataclasses
import itertools
from collections.abc import Callable

from ..core.errors import UnsupportedError, short_error

SEGMENTS = 4                # segments cut (fewer when the graph has fewer places to cut)
MAX_CROSSING = 4            # tensors live across a cut, at most
HEAVY = ("convolution", "conv2d", "conv1d", "linear", "addmm", "mm.default", "bmm", "matmul", "baddbmm",
         "scaled_dot_product", "embedding_bag")


@dataclasses.dataclass
class Segment:
    module: object              # torch.fx.GraphModule
    inputs: list[str]           # names of the values it takes (model inputs or earlier segments' outputs)
    outputs: list[str]          # names of the values it makes that later segments or the model's output need
    conv_net: bool = False      # whether the whole model is a conv net (its int8 scheme: static, calibrated)

    @property
    def digest(self) -> str:
        """Its graph and where it sits: part of the key of each engine's cached conversion of it."""
        import hashlib

        text = "\n".join([self.module.code, *self.inputs, "->", *self.outputs])
        return hashlib.sha256(text.encode()).hexdigest()[:16]


@dataclasses.dataclass
class Graph:
    """The exported graph, its nodes in run order and the cut points found in it."""

    module: object              # the exported program's module (torch.fx.GraphModule)
    body: list                  # the nodes that compute (not placeholders, attributes, output, assertions)
    cuts: list[int]             # cut after body[i], for i in cuts
    inputs: list[str]           # the flat model inputs' names

    def cut_names(self) -> list[str]:
        """The nodes the graph is cut after (a cached split is prepared again only where they are the same)."""
        return [self.body[i].name for i in self.cuts]

    def segments(self) -> list[Segment]:
        """The segments between the cuts, in run order."""
        bounds = [-1, *self.cuts, len(self.body) - 1]
        return [self._segment(self.body[a + 1: b + 1]) for a, b in itertools.pairwise(bounds)]

    def _segment(self, nodes: list) -> Segment:
        from torch import fx

        mine, graph, env, inputs = set(nodes), fx.Graph(), {}, []

        def arg(a):
            if a not in env:
                if a.op == "get_attr":                  # the weight comes along: GraphModule copies it from the root
                    env[a] = graph.get_attr(a.target)
                else:
                    env[a] = graph.placeholder(a.name)
                    inputs.append(a.name)
                env[a].meta = dict(a.meta)
            return env[a]

        for n in nodes:
            env[n] = graph.node_copy(n, arg)
        outputs = [n for n in nodes if any(u not in mine for u in n.users)]
        graph.output(tuple(env[n] for n in outputs))
        return Segment(fx.GraphModule(self.module, graph), inputs, [n.name for n in outputs])

    def run_flat(self, args: tuple) -> list:
        """The model's flat inputs from the positional arguments it is called with."""
        import torch.utils._pytree as pytree

        return pytree.tree_flatten((args, {}))[0]

    def outputs(self, env: dict) -> object:
        """The model's outputs (its own structure) from the values the segments made."""
        import torch.utils._pytree as pytree
        from torch import fx

        out = next(n for n in reversed(self.module.graph.nodes) if n.op == "output")
        flat = fx.node.map_arg(out.args[0], lambda n: env[n.name])
        return pytree.tree_unflatten(list(flat), self.module._out_spec)


def _is_check(node) -> bool:
    """An assertion export inserts (on input shapes, symbolic sizes): no value, not part of any segment."""
    return node.op == "call_function" and "assert" in str(node.target) and not node.users


def export_graph(model, example_inputs: tuple, segments: int = SEGMENTS) -> Graph:
    """Export `model` and find `segments - 1` cut points; UnsupportedError when it does not export or has no
    cut where few tensors cross."""
    import torch

    try:
        exported = torch.export.export(model, tuple(example_inputs), strict=False)
        gm = exported.module()
    except Exception as exc:
        raise UnsupportedError(f"torch.export cannot take this model: {short_error(exc)}") from exc
    nodes = list(gm.graph.nodes)
    body = [n for n in nodes if n.op not in ("placeholder", "get_attr", "output") and not _is_check(n)]
    position = {n: i for i, n in enumerate(body)}
    last_use = {}
    for n in nodes:
        for u in n.users:
            if not _is_check(u):
                at = len(body) if u.op == "output" else position.get(u, -1)
                last_use[n] = max(last_use.get(n, -1), at)
    # a sweep in run order: the values made so far that are still needed later cross a cut placed there
    live = {n for n in nodes if n.op == "placeholder" and last_use.get(n, -1) >= 0}
    heavy, crossing = [], []
    for i, n in enumerate(body):
        live.add(n)
        live = {v for v in live if last_use.get(v, -1) > i}
        heavy.append((heavy[-1] if heavy else 0) + any(h in str(n.target) for h in HEAVY))
        tensors = all(isinstance(v.meta.get("val"), torch.Tensor) for v in live)
        crossing.append(len(live) if tensors and live else None)
    cuts, total = [], heavy[-1] if heavy else 0
    for k in range(1, segments):
        target = total * k / segments
        options = [(abs(heavy[i] - target) + 0.5 * crossing[i], i) for i in range(len(body) - 1)
                   if crossing[i] is not None and crossing[i] <= MAX_CROSSING and (not cuts or i > cuts[-1])
                   and heavy[i] > (heavy[cuts[-1]] if cuts else 0) and heavy[i] < total]
        if options:
            cuts.append(min(options)[1])
    if not cuts:
        raise UnsupportedError(f"no point in this model's graph where at most {MAX_CROSSING} tensors cross "
                               "between GEMMs or convolutions")
    names = [n.name for n in nodes if n.op == "placeholder"]
    return Graph(gm, body, cuts, names)


def segment_inputs(graph: Graph, segments: list[Segment], model_inputs: list[tuple]) -> list[list[tuple]]:
    """What each segment takes, per tuple of model inputs, found by running the segments eagerly (fp32)."""
    import torch

    per_segment: list[list[tuple]] = [[] for _ in segments]
    with torch.no_grad():
        for inputs in model_inputs:
            env = dict(zip(graph.inputs, graph.run_flat(inputs), strict=True))
            for seg, found in zip(segments, per_segment, strict=True):
                args = tuple(env[name] for name in seg.inputs)
                found.append(args)
                env.update(zip(seg.outputs, seg.module(*args), strict=True))
    return per_segment


@dataclasses.dataclass
class Stage:
    """A segment and what its engine made of it."""

    segment: Segment
    prepared: object            # base.Prepared: its pass function and how torch tensors reach it (`feed`)


def _to_torch(value):
    import numpy as np
    import torch

    return torch.from_numpy(value) if isinstance(value, np.ndarray) else value      # the runtimes' outputs


def _flat(out) -> list:
    return list(out) if isinstance(out, list | tuple) else [out]


def split_pass(graph: Graph, stages: list[Stage]) -> Callable:
    """The whole model as one call: each stage on what the ones before it made, the model's outputs at the end."""
    import torch

    def run(*args):
        env = dict(zip(graph.inputs, graph.run_flat(args), strict=True))
        for stage in stages:
            p = stage.prepared
            values = tuple(env[name] for name in stage.segment.inputs)
            if p.convert is not None:       # a runtime's numpy arrays: no bf16 there (its own hint lowers fp32)
                values = tuple(v.float() if v.dtype == torch.bfloat16 else v for v in values)
            env.update(zip(stage.segment.outputs, map(_to_torch, _flat(p.fn(*p.feed(values)))), strict=True))
        return graph.outputs(env)

    return run
