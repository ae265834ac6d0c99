"""Backend registry: one line per backend, each in its own module."""

from ..core.registry import lookup
from .aio import AioBackend, AioTorchBackend
from .base import Backend, PrepareContext, Prepared
from .eager import EagerBackend
from .inductor import InductorBackend
from .llama_cpp import LlamaCppBackend
from .onnxruntime import OnnxRuntimeBackend
from .onnxruntime_genai import OnnxRuntimeGenAIBackend
from .openvino import OpenVinoBackend
from .openvino_genai import OpenVINOGenAIBackend
from .torchscript import TorchScriptBackend

# The engines are built first: the optimized backend runs its strategies on these same instances.
_eager, _inductor, _onnxruntime, _openvino = EagerBackend(), InductorBackend(), OnnxRuntimeBackend(), OpenVinoBackend()
_llama_cpp, _onnxruntime_genai, _openvino_genai = LlamaCppBackend(), OnnxRuntimeGenAIBackend(), OpenVINOGenAIBackend()

BACKENDS: dict[str, Backend] = {b.name: b for b in (
    AioBackend(engines={e.name: e for e in (_onnxruntime, _openvino, _inductor, _eager, _llama_cpp,
                                             _onnxruntime_genai, _openvino_genai)}),
    AioTorchBackend(inductor=_inductor),
    _eager,
    TorchScriptBackend(),
    _inductor,
    _onnxruntime,
    _openvino,
    _llama_cpp,
    _onnxruntime_genai,
    _openvino_genai,
)}

DEFAULT_BACKEND = "aio"


def get_backend(name: str) -> Backend:
    return lookup(BACKENDS, name, "backend", also=("all",))


def available_backends() -> list[str]:
    return [name for name, b in BACKENDS.items() if b.unavailable_reason() is None]


__all__ = ["BACKENDS", "DEFAULT_BACKEND", "Backend", "PrepareContext", "Prepared", "available_backends", "get_backend"]
