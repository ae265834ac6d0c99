"""Exporting a torch module to ONNX once, cached by model, inputs, precision, weights and library versions.

Used by every backend that starts from an ONNX graph (ONNX Runtime, and OpenVINO when it converts one).
"""

import copy
import io
import json
import os
import shutil
import tempfile
import time
from contextlib import contextmanager, redirect_stderr, redirect_stdout
from pathlib import Path

from ..core import precision as prec
from ..core.errors import UnsupportedError, short_error
from ..core.log import logger
from .artifacts import artifact_dir, describe_inputs, digests, intact
from .base import onnx_source

MODEL_FILE = "model.onnx"
TORCHSCRIPT_OPSET = 17
PROTOBUF_LIMIT = 2 * 1024**3 - 64 * 1024**2   # a single ONNX file holds < 2 GiB; keep a margin for the graph


def input_names(example_inputs) -> list[str]:
    """Graph input names, by position: `input0..N`."""
    return [f"input{i}" for i in range(len(example_inputs))]


@contextmanager
def atomic_files(dest_dir: Path, main_file: str):
    """Yield a scratch folder; on success move its files into `dest_dir`, `main_file` last.

    The main file appears only once complete (and after any external-data files it points to),
    so a killed export or quantization never leaves a file that looks finished.
    """
    scratch = Path(tempfile.mkdtemp(prefix=".tmp-", dir=dest_dir))
    try:
        yield scratch
        if not (scratch / main_file).is_file():
            raise RuntimeError(f"{main_file} was not written")
        for item in sorted(scratch.iterdir(), key=lambda p: p.name == main_file):
            os.replace(item, dest_dir / item.name)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def cached_artifact(folder: Path, main_file: str, make) -> tuple[dict, bool]:
    """What `make(scratch) -> info` writes, made once in `folder` (its files moved in by `atomic_files`, `main_file`
    last) with its info and digests in `meta.json`: a later call returns that info while every file is intact,
    and makes it again otherwise. Returns (info, cached)."""
    meta_file = folder / "meta.json"
    if meta_file.is_file():
        meta = _read_meta(meta_file)
        if intact(folder, meta.get("digests")):
            return meta.get("info", {}), True
    with atomic_files(folder, main_file) as scratch:
        info = make(scratch)
    files = sorted(p.name for p in folder.iterdir() if p.is_file() and p.name not in ("meta.json", "key.json"))
    meta_file.write_text(json.dumps({"info": info, "digests": digests(folder, files)}, indent=1))
    return info, False


def _library_versions() -> dict:
    import onnx
    import torch

    versions = {"torch": torch.__version__, "onnx": onnx.__version__}
    try:
        import onnxscript

        versions["onnxscript"] = onnxscript.__version__
    except ImportError:
        versions["onnxscript"] = None
    return versions


def _param_bytes(model) -> int:
    return sum(t.numel() * t.element_size() for t in model.state_dict().values() if hasattr(t, "element_size"))


def _export(model, inputs, path: Path, dynamo: bool) -> None:
    import torch

    names = input_names(inputs)
    chatter = io.StringIO()     # torch.export prints whole graphs when it gives up on a model
    try:
        with redirect_stdout(chatter), redirect_stderr(chatter):
            if dynamo:
                torch.onnx.export(model, inputs, str(path), dynamo=True, input_names=names, verbose=False,
                                  external_data=_param_bytes(model) > PROTOBUF_LIMIT, optimize=True)
            else:
                # The TorchScript exporter switches to external data by itself above the protobuf limit.
                torch.onnx.export(model, inputs, str(path), dynamo=False, input_names=names, verbose=False,
                                  opset_version=TORCHSCRIPT_OPSET, do_constant_folding=True)
    finally:
        if chatter.getvalue():
            logger.debug("%s exporter output:\n%s", "dynamo" if dynamo else "torchscript", chatter.getvalue()[-20000:])


def _read_meta(path: Path) -> dict:
    try:
        meta = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return meta if isinstance(meta, dict) else {}


def _opset(path: Path) -> int | None:
    import onnx

    proto = onnx.load(str(path), load_external_data=False)
    return next((o.version for o in proto.opset_import if o.domain in ("", "ai.onnx")), None)


def export_onnx(model, example_inputs: tuple, ctx, precision: str = "fp32") -> tuple[Path, dict]:
    """The ONNX file of `model` run on `example_inputs` at a float `precision`, exported once and cached.

    For fp16/bf16 a copy of the model and the floating inputs are cast first, so the graph itself is in
    that type. The dynamo exporter is tried first, then the TorchScript exporter (opset 17); the info
    says which one made the file and why the first failed. Raises UnsupportedError when neither can.
    Graph inputs are named `input0..N` by position (an exporter may drop inputs the graph never reads);
    outputs are the model's outputs flattened in order.
    """
    import torch

    dtype = prec.dtype(precision)           # UnsupportedError for int8: quantize an fp32 export instead
    source = onnx_source(model)
    if source is not None:
        return _own_onnx(source, ctx, precision)
    folder = artifact_dir("onnx", ctx.model_name, inputs=describe_inputs(example_inputs), precision=precision,
                          weights=ctx.weights_id, module=f"{type(model).__module__}.{type(model).__qualname__}",
                          **_library_versions())
    path, meta_path = folder / MODEL_FILE, folder / "export.json"
    rebuilt = None
    if path.is_file() and meta_path.is_file():
        meta = _read_meta(meta_path)
        if intact(folder, meta.get("sha256")):
            return path, {**meta, "onnx_path": str(path), "cached": True}
        rebuilt = "the cached export did not match its digest: exported again"
        logger.warning("%s: %s", folder, rebuilt)
        meta_path.unlink(missing_ok=True)       # the metadata first: a half-cleared folder never looks finished

    if precision != "fp32":
        model = copy.deepcopy(model).to(dtype)
        example_inputs = prec.cast_tree(tuple(example_inputs), dtype)
    errors = {}
    start = time.perf_counter()
    for exporter, dynamo in (("dynamo", True), ("torchscript", False)):
        try:
            with atomic_files(folder, MODEL_FILE) as scratch, torch.no_grad():
                _export(model, tuple(example_inputs), scratch / MODEL_FILE, dynamo)
                meta = {"exporter": exporter, "opset": _opset(scratch / MODEL_FILE),
                        "export_s": round(time.perf_counter() - start, 2)}
                if errors:
                    meta["exporter_fallback_reason"] = f"dynamo: {errors['dynamo']}"
                meta["sha256"] = digests(scratch, sorted(f.name for f in scratch.iterdir()))
                (scratch / "export.json").write_text(json.dumps(meta, indent=1))
            return path, {**meta, "onnx_path": str(path), "cached": False, **({"rebuilt": rebuilt} if rebuilt else {})}
        except Exception as exc:  # noqa: BLE001  (either exporter may reject a model; the other may not)
            errors[exporter] = short_error(exc)
    raise UnsupportedError("ONNX export failed: " + "; ".join(f"{k}: {v}" for k, v in errors.items()))


def _own_onnx(source: Path, ctx, precision: str) -> tuple[Path, dict]:
    """A user's ONNX file as the backends take an export: a copy (cached by its digest) whose graph inputs are
    named `input0..N` by position. It runs at the precision it was saved in; the backends quantize it to int8."""
    import onnx

    if precision != "fp32":
        raise UnsupportedError(f"an ONNX file runs at the precision it was saved in, not {precision}: "
                               "accepted here: fp32, and int8 (quantized from it)")

    def rename(scratch: Path) -> dict:
        proto = onnx.load(str(source))      # with any external data, saved again beside the copy
        initializers = {i.name for i in proto.graph.initializer}
        inputs = [i for i in proto.graph.input if i.name not in initializers]
        names = dict(zip((i.name for i in inputs), input_names(inputs), strict=True))
        for value in inputs:
            value.name = names[value.name]
        _rename_uses(proto.graph, names)
        onnx.save(proto, str(scratch / MODEL_FILE), save_as_external_data=proto.ByteSize() > PROTOBUF_LIMIT)
        return {"exporter": "none: the user's ONNX file", "source": str(source), "opset": _opset(scratch / MODEL_FILE),
                "inputs_renamed": names}

    folder = artifact_dir("onnx", ctx.model_name, weights=ctx.weights_id, source="file", onnx=onnx.__version__)
    info, cached = cached_artifact(folder, MODEL_FILE, rename)
    return folder / MODEL_FILE, {**info, "onnx_path": str(folder / MODEL_FILE), "cached": cached}


def _rename_uses(graph, names: dict) -> None:
    """Rename the graph's inputs wherever a node (or a subgraph of If/Loop/Scan) reads them, and graph outputs
    that are inputs passed straight through."""
    for node in graph.node:
        node.input[:] = [names.get(n, n) for n in node.input]
        for attribute in node.attribute:
            for sub in [attribute.g, *attribute.graphs]:
                if sub.ByteSize():
                    _rename_uses(sub, names)
    for output in graph.output:
        output.name = names.get(output.name, output.name)
