"""Making `torch.compile(backend="aio")` resolve to this package without importing torch.

torch._dynamo finds out-of-tree backends through the `torch_dynamo_backends` entry-point group
(torch/_dynamo/backends/registry.py, `_discover_entrypoint_backends`), read the first time a backend
name is looked up, after torch's own backends are imported. The package declares that entry point in
pyproject.toml, which works once the package is installed. So that it also works from a source tree,
`install()` adds the same entry point at that same moment: right away when the registry is loaded,
else when it is imported (a one-shot import hook), so `import aio_examples` never imports torch.
A backend named "aio" that torch (or another package) already provides is left in place.
"""

import importlib.machinery
import sys

NAME = "aio"
TARGET = "aio_examples.aio_compile.backend:aio_backend"
_REGISTRY = "torch._dynamo.backends.registry"
_GROUP = "torch_dynamo_backends"


def _add_entry_point(registry) -> None:
    from importlib.metadata import EntryPoint

    if NAME not in registry._BACKENDS:
        registry._BACKENDS[NAME] = EntryPoint(name=NAME, value=TARGET, group=_GROUP)


def _hook(registry) -> None:
    """Add ours after torch's backends and installed entry points are known, so theirs win."""
    if registry._lazy_import.cache_info().currsize:     # lookups already happened: everything is known
        _add_entry_point(registry)
        return
    discover = registry._discover_entrypoint_backends
    if getattr(discover, "_aio_hooked", False):
        return

    def discover_then_add():
        discover()
        _add_entry_point(registry)

    discover_then_add._aio_hooked = True
    registry._discover_entrypoint_backends = discover_then_add


class _Loader:
    """Runs the real loader, then hooks the freshly executed registry module."""

    def __init__(self, loader):
        self._loader = loader

    def create_module(self, spec):
        return self._loader.create_module(spec)

    def exec_module(self, module):
        self._loader.exec_module(module)
        _hook(module)

    def __getattr__(self, name):            # get_source, get_code...: whatever tools ask the real loader
        return getattr(self._loader, name)


class _Watcher:
    """A meta-path finder that only reacts to the dynamo backend registry, once."""

    def find_spec(self, fullname, path, target=None):
        if fullname != _REGISTRY:
            return None
        sys.meta_path.remove(self)
        spec = importlib.machinery.PathFinder.find_spec(fullname, path)
        if spec is not None and spec.loader is not None:
            spec.loader = _Loader(spec.loader)
        return spec


def install() -> None:
    """Make backend "aio" resolvable; cheap and torch-free when torch._dynamo is not loaded yet."""
    registry = sys.modules.get(_REGISTRY)
    if registry is not None:
        _hook(registry)
    elif not any(isinstance(finder, _Watcher) for finder in sys.meta_path):
        sys.meta_path.insert(0, _Watcher())


def register() -> str:
    """Resolve backend "aio" now (imports torch) and return its provider; see `provider`."""
    from torch._dynamo.backends import registry

    _hook(registry)
    registry.lookup_backend(NAME)
    return provider()


def provider() -> str | None:
    """Who provides backend "aio": "torch-builtin" (the installed torch or another package),
    "aio_examples" (this package), or None when it cannot be resolved."""
    from torch._dynamo.backends import registry

    registry._lazy_import()
    if NAME in registry._COMPILER_FNS:
        fn = registry._COMPILER_FNS[NAME]
        ours = f"{fn.__module__}:{fn.__name__}" == TARGET
    elif registry._BACKENDS.get(NAME) is not None:
        ours = registry._BACKENDS[NAME].value == TARGET
    else:
        return None
    return "aio_examples" if ours else "torch-builtin"
