"""OpenVINO: the torch module converted to IR (cached on disk) and compiled for CPU with a pinned precision.

OpenVINO's CPU plugin runs bf16 by default on CPUs that have it, so the inference precision is always
set explicitly and read back from the compiled model; a precision this CPU cannot execute is refused
rather than run as something else. int8 is NNCF post-training quantization of the fp32 IR.
"""

import hashlib
import importlib.util
import itertools
import json
import shutil
import tempfile
import time
import warnings
from pathlib import Path

from ..core.errors import UnsupportedError
from ..core.log import logger
from .artifacts import artifact_dir, describe_inputs, digests, intact
from .base import FPMATH_READ_BACK, IO_BINDING, Backend, Prepared, bound_pass, onnx_source

# precision -> (INFERENCE_PRECISION_HINT asked, the OPTIMIZATION_CAPABILITIES entry the CPU needs for it).
# int8 keeps the f32 hint: quantized layers run int8, the rest f32 (bf16 under aio's int8_mixed_bf16 knob).
_PRECISIONS = {"fp32": ("f32", "FP32"), "bf16": ("bf16", "BF16"), "fp16": ("f16", "FP16"), "int8": ("f32", "INT8")}
# fp32's fast-math modes: the same fp32 IR compiled with the narrower inference precision (what -p bf16 runs too)
_FPMATH = {"bf16": ("bf16", "BF16"), "f16": ("f16", "FP16")}
# (int4 is weight-only quantization for text generation, which this backend does not run: base.py refuses it)
# Runtime layers that do the matrix work: at int8 at least one must run with an integer precision.
_COMPUTE_LAYERS = ("Convolution", "Deconvolution", "FullyConnected", "MatMul")
_CALIBRATION_SAMPLES = 8
_GENERATION = ("text generation updates a static KV cache in place between steps; "
               "an OpenVINO IR of one step has no such state")


# Properties the optimized backend may try beyond the defaults (backends/aio/settings.py KNOBS): the knob's name
# there -> OpenVINO's property
KNOB_PROPERTIES = {"cpu_pinning": "ENABLE_CPU_PINNING", "denormals_optimization": "CPU_DENORMALS_OPTIMIZATION"}
# and one that sets the inference precision: at int8, the layers NNCF leaves in floating point (softmax, norms,
# activations, unquantized GEMMs) run bf16 ("int8-mixed-bf16"), on a CPU with native bf16
MIXED_BF16 = "int8_mixed_bf16"


class OpenVinoBackend(Backend):
    name = "openvino"
    description = "OpenVINO IR from the torch module, CPU plugin, latency hint, pinned inference precision"
    copies_held = 2.0
    fpmath_modes = ("strict", *_FPMATH)

    def unavailable_reason(self):
        if importlib.util.find_spec("openvino") is None:
            return "openvino is not installed (pip install openvino)"
        from ..machine.allocators import preload_conflict

        preloaded = preload_conflict()
        if preloaded:
            return (f"OpenVINO aborts under an LD_PRELOADed {preloaded} ('double free or corruption'); "
                    "run it with the default or hugetlb allocator")
        return None

    def unsupported_reason(self, spec, precision):
        from ..models.base import is_generator

        if is_generator(spec.task):
            return _GENERATION
        return super().unsupported_reason(spec, precision)

    def knob_reason(self, knob, precision):
        if knob != MIXED_BF16:
            return None
        import openvino as ov

        return _mixed_bf16_reason(precision, ov.Core().get_property("CPU", "OPTIMIZATION_CAPABILITIES"))

    def prepare(self, model, example_inputs, precision, threads, ctx):
        import numpy as np
        import openvino as ov

        hint, capability = _PRECISIONS[precision]
        fast = precision == "fp32" and ctx.fpmath != "strict"
        if fast:
            hint, capability = _FPMATH[ctx.fpmath]
        core = ov.Core()
        capabilities = core.get_property("CPU", "OPTIMIZATION_CAPABILITIES")
        if capability not in capabilities:
            # Without it OpenVINO runs f16 as f32 and bf16 emulated: neither measures the precision asked for.
            asked = f"fp32 in fpmath {ctx.fpmath}" if fast else precision
            raise UnsupportedError(f"{asked} needs native {capability} support, which this CPU lacks "
                                   f"(OpenVINO OPTIMIZATION_CAPABILITIES: {', '.join(capabilities)})")
        key = {"inputs": describe_inputs(example_inputs), "weights": ctx.weights_id, "openvino": ov.__version__,
               "torch": _torch_version()}
        start = time.perf_counter()
        folder = artifact_dir("openvino", ctx.model_name, **key)
        xml, hit = _cached_ir(folder / "ir", lambda: _convert(model, example_inputs, ctx.model_name))
        info = {"openvino": ov.__version__.split("-")[0], "ir": str(xml), "ir_cache": "hit" if hit else "miss",
                ("ir_load_s" if hit else "convert_s"): round(time.perf_counter() - start, 3)}
        mode = f"inference-precision-{hint}"
        if ctx.knobs.get(MIXED_BF16):
            reason = _mixed_bf16_reason(precision, capabilities)
            if reason:
                raise UnsupportedError(reason)
            hint = "bf16"
        if precision == "int8":
            xml, int8_info = _quantized(model, xml, example_inputs, ctx, key)
            info.update(int8_info)
            mode = "int8-nncf-ptq" + ("-mixed-bf16" if hint == "bf16" else "")

        config = {"INFERENCE_NUM_THREADS": threads, "PERFORMANCE_HINT": "LATENCY", "NUM_STREAMS": 1,
                  "INFERENCE_PRECISION_HINT": hint,
                  **{KNOB_PROPERTIES[k]: v for k, v in ctx.knobs.items() if k in KNOB_PROPERTIES}}
        compiled = core.compile_model(core.read_model(xml), "CPU", config)
        read_back = compiled.get_property("INFERENCE_PRECISION_HINT").get_type_name()
        threads_read = int(compiled.get_property("INFERENCE_NUM_THREADS"))
        if read_back != hint:
            raise UnsupportedError(f"{precision} asked OpenVINO for {hint} inference but it runs {read_back}")
        if threads_read != threads:
            raise UnsupportedError(f"OpenVINO runs {threads_read} threads, not the {threads} asked "
                                   "(it caps threads at the cores it can use)")
        info.update(precision_hint_asked=hint, precision_hint_read_back=read_back, threads_read_back=threads_read,
                    performance_hint=str(compiled.get_property("PERFORMANCE_HINT")),
                    num_streams=int(compiled.get_property("NUM_STREAMS")), outputs="copied each pass",
                    **{k: str(compiled.get_property(KNOB_PROPERTIES[k])) for k in ctx.knobs if k in KNOB_PROPERTIES})
        if precision == "fp32":
            info[FPMATH_READ_BACK] = {"INFERENCE_PRECISION_HINT": read_back}
        if precision == "int8":
            info["int8_layers"] = _int8_layers(compiled)
            if read_back == "bf16":
                info["rest_precision"] = "bf16"

        request = compiled.create_infer_request()
        def convert(tensors):
            return tuple(np.ascontiguousarray(t.detach().numpy()) for t in tensors)

        def run(*inputs):
            # share_inputs: OpenVINO reads the numpy buffers in place. Outputs are not shared: each pass gets
            # fresh arrays (as eager torch allocates fresh outputs), so a result is never overwritten by the
            # next pass before it is checked; the cost is one copy of the outputs.
            return list(request.infer(list(inputs), share_inputs=True).to_tuple())

        if ctx.knobs.get(IO_BINDING):
            run = _bound(ov, request, len(compiled.outputs))
            info[IO_BINDING] = "inputs bound once as shared-memory tensors, bound again only for new arrays"

        def profile(passes, trace):
            return "openvino performance counters", _layer_profile(core, xml, config, convert(example_inputs), passes), None

        return Prepared(run, convert(example_inputs), mode, info, convert=convert, profile=profile)


def _bound(ov, request, outputs: int):
    """A pass on `request` with its inputs bound once as tensors sharing the arrays' memory, instead of wrapped
    anew on every pass (23 us of mobilenet_v2 int8's 0.72 ms here); outputs are copied as in `run`."""
    def bind(arrays):
        for i, array in enumerate(arrays):
            request.set_input_tensor(i, ov.Tensor(array, shared_memory=True))

    def infer():
        request.infer()
        return [request.get_output_tensor(i).data.copy() for i in range(outputs)]

    return bound_pass(bind, infer)


def _layer_profile(core, xml, config: dict, inputs: tuple, passes: int) -> list[dict]:
    """Per layer type and the kernel OpenVINO chose for it (`exec_type`), the time per pass, from a compiled
    model of its own with performance counters on."""
    compiled = core.compile_model(core.read_model(xml), "CPU", {**config, "PERF_COUNT": True})
    request = compiled.create_infer_request()
    request.infer(list(inputs), share_inputs=True)            # a first inference: allocations, not counted
    rows: dict[str, dict] = {}
    for _ in range(passes):
        request.infer(list(inputs), share_inputs=True)
        for layer in request.get_profiling_info():
            if layer.real_time.total_seconds() <= 0:
                continue              # not executed (folded, or a Parameter/Result)
            name = f"{layer.node_type} ({layer.exec_type})"
            row = rows.setdefault(name, {"op": name, "self_ms": 0.0, "calls": 0, "shapes": ""})
            row["self_ms"] += layer.real_time.total_seconds() * 1000 / passes
            row["calls"] += 1
    for row in rows.values():
        row["calls"] //= passes
    return list(rows.values())


def _torch_version() -> str:
    import torch

    return torch.__version__


def _convert(model, example_inputs: tuple, model_name: str):
    """The module as an OpenVINO model with the example inputs' static shapes."""
    import openvino as ov
    import torch

    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", torch.jit.TracerWarning)
            source = onnx_source(model)
            ov_model = (ov.convert_model(str(source)) if source is not None else
                        ov.convert_model(_traceable(model, example_inputs), example_input=tuple(example_inputs)))
    except Exception as exc:  # any converter failure means this model cannot run here
        raise UnsupportedError(f"OpenVINO cannot convert {model_name}: {_cause(exc)}") from exc
    if len(ov_model.inputs) != len(example_inputs):
        raise UnsupportedError(f"the converted {model_name} takes {len(ov_model.inputs)} inputs, "
                               f"the module {len(example_inputs)}")
    # reshape takes a dict keyed by input port (a list would be read as one shape for a single input).
    ov_model.reshape({port: ov.PartialShape(list(t.shape)) for port, t in zip(ov_model.inputs, example_inputs)})
    return ov_model


def _traceable(model, example_inputs):
    """The module, or when its outputs are not plain tensors, a wrapper returning them as one flat tuple.

    convert_model traces the module, and a trace cannot return a list of dicts (torchvision's detections).
    The flat order is the one output checks use: nested values in order, dict values in insertion order.
    """
    import torch

    with torch.no_grad():
        out = model(*example_inputs)
    if isinstance(out, torch.Tensor) or (isinstance(out, (tuple, list))
                                         and all(isinstance(t, torch.Tensor) for t in out)):
        return model

    def leaves(obj):
        if isinstance(obj, dict):
            obj = list(obj.values())
        if isinstance(obj, (tuple, list)):
            return [t for o in obj for t in leaves(o)]
        return [obj]

    class FlatOutputs(torch.nn.Module):
        def __init__(self, inner):
            super().__init__()
            self.inner = inner

        def forward(self, *inputs):
            return tuple(leaves(self.inner(*inputs)))

    return FlatOutputs(model)


def _cause(exc: BaseException) -> str:
    """One short line: the converter's first line, plus the underlying exception it wraps, if it names one."""
    lines = [line.strip() for line in str(exc).strip().splitlines() if line.strip()] or [type(exc).__name__]
    cause = next((after for line, after in itertools.pairwise(lines) if line == "Exception:"), None)
    return (f"{lines[0]} ({cause})" if cause else lines[0])[:300]


def _read_json(path: Path):
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def _cached_ir(folder: Path, make) -> tuple[Path, bool]:
    """`folder/model.xml`, saved from `make()` unless already there; True when it was.

    The IR is written into a temporary folder renamed into place, so a reader never sees half an IR.
    Weights stay fp32 (save_model would compress them to fp16 by default).
    """
    import openvino as ov

    xml, sums = folder / "model.xml", folder / "sha256.json"
    if xml.is_file() and xml.with_suffix(".bin").is_file():
        if intact(folder, _read_json(sums)):
            return xml, True
        logger.warning("%s did not match its digests: converting again", folder)
        shutil.rmtree(folder, ignore_errors=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{folder.name}-", dir=folder.parent))
    try:
        ov.save_model(make(), str(tmp / "model.xml"), compress_to_fp16=False)
        (tmp / sums.name).write_text(json.dumps(digests(tmp, ["model.xml", "model.bin"])))
        try:
            tmp.rename(folder)
        except OSError:
            if not xml.is_file():   # not a concurrent writer that got there first
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return xml, False


def _quantized(model, fp32_xml: Path, example_inputs, ctx, key: dict) -> tuple[Path, dict]:
    """The fp32 IR quantized by NNCF post-training quantization on the calibration inputs (cached)."""
    try:
        import nncf
    except ImportError as exc:
        raise UnsupportedError(f"int8 on OpenVINO needs nncf, which cannot be imported ({exc})") from None
    import openvino as ov

    from .int8 import is_conv_net

    samples = [tuple(t.detach().numpy() for t in s)
               for s in ctx.calibration_inputs(example_inputs, _CALIBRATION_SAMPLES)]
    model_type = None if is_conv_net(model, example_inputs) else nncf.ModelType.TRANSFORMER
    scheme = (f"nncf {nncf.__version__} post-training quantization, preset performance (symmetric), "
              f"model type {'transformer' if model_type else 'default'}, {len(samples)} calibration samples")
    digest = hashlib.sha256()
    for sample in samples:
        for array in sample:
            digest.update(array.tobytes())
    folder = artifact_dir("openvino", ctx.model_name, **key, int8=scheme, calibration=digest.hexdigest())

    def quantize():
        nncf.set_log_level(40)   # keep the progress output of calibration off the console
        return nncf.quantize(ov.Core().read_model(fp32_xml), nncf.Dataset(samples, list),
                             subset_size=len(samples), model_type=model_type)

    start = time.perf_counter()
    xml, hit = _cached_ir(folder / "ir", quantize)
    return xml, {"int8_scheme": scheme, "int8_ir": str(xml), "int8_cache": "hit" if hit else "miss",
                 ("int8_load_s" if hit else "quantize_s"): round(time.perf_counter() - start, 3)}


def _mixed_bf16_reason(precision: str, capabilities) -> str | None:
    """Why the int8_mixed_bf16 knob does not apply here, or None."""
    if precision != "int8":
        return f"{MIXED_BF16} applies at int8 (to the layers left in floating point), not at {precision}"
    if "BF16" not in capabilities:
        return (f"{MIXED_BF16} needs native BF16, which this CPU lacks "
                f"(OpenVINO OPTIMIZATION_CAPABILITIES: {', '.join(capabilities)})")
    return None


def _int8_layers(compiled) -> str:
    """How many compute layers the compiled model runs in int8; none means int8 would be a false label."""
    compute = int8 = 0
    for op in compiled.get_runtime_model().get_ops():
        rt = op.get_rt_info()
        if rt["layerType"].astype(str) in _COMPUTE_LAYERS:
            compute += 1
            int8 += rt["runtimePrecision"].astype(str) in ("i8", "u8")
    if not int8:
        raise UnsupportedError("after NNCF quantization no compute layer runs in int8")
    return f"{int8} of {compute}"
