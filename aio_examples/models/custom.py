"""A user's own nn.Module, benchmarked like a zoo entry."""

from dataclasses import dataclass

from .base import ModelSpec


@dataclass(frozen=True)
class CustomModel(ModelSpec):
    """Throughput counts samples: the first dimension of the first input."""

    def input_shape(self, batch_size, shape):
        return {"batch_size": batch_size, **shape}


def custom_spec(module, example_inputs: tuple) -> tuple[CustomModel, int, dict]:
    """Spec, batch size and recorded shape for a user's module and inputs."""
    first = example_inputs[0]
    batch = int(first.shape[0]) if getattr(first, "dim", lambda: 0)() > 0 else 1
    shapes = {f"input{i}": list(t.shape) for i, t in enumerate(example_inputs) if hasattr(t, "shape")}
    spec = CustomModel(type(module).__name__, "custom", "samples", {})
    return spec, batch, shapes


def save_module(module, example_inputs: tuple, path) -> None:
    """A user's module and its example inputs in one file another process loads (`load_module`), for a run
    whose configurations each have a process of their own. cloudpickle writes the module's class by value when
    it is defined where the other process cannot import it from (a notebook, a script's __main__); a class of an
    importable module is found through this process's import path, saved first (as multiprocessing does)."""
    import pickle
    import sys

    import cloudpickle

    with open(path, "wb") as f:
        pickle.dump(list(sys.path), f)
        cloudpickle.dump({"module": module, "example_inputs": tuple(example_inputs)}, f)


def load_module(path) -> tuple:
    """(module, example inputs) saved by `save_module` (a file this package wrote for a run of its own)."""
    import pickle
    import sys

    with open(path, "rb") as f:
        sys.path.extend(p for p in pickle.load(f) if p not in sys.path)
        saved = pickle.load(f)
    return saved["module"], saved["example_inputs"]
