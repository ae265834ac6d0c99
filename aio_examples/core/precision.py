"""Precisions: names users pass, and casting models and inputs to them."""

from .errors import UnsupportedError, UsageError

PRECISIONS = ("fp32", "bf16", "fp16", "int8", "int4")      # int4: weight-only, for text generation
FLOAT_PRECISIONS = ("fp32", "bf16", "fp16")


def validate(name: str) -> str:
    if name not in PRECISIONS:
        raise UsageError(f"precision {name!r} is not supported; accepted: {', '.join(PRECISIONS)}")
    return name


def dtype(name: str):
    import torch

    validate(name)
    if name not in FLOAT_PRECISIONS:
        raise UnsupportedError(f"{name} is not a floating-point type; it needs quantization, not a cast")
    return {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}[name]


def cast_tree(obj, to):
    """Cast every floating tensor in a nested structure; token ids and masks stay integer."""
    import torch

    if isinstance(obj, torch.Tensor):
        return obj.to(to) if obj.is_floating_point() else obj
    if isinstance(obj, (list, tuple)):
        return type(obj)(cast_tree(o, to) for o in obj)
    if isinstance(obj, dict):
        return {k: cast_tree(v, to) for k, v in obj.items()}
    return obj


def cast(model, inputs, precision: str):
    """Run the whole model at `precision`: weights and floating inputs cast (mode "cast")."""
    to = dtype(precision)
    if precision == "fp32":
        return model, inputs, "native"
    return model.to(to), cast_tree(inputs, to), "cast"


def cast_copy(model, precision: str):
    """A copy of `model` with its floating parameters and buffers at `precision`, made without a full-precision
    copy first: deepcopy-then-cast holds both for a moment, 5 GB more for a 1B-parameter model."""
    import copy
    import itertools

    import torch

    to, memo = dtype(precision), {}
    for t in itertools.chain(model.parameters(), model.buffers()):
        if t.is_floating_point() and id(t) not in memo:     # a tied weight is cast once and stays tied
            cast = t.detach().to(to)
            memo[id(t)] = torch.nn.Parameter(cast, t.requires_grad) if isinstance(t, torch.nn.Parameter) else cast
    return copy.deepcopy(model, memo)


def kernel_gap(exc: BaseException) -> str | None:
    """The line naming a missing kernel (`"nms_kernel" not implemented for 'Half'`) anywhere in an error's
    text: TorchScript and dynamo wrap it under a generic first line."""
    return next((line.strip() for line in str(exc).splitlines() if "not implemented for" in line), None)


# fp32 fast math: an fp32 model whose GEMMs and convolutions may round their operands to a narrower type inside the
# kernel (oneDNN's fpmath mode, OpenVINO's inference precision hint), weights kept fp32. `strict` rounds nothing.
FPMATH_MODES = ("strict", "bf16", "f16")
# the precision whose tolerances judge each mode's results (measurement/output_check.py, accuracy.py)
_FPMATH_JUDGED_AS = {"bf16": "bf16", "f16": "fp16"}


def validate_fpmath(mode: str) -> str:
    if mode not in FPMATH_MODES:
        raise UsageError(f"--fpmath-mode {mode!r} is unknown; accepted: {', '.join(FPMATH_MODES)}")
    return mode


def fpmath_configs(precisions: list[str], modes: list[str]) -> list[tuple[str, str]]:
    """(precision, fast-math mode) of each configuration: fp32 in every mode asked, every other precision once,
    strict (its arithmetic is its own type's already). A mode other than strict without fp32 is refused: it
    would change nothing."""
    for m in modes:
        validate_fpmath(m)
    fast = [m for m in modes if m != "strict"]
    if fast and "fp32" not in precisions:
        raise UsageError(f"--fpmath-mode {','.join(fast)} applies to fp32 models (fp32 weights computed in "
                         f"{fast[0]}), not to {', '.join(precisions)}; accepted: -p fp32 with it, or strict")
    pairs = [(p, m) for p in precisions for m in (modes if p == "fp32" else ["strict"])]
    return list(dict.fromkeys(pairs))


def judged_as(precision: str, fpmath: str = "strict") -> str:
    """The precision whose tolerances judge a configuration's outputs and accuracy: fp32 in a fast-math mode is
    judged like the narrower type its GEMMs round to."""
    return _FPMATH_JUDGED_AS.get(fpmath, precision) if precision == "fp32" else precision
