"""What every backend provides: a name, whether it can run here, and `prepare`."""

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any


@dataclass
class Prepared:
    """A model made ready by a backend: call `fn(*inputs)` for one pass.

    `inputs` are in the backend's own form (torch tensors, numpy arrays...), made once outside
    the timed region. `fn` may return torch tensors or numpy arrays, nested in tuples/lists/dicts
    in the same order as the eager model's outputs: output checks compare them to eager fp32.
    """

    fn: Callable[..., Any]
    inputs: tuple
    precision_mode: str                         # what actually executed, e.g. "cast", "autocast", "int8-dynamic"
    info: dict = field(default_factory=dict)    # recorded in the result as backend_info
    compiles_on_first_call: bool = False        # then the runner makes one pass part of preparation
    # torch inputs as the eager model takes them -> this backend's form; None: like `inputs` (dtype, layout)
    convert: Callable[[tuple], tuple] | None = None
    # (passes, trace path or None) -> (tool, rows of {op, self_ms, calls, shapes} per pass, trace written or
    # None): the engine's own profiler (measurement/profile.py); None: torch.profiler around `fn`
    profile: Callable[[int, Any], tuple] | None = None
    # after the passes: how they ran, where that is decided pass by pass (aio switching among engines); the
    # record's strategy. None: info["strategy"], fixed at preparation
    strategy_ran: Callable[[], str] | None = None

    def feed(self, inputs: tuple) -> tuple:
        """Other inputs of the example inputs' shapes (a dataset's batches) in the form `fn` takes."""
        if self.convert is not None:
            return self.convert(inputs)
        return tuple(_like(new, ref) for new, ref in zip(inputs, self.inputs, strict=True))


def _like(new, ref):
    """`new` with `ref`'s dtype and memory layout (a backend that cast or went channels-last)."""
    import torch

    if not isinstance(ref, torch.Tensor):
        raise TypeError(f"a backend whose inputs are {type(ref).__name__} must set Prepared.convert")
    channels_last = ref.dim() == 4 and not ref.is_contiguous() and ref.is_contiguous(memory_format=torch.channels_last)
    return new.to(dtype=ref.dtype, memory_format=torch.channels_last if channels_last else torch.preserve_format)


# The optimized backend's knob (KNOBS in backends/aio/settings.py) keeping a runtime's inputs bound between passes
IO_BINDING = "io_binding"
# Prepared.info's entry of an engine that sets fp32's fast-math mode itself: its setting as read back from it
# (the runner moves it into the record's `fpmath`; without it, torch's settings are read)
FPMATH_READ_BACK = "fpmath_read_back"


def bound_pass(bind, infer):
    """A pass for a runtime whose inputs stay bound between calls (the io_binding knob): `bind(arrays)` runs only
    when a call brings other array objects than the last one did, then `infer()` runs and returns the outputs.
    The runtimes bind the arrays' memory, so data changed in place is read."""
    last: list = []

    def run(*arrays):
        if len(arrays) != len(last) or any(a is not b for a, b in zip(arrays, last)):
            bind(arrays)
            last[:] = arrays
        return infer()

    return run


def onnx_source(model):
    """The ONNX file a model is (a user's `--model-file NAME.onnx`: a graph for the runtimes, no torch graph in
    it), or None for a torch module."""
    return None if getattr(model, "torch_graph", True) else model.path


def held_bytes(model) -> int:
    """Bytes of a module's parameters and buffers, each tensor once (a tied weight is one)."""
    return sum({id(t): t.numel() * t.element_size() for t in [*model.parameters(), *model.buffers()]}.values())


@dataclass(frozen=True)
class PrepareContext:
    """What a backend may need to know about the model beyond the module and its inputs."""

    model_name: str
    task: str
    family: str                 # "vision" (conv nets, ViT), "nlp", "speech", "recommendation"...
    shape: dict                 # the model's shape settings, e.g. {"input_size": 224}
    batch_size: int
    weights_id: str             # digest of the weights: part of every cache key
    calibration: Callable[[int], list] | None = None   # n -> n input tuples for int8 calibration
    # Engine settings a backend choosing among strategies asks for beyond the defaults (KNOBS in
    # backends/aio/settings.py): e.g. {"allow_spinning": False} for ONNX Runtime. A backend honours those it knows.
    knobs: dict = field(default_factory=dict)
    # (named zero-argument pass functions, threads) -> what timing them alike found (timing.Tuned: the median ms
    # of each that ran, from rounds other processes left alone, and whether the winner is clear): how a backend
    # choosing among strategies times them. The runner hands in its own (timing.time_passes), so backends
    # never import the timing layer above them.
    time_passes: Callable[[dict[str, Callable[[], Any]], int], Any] | None = None
    # Prepared -> the zero-argument pass the runner will time (a generator's is a whole generation, not one
    # step): what a backend choosing among strategies should time. None: one call of `fn` on its inputs.
    make_pass: Callable[[Prepared], Callable[[], Any]] | None = None
    # (a prepared strategy's first output on the example inputs, precision) -> why it fails the output check
    # against eager fp32 that a record of it would get, or None: a backend choosing among strategies keeps none
    # whose outputs are wrong. The runner's (measurement/output_check.py); None: not checked.
    check: Callable[[Any, str], str | None] | None = None
    # fp32's fast-math mode (core/precision.FPMATH_MODES): torch's is set for the whole process by the runner
    # (machine/fpmath.py); an engine with a setting of its own (OpenVINO's inference precision, ONNX Runtime's
    # session options) sets it, and reads it back into `info[FPMATH_READ_BACK]`
    fpmath: str = "strict"

    def calibration_inputs(self, example_inputs: tuple, n: int = 8) -> list[tuple]:
        """Input tuples for static int8 calibration (the example inputs when nothing better is known)."""
        return self.calibration(n) if self.calibration else [example_inputs] * n


class Backend:
    """Base class. Subclasses set `name` and implement `prepare`; see eager.py for the smallest."""

    name: str = ""
    description: str = ""
    # Copies of its working weights a prepared configuration holds: compiling with freezing keeps folded or
    # repacked constants beside the module's own (inductor, aio), a runtime keeps its session's.
    copies_held: float = 1.0
    # fp32's fast-math modes it runs (core/precision.FPMATH_MODES): strict, and what its engine can set
    fpmath_modes: tuple = ("strict",)

    def unavailable_reason(self) -> str | None:
        """Why this backend cannot run on this installation at all (None when it can)."""
        return None

    def unsupported_reason(self, spec, precision: str) -> str | None:
        """Why this backend cannot run this model at this precision (None when it can)."""
        # imported here: importing the zoo imports torch
        from ..models.base import is_generator

        if precision == "int4" and not is_generator(spec.task):
            from .int8 import INT4_ONLY_GENERATION

            return INT4_ONLY_GENERATION
        return spec.unsupported_backends.get(self.name)

    def fpmath_reason(self, mode: str) -> str | None:
        """Why this backend cannot run fp32 in fast-math `mode` (None when it can)."""
        if mode in self.fpmath_modes:
            return None
        return f"{self.name} has no {mode} fast math for fp32 (it runs {', '.join(self.fpmath_modes)})"

    def memory_estimate(self, weight_bytes: int, precision: str, generator: bool) -> float:
        """Bytes a configuration prepared here holds, from the built model's fp32 `weight_bytes`: its working
        copy (bf16 for a generation step at a reduced precision, see `working_copy`) `copies_held` times."""
        from .generation import GENERATION_IN_BF16

        return weight_bytes * (0.5 if generator and precision in GENERATION_IN_BF16 else 1.0) * self.copies_held

    def knob_reason(self, knob: str, precision: str) -> str | None:
        """Why a knob of the optimized backend (PrepareContext.knobs) cannot apply at `precision` here, found
        before a copy of the model is made for its trial (None: try it)."""
        return None

    def working_copy(self, model, precision: str):
        """The copy of the built model (fp32, shared by every configuration) that `prepare` may change."""
        from .generation import generation_copy

        return generation_copy(model, precision)

    def prepare(self, model, example_inputs: tuple, precision: str, threads: int, ctx: PrepareContext) -> Prepared:
        """Make `model` (eval mode, fp32 weights) ready to run `example_inputs` at `precision`.

        Raise `UnsupportedError` (with the reason) when this model or precision cannot run here.
        """
        raise NotImplementedError
