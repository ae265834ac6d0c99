"""aio-examples: benchmark and evaluate CPU inference with PyTorch across backends and precisions.

`from aio_examples import benchmark` is the entry point for notebooks and scripts; the CLI is
`aio-examples` (or `python -m aio_examples`) and each model folder's `run.py`.
"""

__version__ = "0.1.0"


def __getattr__(name):
    # Lazy, so `import aio_examples` stays cheap and the CLI can set thread env vars before torch loads.
    if name == "benchmark":
        from .api import benchmark

        return benchmark
    if name == "Result":
        from .results import Result

        return Result
    raise AttributeError(name)


__all__ = ["Result", "__version__", "benchmark"]
