"""ONNX Runtime on the CPU execution provider, from a cached ONNX export; int8 through onnxruntime.quantization.

What ran is read back, not assumed: one profiled pass at preparation lists the element types each kernel
took, because ORT quietly wraps float16 nodes it has no CPU kernel for in casts and computes them in fp32.
"""

import contextlib
import hashlib
import importlib.util
import json
import logging
import os
import platform
import re
import shutil
import tempfile
import time
from collections import Counter
from pathlib import Path

from ..core.errors import UnsupportedError, short_error
from ..core.log import logger
from .artifacts import digests, intact, key
from .base import FPMATH_READ_BACK, IO_BINDING, Backend, Prepared, bound_pass
from .exports import PROTOBUF_LIMIT, atomic_files, export_onnx, input_names

GENERATION_REASON = ("text generation steps a mutable static KV cache held by the torch model; "
                     "an exported ONNX graph cannot carry that cache between calls")
CALIBRATION_SAMPLES = 8
# Kernels that carry the arithmetic; a lower precision only counts when these run in it.
_HEAVY_OPS = {"Conv", "ConvTranspose", "FusedConv", "MatMul", "FusedMatMul", "Gemm", "FusedGemm", "Attention",
              "MultiHeadAttention", "QLinearConv", "QLinearMatMul", "MatMulInteger", "ConvInteger",
              "DynamicQuantizeMatMul", "MatMulIntegerToFloat", "QGemm", "QAttention"}
_TYPE_NAMES = {"fp16": "float16", "bf16": "bfloat16"}    # as ORT's profiler names element types
# fp32's bf16 fast math: MLAS's fp32 GEMMs on bf16 operands, a session option of ORT's aarch64 builds only
FASTMATH_ARM64 = "mlas.enable_gemm_fastmath_arm64_bfloat16"
ARM64 = ("aarch64", "arm64")


class OnnxRuntimeBackend(Backend):
    name = "onnxruntime"
    description = "ONNX Runtime, CPU execution provider, from an ONNX export (int8 via onnxruntime.quantization)"
    copies_held = 2.0

    def unavailable_reason(self):
        missing = [m for m in ("onnx", "onnxruntime") if importlib.util.find_spec(m) is None]
        return f"{' and '.join(missing)} not installed (pip install onnx onnxruntime)" if missing else None

    def unsupported_reason(self, spec, precision):
        from ..models.base import is_generator

        return GENERATION_REASON if is_generator(spec.task) else super().unsupported_reason(spec, precision)

    @property
    def fpmath_modes(self):
        return ("strict", "bf16") if platform.machine().lower() in ARM64 else ("strict",)

    def fpmath_reason(self, mode):
        if mode in self.fpmath_modes:
            return None
        where = "aarch64" if mode == "bf16" else "no CPU"
        return (f"ONNX Runtime has no {mode} fast math for fp32 on {platform.machine()} (its GEMMs' bf16 fast math, "
                f"the session option {FASTMATH_ARM64}, is for {where})")

    def prepare(self, model, example_inputs, precision, threads, ctx):
        from ..core import precision as prec
        from ..models.base import is_generator

        if is_generator(ctx.task):
            raise UnsupportedError(GENERATION_REASON)
        fpmath = ctx.fpmath if precision == "fp32" else "strict"
        if self.fpmath_reason(fpmath):
            raise UnsupportedError(self.fpmath_reason(fpmath))
        if precision == "int8":
            path, info = export_onnx(model, example_inputs, ctx, "fp32")
            path, info["quantization"] = quantize(path, model, example_inputs, ctx)
            mode = info["quantization"]["scheme"]
        else:
            path, info = export_onnx(model, example_inputs, ctx, precision)
            mode = "native"
        # ORT opens its profile file when the session is made and fills it only when profiling ends: a session
        # that fails to load or to run would leave it behind, one file per unsupported point.
        with tempfile.TemporaryDirectory(prefix="aio-ort-profile-") as profile_dir:
            sess = make_session(path, threads, profile_dir=profile_dir, knobs=ctx.knobs, fpmath=fpmath)
            graph_inputs = {i.name for i in sess.get_inputs()}   # an exporter may drop inputs the graph never reads

            def feeds(tensors) -> dict:
                if precision != "int8":       # int8 graphs take fp32 inputs and quantize them inside
                    tensors = prec.cast_tree(tuple(tensors), prec.dtype(precision))
                return {n: _to_numpy(t) for n, t in zip(input_names(tensors), tensors) if n in graph_inputs}

            feed = feeds(example_inputs)
            names, arrays = tuple(feed), tuple(feed.values())
            try:
                kernels = _profiled_kernels(sess, feed)
            except Exception as exc:  # ORT's own error types: a node it cannot execute on this graph and input
                # e.g. int8 retinanet: no box passes the score threshold, and Reshape(-1) of an empty tensor fails.
                text = str(exc).strip().splitlines()[0]
                failed = re.search(r"running (\w+) node.* was false\. (.*)", text)  # the op and ORT's own words
                text = (f"{failed[1]}: {failed[2]}" if failed
                        else re.sub(r"\[ONNXRuntimeError\] : \d+ : \w+ : ", "", text))
                raise UnsupportedError(f"ONNX Runtime cannot run the graph on this input: {text[:300]}") from exc
        info["kernels_by_input_type"] = dict(Counter(types[0] for _, types in kernels))
        info["session"] = session_info(sess)
        if precision == "fp32":
            info[FPMATH_READ_BACK] = {FASTMATH_ARM64: _config_entry(sess.get_session_options(), FASTMATH_ARM64)}
        if precision != "fp32":
            mode = _check_kernels(precision, mode, kernels, info)

        def run(*arrays):
            return sess.run(None, dict(zip(names, arrays)))

        if ctx.knobs.get(IO_BINDING):
            run = _bound(sess, names)
            info[IO_BINDING] = "inputs bound once (IOBinding), bound again only for new arrays"

        def profile(passes, trace):
            return "onnxruntime session profiling", *_node_profile(path, threads, feed, passes, trace, ctx.knobs,
                                                                   fpmath)

        return Prepared(run, arrays, mode, info, convert=lambda tensors: tuple(feeds(tensors).values()),
                        profile=profile)


def _bound(sess, names: tuple):
    """A pass through an IOBinding with its inputs bound once instead of fed anew on every pass; outputs are
    allocated by ORT and copied out."""
    binding = sess.io_binding()
    for out in sess.get_outputs():
        binding.bind_output(out.name, "cpu")

    def bind(arrays):
        for name, array in zip(names, arrays):
            binding.bind_cpu_input(name, array)

    def infer():
        sess.run_with_iobinding(binding)
        return binding.copy_outputs_to_cpu()

    return bound_pass(bind, infer)


def make_session(path: Path, threads: int, profile_dir: str | None = None, knobs: dict | None = None,
                 fpmath: str = "strict"):
    """A CPU session with exactly `threads` intra-op threads, sequential, all graph optimizations on; profiled
    into `profile_dir` when given. `knobs`: `allow_spinning` False (idle threads sleep at once instead of
    spinning for the next op), `graph_optimization` "extended" (no layout transformations to NCHWc),
    `dynamic_block_base` n (a parallel loop is handed out in blocks that shrink as it nears its end, the first
    1/(threads*n) of it, instead of equal static shares). `fpmath` bf16: MLAS's bf16 fast math (aarch64)."""
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.intra_op_num_threads = threads
    so.inter_op_num_threads = 1
    so.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    knobs = knobs or {}
    if "allow_spinning" in knobs:
        so.add_session_config_entry("session.intra_op.allow_spinning", "1" if knobs["allow_spinning"] else "0")
    if knobs.get("graph_optimization") == "extended":
        so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED
    if knobs.get("dynamic_block_base"):
        so.add_session_config_entry("session.dynamic_block_base", str(knobs["dynamic_block_base"]))
    if fpmath == "bf16":
        so.add_session_config_entry(FASTMATH_ARM64, "1")
    # ORT's failures reach the caller as exceptions; its own log lines (e.g. a failed session complaining it
    # has no profile to write) only when debugging.
    so.log_severity_level = 1 if logger.isEnabledFor(logging.DEBUG) else 4
    if profile_dir:
        so.enable_profiling = True
        so.profile_file_prefix = os.path.join(profile_dir, "profile")
    try:
        return ort.InferenceSession(str(path), so, providers=["CPUExecutionProvider"])
    except Exception as exc:    # ORT has its own types (InvalidGraph, NotImplemented...) for graphs it cannot take
        # Node names differ from model to model (and would push the rest past short_error's limit): drop them.
        text = re.sub(r"\[ONNXRuntimeError\] : \d+ : \w+ : |Load model from \S+ failed:| in node \([^)]*\)| with name '[^']*'",
                      "", short_error(exc, limit=1000))[:300]
        raise UnsupportedError(f"ONNX Runtime cannot load the graph: {text}") from exc


def session_info(sess) -> dict:
    """The settings read back from the session, as recorded in results."""
    so = sess.get_session_options()
    return {"intra_op_num_threads": so.intra_op_num_threads, "inter_op_num_threads": so.inter_op_num_threads,
            "execution_mode": so.execution_mode.name, "graph_optimization_level": so.graph_optimization_level.name,
            "allow_spinning": _config_entry(so, "session.intra_op.allow_spinning"),
            "dynamic_block_base": _config_entry(so, "session.dynamic_block_base"), "providers": sess.get_providers()}


def _config_entry(so, key: str) -> str:
    """A session configuration entry as the session has it, or "default" when none was set."""
    try:
        return so.get_session_config_entry(key)
    except RuntimeError:          # ORT's way of saying the key was never set
        return "default"


def _to_numpy(tensor):
    """A torch tensor as the numpy array ORT takes (bf16 through ml_dtypes, which numpy lacks)."""
    import torch

    if tensor.dtype == torch.bfloat16:
        import ml_dtypes

        return tensor.detach().contiguous().view(torch.int16).numpy().view(ml_dtypes.bfloat16)
    return tensor.detach().contiguous().numpy()


def _profiled_kernels(sess, feed: dict) -> list[tuple[str, tuple]]:
    """(op, element types of its inputs) for every kernel of one pass; profiling then stops, pass or not."""
    try:
        sess.run(None, feed)
    finally:
        profile = Path(sess.end_profiling())
    events = json.loads(profile.read_text())
    kernels = []
    for event in events:
        args = event.get("args", {})
        if event.get("cat") == "Node" and event.get("name", "").endswith("_kernel_time"):
            types = tuple(next(iter(s), "none") for s in args.get("input_type_shape") or [{}])
            kernels.append((args.get("op_name", "?"), types))
    return kernels


def _node_profile(path: Path, threads: int, feed: dict, passes: int, trace,
                  knobs: dict | None = None, fpmath: str = "strict") -> tuple[list[dict], Path | None]:
    """Per op type, the time of its nodes per pass, from a profiled session of its own (`passes` runs); its
    Chrome trace copied to `trace`."""
    rows: dict[str, dict] = {}
    with tempfile.TemporaryDirectory(prefix="aio-ort-profile-") as profile_dir:
        sess = make_session(path, threads, profile_dir=profile_dir, knobs=knobs, fpmath=fpmath)
        for _ in range(passes):
            sess.run(None, feed)
        written = Path(sess.end_profiling())
        events = json.loads(written.read_text())
        if trace is not None:
            Path(trace).parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(written, trace)
    for event in events:
        args = event.get("args", {})
        if event.get("cat") == "Node" and event.get("name", "").endswith("_kernel_time"):
            row = rows.setdefault(args.get("op_name", "?"), {"op": args.get("op_name", "?"), "self_ms": 0.0,
                                                             "calls": 0, "shapes": ""})
            row["self_ms"] += event.get("dur", 0) / 1000 / passes
            row["calls"] += 1
    for row in rows.values():
        row["calls"] //= passes
    return list(rows.values()), (Path(trace) if trace is not None else None)


def _check_kernels(precision: str, mode: str, kernels, info: dict) -> str:
    """The precision mode the heavy kernels bear out; UnsupportedError when none of them ran at `precision`.

    fp16/bf16: "cast" when every heavy kernel took that type, "mixed" when only some did.
    int8: a heavy kernel counts when any of its inputs is int8/uint8 (dynamic MatMul takes float activations).
    """
    target = _TYPE_NAMES.get(precision, "int8")
    heavy = [(op, types) for op, types in kernels if op in _HEAVY_OPS]
    if precision == "int8":
        hits = [op for op, types in heavy if {"int8", "uint8"} & set(types)]
    else:
        hits = [op for op, types in heavy if types[0] == target]
    others = sorted({op for op, _ in heavy} - set(hits))
    info["heavy_kernels"] = {"total": len(heavy), f"in_{target}": len(hits), "other_ops": others}
    if not heavy:
        raise UnsupportedError(f"the graph has no Conv/MatMul/Gemm kernel that could run at {precision}")
    if not hits and precision == "int8":
        raise UnsupportedError(f"after {mode} quantization no kernel of {', '.join(others)} ran on int8 data")
    if not hits:
        raise UnsupportedError(f"ONNX Runtime's CPU kernels for {', '.join(others)} take no {target}: "
                               "it would insert casts and compute in fp32")
    if precision == "int8":
        return mode
    return "cast" if not others else "mixed"


# --- int8 -----------------------------------------------------------------------------------------

def _int8_scheme(model, example_inputs, ctx) -> tuple[dict, list]:
    """The quantization scheme for `model` and its calibration samples (none for dynamic)."""
    from ..machine.environment import capture
    from .int8 import is_conv_net

    # x86 int8 kernels multiply uint8 activations by int8 weights with an instruction whose 16-bit sums
    # saturate unless the CPU has VNNI: 7-bit weights keep them in range (ORT's advice for such CPUs).
    isa = capture()["isa"]
    reduce_range = platform.machine() in ("x86_64", "AMD64") and not any("vnni" in f or "amx" in f for f in isa)
    if not is_conv_net(model, example_inputs):
        return {"scheme": "int8-dynamic", "format": "QOperator", "per_channel": False, "weights": "QInt8",
                "activations": "QUInt8, quantized per call", "reduce_range": reduce_range,
                "op_types": ["MatMul", "Attention"]}, []
    samples = [dict(zip(input_names(s), map(_to_numpy, s)))
               for s in ctx.calibration_inputs(example_inputs, CALIBRATION_SAMPLES)]
    # uint8 activations: with int8 ones ORT leaves convolutions around residual Adds in fp32
    # behind Quantize/Dequantize pairs.
    return {"scheme": "int8-static-qdq", "format": "QDQ", "per_channel": True, "weights": "QInt8",
            "activations": "QUInt8", "reduce_range": reduce_range, "calibration": "MinMax",
            "calibration_samples": len(samples), "tail": "fp32 after the last Conv/MatMul/Gemm"}, samples


def quantize(fp32_path: Path, model, example_inputs, ctx) -> tuple[Path, dict]:
    """int8 model next to the fp32 export, cached: static QDQ (per-channel, calibrated) for conv nets,
    dynamic (int8 weights, activations quantized per call) for Linear/MatMul models."""
    import onnxruntime as ort
    from onnxruntime.quantization import (
        CalibrationDataReader,
        QuantFormat,
        QuantType,
        quantize_dynamic,
        quantize_static,
    )
    from onnxruntime.quantization.shape_inference import quant_pre_process

    settings, samples = _int8_scheme(model, example_inputs, ctx)
    digest = hashlib.sha256()
    for sample in samples:
        for name, array in sample.items():
            digest.update(name.encode() + array.tobytes())
    name = f"{settings['scheme']}-{key(ort=ort.__version__, samples=digest.hexdigest(), **settings)}.onnx"
    path = fp32_path.parent / name
    meta_path = path.with_suffix(".json")
    if path.is_file() and meta_path.is_file():
        cached = json.loads(meta_path.read_text())
        if intact(path.parent, cached.get("sha256")):
            return path, {**cached, "cached": True}
        logger.warning("%s did not match its digest: quantizing again", path)
        meta_path.unlink(missing_ok=True)

    class Reader(CalibrationDataReader):
        def __init__(self):
            self.samples = iter(samples)

        def get_next(self):
            return next(self.samples, None)

    start = time.perf_counter()
    # onnxruntime.quantization leaves temporary files (shape-inference models, external data) in the working
    # directory: give it one of its own, not the user's folder.
    with atomic_files(path.parent, name) as scratch, tempfile.TemporaryDirectory() as work, contextlib.chdir(work):
        source = scratch / "pre.onnx"
        # A model past protobuf's 2 GiB (the Stable Diffusion UNet's 3.4 GB) keeps its weights in external data
        large = sum(f.stat().st_size for f in fp32_path.parent.iterdir() if f.is_file()) > PROTOBUF_LIMIT
        try:
            # Symbolic shape inference and ORT's basic fusions let more nodes be quantized.
            quant_pre_process(str(fp32_path), str(source), save_as_external_data=large,
                              all_tensors_to_one_file=True)
            settings["pre_process"] = "ok"
        except Exception as exc:  # noqa: BLE001  (pre-processing is an optimization; quantize without it)
            source = fp32_path
            settings["pre_process"] = f"skipped: {short_error(exc, 200)}"
        if samples:
            tail = _tail_nodes(source)
            settings["tail_nodes_fp32"] = len(tail)
            quantize_static(str(source), str(scratch / name), Reader(), quant_format=QuantFormat.QDQ,
                            per_channel=True, weight_type=QuantType.QInt8, activation_type=QuantType.QUInt8,
                            reduce_range=settings["reduce_range"], nodes_to_exclude=tail,
                            use_external_data_format=large)
        else:
            quantize_dynamic(str(_gemm_as_matmul(source, scratch / "matmul.onnx")), str(scratch / name),
                             weight_type=QuantType.QInt8, op_types_to_quantize=settings["op_types"],
                             reduce_range=settings["reduce_range"], use_external_data_format=large)
        settings["quantize_s"] = round(time.perf_counter() - start, 2)
        for scratch_file in scratch.iterdir():          # the pre-processed models and their external data
            if not scratch_file.name.startswith(name):
                scratch_file.unlink()
        settings["sha256"] = digests(scratch, sorted(f.name for f in scratch.iterdir()))
        (scratch / meta_path.name).write_text(json.dumps(settings, indent=1))
    return path, {**settings, "cached": False}


def _tail_nodes(path: Path) -> list[str]:
    """Nodes no Conv/MatMul/Gemm follows: the post-processing at a graph's end. One uint8 scale for a tensor
    joining values of different ranges there (YOLO's last Concat: boxes in pixels beside scores in [0, 1]) rounds
    the small ones to zero, and nothing after it gains speed from int8."""
    import onnx

    nodes = list(onnx.load(str(path), load_external_data=False).graph.node)
    heavy = {"Conv", "MatMul", "Gemm"}
    # By position, not id(): protobuf may hand out a new wrapper object for a node on each access.
    readers: dict[str, list[int]] = {}
    for i, node in enumerate(nodes):
        for name in node.input:
            readers.setdefault(name, []).append(i)
    leads = [False] * len(nodes)           # whether a heavy node reads (transitively) what node i makes
    for i in reversed(range(len(nodes))):  # ONNX lists nodes in topological order
        leads[i] = any(nodes[r].op_type in heavy or leads[r] for out in nodes[i].output for r in readers.get(out, []))
    return [n.name for n, lead in zip(nodes, leads) if n.op_type not in heavy and not lead and n.name]


def _gemm_as_matmul(src: Path, dst: Path) -> Path:
    """Rewrite Gemm(x, W) + b as MatMul + Add: dynamic quantization has int8 kernels for MatMul only,
    and exporters write a Linear on 2-D input as Gemm. Returns `src` when there is nothing to rewrite."""
    import onnx
    from onnx import helper, numpy_helper

    proto = onnx.load(str(src))
    weights = {t.name: t for t in proto.graph.initializer}
    nodes, replaced = [], set()
    for node in proto.graph.node:
        attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
        if (node.op_type != "Gemm" or node.input[1] not in weights or attrs.get("transA", 0)
                or attrs.get("alpha", 1.0) != 1.0 or attrs.get("beta", 1.0) != 1.0):
            nodes.append(node)
            continue
        w = numpy_helper.to_array(weights[node.input[1]])
        w_name = f"{node.input[1]}_for_matmul"
        if w_name not in replaced:
            proto.graph.initializer.append(numpy_helper.from_array(w.T.copy() if attrs.get("transB", 0) else w, w_name))
            replaced.add(w_name)
        has_bias = len(node.input) > 2 and node.input[2]
        product = f"{node.output[0]}_matmul" if has_bias else node.output[0]
        nodes.append(helper.make_node("MatMul", [node.input[0], w_name], [product], name=f"{node.name}_matmul"))
        if has_bias:
            nodes.append(helper.make_node("Add", [product, node.input[2]], [node.output[0]], name=f"{node.name}_bias"))
    if not replaced:
        return src
    del proto.graph.node[:]
    proto.graph.node.extend(nodes)
    used = set(_names_read(proto.graph))
    kept = [t for t in proto.graph.initializer if t.name in used]
    del proto.graph.initializer[:]
    proto.graph.initializer.extend(kept)
    onnx.save(proto, str(dst))
    return dst


def _names_read(graph):
    """The names every node reads, in subgraphs too (Loop and If bodies): an initializer read only there (the
    export of an EmbeddingBag's loop over bags) is still used."""
    for node in graph.node:
        yield from node.input
        for attribute in node.attribute:
            for sub in [attribute.g, *attribute.graphs]:
                if sub.ByteSize():
                    yield from _names_read(sub)
