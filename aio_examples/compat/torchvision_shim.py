"""Load a CUDA-built torchvision wheel on a CPU-only torch.

The torchvision wheel for x86_64 is linked against `libc10_cuda.so` and `libtorch_cuda.so`,
which a CPU build of torch does not ship, so `import torchvision` fails with
"operator torchvision::nms does not exist". Its CPU kernels need none of those symbols at
run time. When (and only when) the installed `_C.so` cannot be loaded, this module compiles
tiny stand-in libraries that define exactly the `c10::cuda::`/`at::cuda::` symbols it asks
for (each aborts with its name if it is ever called), loads them under the expected names,
and then imports torchvision normally, so its own CPU kernels run. A CPU build of
torchvision loads directly and never meets any of this.
"""

import ctypes
import hashlib
import importlib.util
import os
import shutil
import subprocess
import sys
from pathlib import Path

from ..core.errors import SetupError
from ..core.paths import cache_dir

STUB_NAMESPACES = ("c10::cuda::", "at::cuda::")
STUB_LIBS = ("libc10_cuda.so", "libtorch_cuda.so")

_state: dict | None = None


def _run(cmd: list[str]) -> str:
    try:
        return subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
    except FileNotFoundError as exc:
        raise SetupError(f"{cmd[0]} is needed to adapt the CUDA build of torchvision to CPU torch; "
                         "install binutils and gcc, or torchvision's CPU build") from exc
    except subprocess.CalledProcessError as exc:
        raise SetupError(f"{' '.join(cmd)} failed: {exc.stderr.strip().splitlines()[-1:]}") from exc


def _needed(lib: Path) -> list[str]:
    out = _run(["readelf", "-d", str(lib)])
    return [line.split("[", 1)[1].rstrip("]") for line in out.splitlines() if "(NEEDED)" in line]


def _soname(lib: Path) -> str | None:
    for line in _run(["readelf", "-d", str(lib)]).splitlines():
        if "(SONAME)" in line:
            return line.split("[", 1)[1].rstrip("]")
    return None


def missing_cuda_symbols(lib: Path) -> list[tuple[str, bool]]:
    """Strongly undefined CUDA-namespace symbols of `lib`, as (mangled name, is_function)."""
    raw = _run(["nm", "-D", "--undefined-only", str(lib)]).splitlines()
    demangled = _run(["nm", "-D", "-C", "--undefined-only", str(lib)]).splitlines()
    symbols = []
    for line, pretty in zip(raw, demangled):
        kind, name = line.split()[-2:]
        pretty_name = pretty.split(None, 1)[1]
        if kind == "U" and pretty_name.startswith(STUB_NAMESPACES):
            symbols.append((name, "(" in pretty_name))
    return symbols


def stub_source(symbols: list[tuple[str, bool]]) -> str:
    """C source defining each symbol: functions abort loudly, data objects are zeroed storage."""
    lines = ["#include <stdio.h>", "#include <stdlib.h>",
             "static void stub_called(const char *name) {",
             '    fprintf(stderr, "aio-examples: CUDA stand-in %s was called on a CPU-only torch\\n", name);',
             "    abort();", "}"]
    for name, is_function in symbols:
        if is_function:
            lines.append(f'void {name}(void) {{ stub_called("{name}"); }}')
        else:
            lines.append(f"void *{name}[8];")
    return "\n".join(lines) + "\n"


def _build(symbols, out_dir: Path) -> list[Path]:
    cc = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")
    if not cc:
        raise SetupError("a C compiler (gcc) is needed to adapt the CUDA build of torchvision to CPU torch; "
                         "install gcc, or torchvision's CPU build")
    libs = []
    for soname in STUB_LIBS:
        prefix = "_ZN3c104cuda" if soname == "libc10_cuda.so" else "_ZN2at4cuda"
        mine = [s for s in symbols if s[0].replace("_ZNK", "_ZN", 1).startswith(prefix)]
        target = out_dir / soname
        if not target.exists():
            # Per-process names: several processes of a sweep or a multi-instance run may build at once,
            # and the last atomic rename wins with an identical library.
            src = out_dir / f"{soname}.{os.getpid()}.c"
            src.write_text(stub_source(mine))
            tmp = out_dir / f"{soname}.{os.getpid()}.tmp"
            _run([cc, "-shared", "-fPIC", "-O1", f"-Wl,-soname,{soname}", "-o", str(tmp), str(src)])
            tmp.replace(target)
            src.unlink()
        libs.append(target)
    return libs


def _package_dir() -> Path | None:
    spec = importlib.util.find_spec("torchvision")
    return Path(spec.origin).parent if spec and spec.origin else None


def ensure_torchvision():
    """Import torchvision, adapting the CUDA wheel to CPU torch only if it cannot load as is."""
    global _state
    if _state is not None:
        import torchvision
        return torchvision
    import torch  # noqa: F401  (loads libc10/libtorch globally, which _C.so needs)

    pkg = _package_dir()
    if pkg is None:
        raise SetupError("torchvision is not installed; run the set-up command in README.md")
    ext = next(iter(sorted(pkg.glob("_C*.so"))), None)
    state = {"torchvision_ops": "torchvision (as installed)", "cuda_stub_symbols": 0}
    if ext is not None:
        try:
            ctypes.CDLL(str(ext))
        except OSError as exc:
            state = _apply(pkg, ext, str(exc))
    try:
        import torchvision
    except Exception as exc:
        raise SetupError(f"torchvision {getattr(sys.modules.get('torchvision'), '__version__', '')} "
                         f"does not import: {exc}") from exc
    state["torchvision"] = torchvision.__version__
    _state = state
    return torchvision


def _apply(pkg: Path, ext: Path, why: str) -> dict:
    symbols = missing_cuda_symbols(ext)
    if not symbols:
        raise SetupError(f"torchvision's {ext.name} does not load ({why}) and no CUDA symbols explain it; "
                         "install a torchvision that matches torch")
    stat = ext.stat()
    key = hashlib.sha256(f"{ext}:{stat.st_size}:{stat.st_mtime_ns}".encode()).hexdigest()[:16]
    out_dir = cache_dir("torchvision-shim", key)
    bundled = pkg.parent / "torchvision.libs"
    for needed in _needed(ext):
        if needed.startswith("libcudart"):
            match = [p for p in bundled.glob("libcudart*") if _soname(p) == needed]
            if not match:
                raise SetupError(f"torchvision needs {needed}, which its wheel does not bundle")
            ctypes.CDLL(str(match[0]), mode=ctypes.RTLD_GLOBAL)
    for lib in _build(symbols, out_dir):
        ctypes.CDLL(str(lib), mode=ctypes.RTLD_GLOBAL)
    return {"torchvision_ops": "wheel CPU kernels with CUDA stand-ins", "cuda_stub_symbols": len(symbols),
            "cuda_stub_dir": str(out_dir)}


def torchvision_status() -> dict:
    """What every result records about torchvision: version and whose ops are in use."""
    if _state is None:
        return {"torchvision_ops": "not loaded"}
    return dict(_state)
