"""The module paths of release 0.1, kept importable for one release (see docs/architecture.md).

`import aio_examples.compare` still works: a finder on `sys.meta_path` answers the old name with the
module (or, for a module that was split, a module holding the names of its parts) and warns once with
the new path. Nothing here is imported by the package itself.
"""

import importlib
import importlib.abc
import importlib.util
import sys
import types
import warnings

PACKAGE = "aio_examples"

# old name -> the new modules whose public names it offers (the first one alone when it was only moved)
RENAMED = {
    "errors": ("core.errors",), "results": ("core.records",), "precision": ("core.precision",),
    "paths": ("core.paths",), "log": ("core.log",), "launch": ("core.processes", "drivers.worker"),
    "topology": ("machine.topology",), "threads": ("machine.threads",), "binding": ("machine.binding",),
    "allocators": ("machine.allocators",), "environment": ("machine.environment",),
    "machine_probe": ("machine.probe",), "peak": ("machine.peak",),
    "artifacts": ("backends.artifacts",), "onnx_export": ("backends.exports",), "quantize": ("backends.int8",),
    "backends.optimized": ("backends.aio.backend", "backends.aio.settings"),
    "timing": ("measurement.timing",), "stats": ("measurement.stats",), "checks": ("measurement.output_check",),
    "flops": ("measurement.flops",), "runner": ("measurement.runner",),
    "sweep": ("drivers.sweep",), "matrix": ("drivers.matrix",), "instances": ("drivers.instances",),
    "turns": ("drivers.turns",),
    "compare": ("analysis.compare", "analysis.runs", "analysis.noise", "reporting.regression", "analysis.history"),
    "history": ("analysis.history",),
    "report": ("reporting.report",), "nightly": ("reporting.nightly",), "demo": ("reporting.demo",),
}


class _Loader(importlib.abc.Loader):
    def __init__(self, old: str, new: tuple):
        self.old, self.new = old, new

    def create_module(self, spec):
        modules = [importlib.import_module(f"{PACKAGE}.{name}") for name in self.new]
        warnings.warn(f"{spec.name} moved to {', '.join(m.__name__ for m in modules)}; the old path goes away in "
                      "the next release", DeprecationWarning, stacklevel=2)
        if len(modules) == 1:
            return modules[0]
        merged = types.ModuleType(spec.name, f"Release 0.1's {spec.name}: the names of {', '.join(self.new)}")
        for module in reversed(modules):         # the first module wins a name two of them define
            merged.__dict__.update({k: v for k, v in vars(module).items() if not k.startswith("__")})
        return merged

    def exec_module(self, module):
        pass


class _Finder(importlib.abc.MetaPathFinder):
    def find_spec(self, fullname, path=None, target=None):
        prefix = PACKAGE + "."
        if not fullname.startswith(prefix) or fullname[len(prefix):] not in RENAMED:
            return None
        return importlib.util.spec_from_loader(fullname, _Loader(fullname, RENAMED[fullname[len(prefix):]]))


def install() -> None:
    if not any(isinstance(f, _Finder) for f in sys.meta_path):
        sys.meta_path.append(_Finder())
