"""Where a pass's time goes: a profiled set of passes after the timed measurement, per configuration.

Profiling adds its own overhead, so it never runs inside the timed passes: the record's timings are the
unprofiled ones, and its `profile` block says how many extra passes were profiled. Torch backends are
profiled with `torch.profiler` (self CPU time per op, calls, input shapes; a Chrome trace saved beside the
results); ONNX Runtime with its session profiling (per node, its Chrome trace kept) and OpenVINO with its
performance counters (per layer type and the kernel it chose), each through its backend's
`Prepared.profile`. Each op is put in one category, so backends can be compared by where their time goes.
"""

import re
from pathlib import Path

from ..core.paths import safe_name

PASSES = 5
TOP = 10
# Op name patterns per category, tried in order on the lowercased name without its namespace: aten ops,
# oneDNN/MKL calls and inductor's kernels (torch), ONNX Runtime's op types, OpenVINO's layer types.
CATEGORIES = (
    ("convolution", r"conv(?!ert)"),
    ("matmul/linear", r"matmul|^mm$|addmm|bmm|linear|einsum|int4pack|gemm|fullyconnected|innerproduct|qlinear|_mkl"),
    ("attention", r"attention|softmax|sdpa"),
    ("normalization", r"norm|^mvn"),
    ("element-wise", (r"^(add|sub|mul|div|relu|gelu|silu|sigmoid|tanh|hardtanh|hardswish|hardsigmoid|clamp|clamp_min|"
                      r"clip|pow|rsqrt|sqrt|exp|neg|where|maximum|minimum|erf|cos|sin|mean|sum|max|min|abs|log|"
                      r"reciprocal|threshold|dropout|prelu|elu|mish|round|floor|ceil|equal|less|greater|not)_?$|"
                      r"gelu|swish|eltwise|multiply|subtract|divide|power|activation|fused|pointwise|reduce|subgraph")),
    ("data movement", (r"copy|^to$|view|reshape|permute|transpose|^cat$|concat|contiguous|clone|index|gather|slice|"
                       r"select|expand|empty|as_strided|embedding|squeeze|flatten|split|chunk|stack|pad|zeros|ones|"
                       r"fill|arange|full|pool|upsample|resize|^t$|detach|reorder|convert|cast|shape|tile|broadcast|"
                       r"interpolate|scatter|range|identity")),
)
NAMES = [name for name, _ in CATEGORIES] + ["other"]
_COMPILED = [(name, re.compile(pattern)) for name, pattern in CATEGORIES]


# Inside an inductor graph, the time no recorded op accounts for is its own generated C++ loops: the fused
# element-wise and reduction kernels (inductor records its calls into oneDNN and MKL as ops of their own).
_FUSED_GRAPH = "call compiledfxgraph"


def category(op: str) -> str:
    """The category of an op's name (`aten::addmm`, `mkldnn::_linear_pointwise`, `cpp_fused_relu_0`)."""
    if _FUSED_GRAPH in op.lower():
        return "element-wise"
    name = op.split("::")[-1].strip().lower()
    for cat, pattern in _COMPILED:
        if pattern.search(name):
            return cat
    return "other"


def profile_torch(fn, passes: int = PASSES, trace: Path | None = None) -> dict:
    """`passes` calls of `fn` under torch.profiler: the per-category and top-op tables of their self CPU time."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    with torch.no_grad(), profile(activities=[ProfilerActivity.CPU], record_shapes=True) as prof:
        for _ in range(passes):
            fn()
    if trace is not None:
        trace.parent.mkdir(parents=True, exist_ok=True)
        prof.export_chrome_trace(str(trace))
    ops = []
    for event in prof.key_averages(group_by_input_shape=True):
        self_us = event.self_cpu_time_total
        if self_us <= 0 or event.key.startswith("ProfilerStep"):
            continue
        ops.append({"op": event.key, "self_ms": self_us / 1000 / passes, "calls": event.count // passes,
                    "shapes": str(event.input_shapes)[:120], "category": category(event.key)})
    return summarize(ops, passes, "torch.profiler", trace)


def profile_prepared(prepared, fn, passes: int = PASSES, trace: Path | None = None) -> dict:
    """A configuration's profile: its engine's own profiler where the backend offers one (`Prepared.profile`:
    ONNX Runtime's session profiling, OpenVINO's performance counters), else torch.profiler over its passes."""
    hook = getattr(prepared, "profile", None)
    if hook is None:
        return profile_torch(fn, passes, trace)
    tool, rows, written = hook(passes, trace)
    return summarize([{**r, "category": category(r["op"])} for r in rows], passes, tool, written)


def summarize(ops: list[dict], passes: int, tool: str, trace: Path | None) -> dict:
    """The profile block of a record: per pass, time per category (ms and share), the top ops, op counts."""
    total = sum(o["self_ms"] for o in ops) or 1e-12
    by_category = dict.fromkeys(NAMES, 0.0)
    for o in ops:
        by_category[o["category"]] += o["self_ms"]
    merged: dict[str, dict] = {}           # the same op over several input shapes: one row in the top list
    for o in ops:
        row = merged.setdefault(o["op"], {"op": o["op"], "self_ms": 0.0, "calls": 0, "category": o["category"]})
        row["self_ms"] += o["self_ms"]
        row["calls"] += o["calls"]
    top = sorted(merged.values(), key=lambda r: -r["self_ms"])[:TOP]
    for row in top:
        row["share"] = row["self_ms"] / total
    return {"tool": tool, "passes": passes, "outside_timing": True, "total_ms": total,
            "categories_ms": by_category, "categories_share": {k: v / total for k, v in by_category.items()},
            "op_calls": sum(r["calls"] for r in merged.values()), "distinct_ops": len(merged), "top": top,
            "trace": str(trace) if trace else None}


def trace_path(out_dir: Path | None, run_id: str, backend: str, precision: str) -> Path | None:
    if out_dir is None:
        return None
    return Path(out_dir) / "profiles" / f"{safe_name(run_id)}-{safe_name(backend)}-{precision}.json"


def table(results) -> str:
    """Time per category per configuration (share of its profiled time), and each one's top ops."""
    lines = ["", "profile (separate passes after timing; self CPU time per pass):",
             f"{'configuration':28s} " + " ".join(f"{n[:12]:>12s}" for n in NAMES) + f" {'total ms':>9s}"]
    for r in results:
        p = (r.metrics or {}).get("profile")
        if not p:
            continue
        shares = " ".join(f"{100 * p['categories_share'][n]:11.1f}%" for n in NAMES)
        lines.append(f"{r.backend + '/' + r.precision:28s} {shares} {p['total_ms']:9.2f}")
    for r in results:
        p = (r.metrics or {}).get("profile")
        if not p:
            continue
        lines.append(f"top ops, {r.backend}/{r.precision} ({p['op_calls']} op calls a pass, {p['distinct_ops']} "
                     f"distinct):")
        lines += [f"  {o['self_ms']:8.3f} ms {100 * o['share']:5.1f}% x{o['calls']:<4d} {o['category']:14s} {o['op']}"
                  for o in p["top"]]
    return "\n".join(lines)
