"""What every backend provides: a name, whether it can run here, and `prepare`."""

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any


@dataclass
class Prepared:
    """A model made ready by a backend: call `fn(*inputs)` for one pass."""

    fn: Callable[..., Any]
    inputs: tuple
    precision_mode: str
    info: dict = field(default_factory=dict)    # recorded in the result as backend_info
    compiles_on_first_call: bool = False        # then the runner makes one pass part of preparation


class Backend:
    """Base class. Subclasses set `name` and implement `prepare`; see eager.py for the smallest."""

    name: str = ""
    description: str = ""

    def unavailable_reason(self) -> str | None:
        """Why this backend cannot run on this installation at all (None when it can)."""
        return None

    def unsupported_reason(self, spec, precision: str) -> str | None:
        """Why this backend cannot run this model at this precision (None when it can)."""
        return spec.unsupported_backends.get(self.name)

    def prepare(self, model, example_inputs: tuple, precision: str, threads: int) -> Prepared:
        """Make `model` (eval mode, fp32 weights) ready to run `example_inputs` at `precision`."""
        raise NotImplementedError
