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
