"""A user's own model file, benchmarked like a zoo entry: a saved `torch.export` program (`.pt2`) or a
TorchScript module (`.pt`). The record is named after the file, and its digest is recorded with it."""

import zipfile
from pathlib import Path

from ..core.errors import UsageError, short_error
from .custom import CustomModel

FORMATS = {".pt2": "a saved torch.export program (torch.export.save)", ".pt": "a TorchScript module (torch.jit.save)"}
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


def load_model_file(path: str, input_shape: str | None, input_dtype: str | None):
    """(spec, module, example inputs, batch size, recorded shape) of a model file; one line when it cannot."""
    import torch

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
    saved = None
    if not zipfile.is_zipfile(file):      # both formats are zip archives: anything else is not one, say so at once
        raise UsageError(f"--model-file {path!r} is not {FORMATS[file.suffix]} (not a zip archive)")
    try:
        if file.suffix == ".pt2":
            program = torch.export.load(str(file))
            module, saved = _Exported(program.module()), program.example_inputs
        else:
            module = torch.jit.load(str(file), map_location="cpu")
    except Exception as exc:  # noqa: BLE001  (a file of another format than its suffix says)
        raise UsageError(f"--model-file {path!r} is not {FORMATS[file.suffix]} ({short_error(exc, 160)})") from None
    shapes = parse_shapes(input_shape)
    if shapes:
        kinds = dtypes if len(dtypes) == len(shapes) else dtypes[:1] * len(shapes)
        inputs = tuple(_tensor(shape, getattr(torch, kind)) for shape, kind in zip(shapes, kinds, strict=True))
    elif saved is not None and saved[0]:
        inputs = tuple(saved[0])           # the program's own example inputs
    else:
        raise UsageError(f"--model-file {path!r} does not say its input shapes; accepted: --input-shape "
                         "NAME=DxDx... (and --input-dtype)")
    try:
        with torch.no_grad():
            module(*inputs)
    except Exception as exc:  # noqa: BLE001  (the model's own message, shortened)
        raise UsageError(f"{file.name} refuses inputs of shapes {[list(t.shape) for t in inputs]}: "
                         f"{short_error(exc, 200)}") from None
    batch = int(inputs[0].shape[0]) if inputs[0].dim() > 0 else 1
    recorded = {f"input{i}": list(t.shape) for i, t in enumerate(inputs)}
    return CustomModel(file.stem, "custom", "samples", {}), module, inputs, batch, recorded


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
