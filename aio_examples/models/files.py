"""A user's own model file, benchmarked like a zoo entry: a saved `torch.export` program (`.pt2`), a
TorchScript module or a whole module saved with `torch.save` (`.pt`), or an ONNX model (`.onnx`). The record is
named after the file, and its digest is recorded with it."""

import zipfile
from pathlib import Path

import torch

from ..core.errors import UsageError, short_error
from .base import file_sha256
from .custom import CustomModel

FORMATS = {".pt2": "a saved torch.export program (torch.export.save)",
           ".pt": "a TorchScript module (torch.jit.save) or a whole nn.Module (torch.save)", ".onnx": "an ONNX model"}
# An ONNX file is a graph for the runtimes, not a torch module: the torch backends cannot take it
ONNX_ONLY = ("an ONNX file runs on ONNX Runtime and OpenVINO (and aio's choice between them); the torch "
             "backends take a torch model (--model-file .pt2 or .pt)")
TORCH_BACKENDS = ("eager", "torchscript", "inductor")
# ONNX element types -> torch dtypes, for the inputs an ONNX file declares
_ONNX_DTYPES = {"tensor(float)": "float32", "tensor(float16)": "float16", "tensor(bfloat16)": "bfloat16",
                "tensor(int64)": "int64", "tensor(int32)": "int32", "tensor(bool)": "bool"}
DTYPES = ("float32", "bfloat16", "float16", "int64", "int32", "bool")


def parse_shapes(text: str | None) -> list[tuple[int, ...]]:
    """`--input-shape 1x3x224x224` or `ids=1x128,mask=1x128` (names are for the reader: inputs go in order)."""
    if not text:
        return []
    shapes = []
    for item in text.split(","):
        dims = item.split("=")[-1].strip()
        try:
            shape = tuple(int(d) for d in dims.split("x"))
        except ValueError:
            shape = ()
        if not shape or min(shape) < 1:
            raise UsageError(f"--input-shape {text!r} is invalid; accepted: NAME=DxDx...,... or DxDx... with whole "
                             "numbers >= 1, e.g. 1x3x224x224")
        shapes.append(shape)
    return shapes


def file_spec(path: str) -> CustomModel:
    """The spec of a model file, named after it (without loading it: a sweep plans its points from this)."""
    file = Path(path)
    if file.suffix == ".onnx":
        return CustomModel(file.stem, "custom", "samples", {}, unsupported_backends=dict.fromkeys(TORCH_BACKENDS,
                                                                                                 ONNX_ONLY))
    return CustomModel(file.stem, "custom", "samples", {})


def load_model_file(path: str, input_shape: str | None, input_dtype: str | None, try_inputs: bool = True):
    """(spec, module, example inputs, batch size, recorded shape) of a model file; one line when it cannot.
    With `try_inputs` the module runs once on the inputs, so inputs it refuses are a usage error here (a run that
    measures each configuration in a process of its own leaves that to the processes: a module that crashes
    must crash there, not here)."""
    file = Path(path)
    if file.suffix not in FORMATS:
        raise UsageError(f"--model-file {path!r} has no known suffix; accepted: "
                         + ", ".join(f"{s} ({what})" for s, what in FORMATS.items()))
    if not file.is_file():
        raise UsageError(f"--model-file {path!r} does not exist; accepted: a file")
    dtypes = [d.strip() for d in (input_dtype or "float32").split(",")]
    bad = [d for d in dtypes if d not in DTYPES]
    if bad:
        raise UsageError(f"--input-dtype {bad[0]!r} is invalid; accepted: {', '.join(DTYPES)} (comma list per input)")
    saved, spec = None, file_spec(path)
    if file.suffix != ".onnx" and not zipfile.is_zipfile(file):   # both torch formats are zip archives
        raise UsageError(f"--model-file {path!r} is not {FORMATS[file.suffix]} (not a zip archive)")
    try:
        if file.suffix == ".onnx":
            module = OnnxFile(file)
            if input_dtype is None:
                dtypes = module.input_dtypes
            saved = module.static_inputs()
        elif file.suffix == ".pt2":
            program = torch.export.load(str(file))
            module, saved = _Exported(program.module()), program.example_inputs
        else:
            module = _load_pt(file)
    except Exception as exc:  # noqa: BLE001  (a file of another format than its suffix says)
        raise UsageError(f"--model-file {path!r} is not {FORMATS[file.suffix]} ({short_error(exc, 160)})") from None
    shapes = parse_shapes(input_shape)
    if shapes:
        kinds = dtypes if len(dtypes) == len(shapes) else dtypes[:1] * len(shapes)
        inputs = tuple(_tensor(shape, getattr(torch, kind)) for shape, kind in zip(shapes, kinds, strict=True))
    elif saved is not None and saved[0]:
        inputs = tuple(saved[0])           # the program's own example inputs (an ONNX file's static shapes)
    else:
        raise UsageError(f"--model-file {path!r} does not say its input shapes; accepted: --input-shape "
                         "NAME=DxDx... (and --input-dtype)")
    try:
        if try_inputs:
            with torch.no_grad():
                module(*inputs)
    except Exception as exc:  # noqa: BLE001  (the model's own message, shortened)
        raise UsageError(f"{file.name} refuses inputs of shapes {[list(t.shape) for t in inputs]}: "
                         f"{short_error(exc, 200)}") from None
    batch = int(inputs[0].shape[0]) if inputs[0].dim() > 0 else 1
    recorded = {f"input{i}": list(t.shape) for i, t in enumerate(inputs)}
    return spec, module, inputs, batch, recorded


def _load_pt(file: Path):
    """A TorchScript module, else a whole module pickled by torch.save (its class must be importable here, as
    for torch.load anywhere; loading runs the pickle's code: a file of your own only)."""
    try:
        return torch.jit.load(str(file), map_location="cpu")
    except RuntimeError as scripted:
        try:
            module = torch.load(str(file), map_location="cpu", weights_only=False)
        except Exception:  # noqa: BLE001  (neither format: TorchScript's complaint is the clearer one)
            raise scripted from None
    if not isinstance(module, torch.nn.Module):
        raise UsageError(f"--model-file {str(file)!r} holds a {type(module).__name__}, not a module; accepted: "
                         f"{FORMATS['.pt']} (a state dict needs its model: --weights with a zoo name)")
    return module


class OnnxFile(torch.nn.Module):
    """A user's ONNX model as the runner takes a model. Its forward runs ONNX Runtime with every graph
    optimization off: the reference each backend's output is checked against, as eager fp32 is for a torch
    model. The backends that start from ONNX (ONNX Runtime, OpenVINO) read the file itself (`path`)."""

    torch_graph = False          # no torch graph inside: nothing to compile, trace or quantize in torch
    reference = "onnxruntime-fp32-unoptimized"     # the output check's reference (Check.reference)

    def __init__(self, path: Path):
        import onnxruntime as ort

        super().__init__()
        self.path, self.digest = path.resolve(), file_sha256(str(path))
        options = ort.SessionOptions()
        options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
        options.intra_op_num_threads = torch.get_num_threads()
        self.session = ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
        self.graph_inputs = self.session.get_inputs()
        self.input_dtypes = [_ONNX_DTYPES.get(i.type, "float32") for i in self.graph_inputs]

    def static_inputs(self):
        """Example inputs of the shapes the file declares, or None when a dimension is symbolic."""
        shapes = [i.shape for i in self.graph_inputs]
        if not all(isinstance(d, int) and d > 0 for shape in shapes for d in shape):
            return None
        return ([_tensor(tuple(shape), getattr(torch, kind)) for shape, kind in zip(shapes, self.input_dtypes,
                                                                                      strict=True)], {})

    def is_conv_net(self) -> bool:
        """Convolutions over matrix products, counted in the graph: static int8 suits the first."""
        import onnx

        ops = [n.op_type for n in onnx.load(str(self.path), load_external_data=False).graph.node]
        return ops.count("Conv") > ops.count("MatMul") + ops.count("Gemm")

    def forward(self, *inputs):
        arrays = {i.name: t.detach().contiguous().numpy() for i, t in zip(self.graph_inputs, inputs, strict=True)}
        outputs = tuple(torch.from_numpy(a) for a in self.session.run(None, arrays))
        return outputs[0] if len(outputs) == 1 else outputs

    def __deepcopy__(self, memo):
        return self             # the file is the model: nothing a backend does changes it

    def train(self, mode: bool = True):
        self.training = mode
        return self


def _exported_class():
    import torch

    class Exported(torch.nn.Module):
        """An exported program's module as the runner takes it: it has no train/eval modes of its own (its
        graph was captured in eval mode), so switching them stops here."""

        def __init__(self, program_module):
            super().__init__()
            self.program = program_module

        def forward(self, *inputs):
            return self.program(*inputs)

        def train(self, mode: bool = True):
            self.training = mode
            return self

    return Exported


def _Exported(program_module):
    return _exported_class()(program_module)


def _tensor(shape, dtype):
    import torch

    if dtype.is_floating_point:
        return torch.randn(shape, generator=torch.Generator().manual_seed(0)).to(dtype)
    if dtype == torch.bool:
        return torch.ones(shape, dtype=torch.bool)
    return torch.randint(0, 100, shape, generator=torch.Generator().manual_seed(0), dtype=dtype)
