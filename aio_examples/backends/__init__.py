"""Backend registry: one line per backend, each in its own module."""

from ..core.errors import UsageError
from .base import Backend, PrepareContext, Prepared
from .eager import EagerBackend
from .inductor import InductorBackend
from .onnxruntime import OnnxRuntimeBackend
from .openvino import OpenVinoBackend
from .optimized import AioBackend
from .torchscript import TorchScriptBackend

BACKENDS: dict[str, Backend] = {b.name: b for b in (
    AioBackend(),
    EagerBackend(),
    TorchScriptBackend(),
    InductorBackend(),
    OnnxRuntimeBackend(),
    OpenVinoBackend(),
)}

DEFAULT_BACKEND = "aio"


def get_backend(name: str) -> Backend:
    try:
        return BACKENDS[name]
    except KeyError:
        raise UsageError(f"backend {name!r} is unknown; accepted: {', '.join(BACKENDS)}, all") from None


def available_backends() -> list[str]:
    return [name for name, b in BACKENDS.items() if b.unavailable_reason() is None]


__all__ = ["BACKENDS", "DEFAULT_BACKEND", "Backend", "PrepareContext", "Prepared", "available_backends", "get_backend"]
