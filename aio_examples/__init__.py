"""aio-examples: benchmark and evaluate CPU inference with PyTorch across backends and precisions.

`from aio_examples import benchmark` is the entry point for notebooks and scripts; the CLI is
`aio-examples` (or `python -m aio_examples`) and each model folder's `run.py`.
"""

from .aio_compile import install as _install_aio_backend
from .compat import renamed as _renamed
from .core import telemetry as _telemetry

__version__ = "0.1.0"

# torch.compile(backend="aio") works after `import aio_examples`, without importing torch here.
_install_aio_backend()
# Before any library that reports usage is imported (OpenVINO does on import): decline for this process.
_telemetry.opt_out()
# Release 0.1's module paths (aio_examples.compare, aio_examples.report, ...) still import, with a warning.
_renamed.install()


def __getattr__(name):
    # Lazy, so `import aio_examples` stays cheap and the CLI can set thread env vars before torch loads.
    if name == "benchmark":
        from .api import benchmark

        return benchmark
    if name == "Result":
        from .core.records import Result

        return Result
    raise AttributeError(name)


__all__ = ["Result", "__version__", "benchmark"]
