"""Work-arounds for the installed libraries, each in one named module."""

import contextlib
import importlib.util

from ..core.errors import SetupError


def before_user_code() -> None:
    """What a process does before it loads a user's module, file or folder, as the process that made it had done:
    torchvision made loadable on this torch where it is installed (a user's module may be a torchvision model, or
    import it), so unpickling or importing it works as it did in the caller. (The `aio` torch.compile backend is
    registered by `import aio_examples` itself, and the thread settings are the process's own.)"""
    if importlib.util.find_spec("torchvision") is not None:
        from .torchvision_shim import ensure_torchvision

        with contextlib.suppress(SetupError):       # a module that needs it then says why it does not load
            ensure_torchvision()
