"""fp32 fast math on this CPU: which modes it can compute natively, torch's setting of them, and what oneDNN runs.

A fast-math mode lets oneDNN round an fp32 convolution's or matmul's operands to bf16 (or f16) inside the kernel,
weights and activations kept fp32 (oneDNN's fpmath mode). torch sets it per primitive kind through
`torch.backends.mkldnn.{matmul,conv,rnn}.fp32_precision`, which can change at run time: a run computes eager fp32's
reference outputs strict, then turns the mode on for the configuration it measures. oneDNN's process-wide default
(`ONEDNN_DEFAULT_FPMATH_MODE`, or `DNNL_DEFAULT_FPMATH_MODE`) is read once and reaches every primitive, the
reference's too, so the harness never sets it; a user who does is told so in the record.

Whether the mode is honoured is read back twice: the settings after setting them, and the kernels oneDNN picks
for a small convolution and matmul under them (its verbose log): a CPU without bf16 kernels for fp32 primitives
runs its fp32 ones with the attribute set, and the record says so.
"""

import os
import re
import sys
import tempfile

from ..core.errors import UsageError

# CPU flags (x86's /proc/cpuinfo `flags`, Arm's `Features`) giving native arithmetic in each mode's type
NATIVE_FLAGS = {"bf16": ("avx512_bf16", "amx_bf16", "bf16"), "f16": ("avx512_fp16", "amx_fp16", "fphp", "asimdhp")}
# The modes torch's fp32_precision settings take (they also take tf32, a GPU type): no f16
TORCH_MODES = ("strict", "bf16")
TORCH_KINDS = ("matmul", "conv", "rnn")
TORCH_NO_F16 = "torch has no f16 fast math (torch.backends.mkldnn's fp32_precision takes bf16, not f16)"
DEFAULT_MODE_VARIABLES = ("ONEDNN_DEFAULT_FPMATH_MODE", "DNNL_DEFAULT_FPMATH_MODE")     # oneDNN reads them in order
PROBE = "a 64-channel 3x3 convolution of 28x28 and a 4x256 by 256x256 matmul"
_MODE_TAGS = {"bf16": "bf16", "f16": "fp16"}      # how oneDNN's implementation names say the type


def accepted(flags) -> tuple[str, ...]:
    """The fast-math modes a CPU with these flags computes natively (strict always)."""
    have = set(flags)
    return ("strict", *(mode for mode, native in NATIVE_FLAGS.items() if have & set(native)))


def cpu_flags() -> list[str]:
    from .cpuinfo import read_cpu

    return read_cpu()["flags"]


def check_cpu(mode: str, flags=None) -> str:
    """`mode`, when this CPU (or one with `flags`) has native arithmetic for it; else a one-line UsageError naming
    what it accepts."""
    ok = accepted(cpu_flags() if flags is None else flags)
    if mode not in ok:
        raise UsageError(f"--fpmath-mode {mode} needs native {mode} arithmetic, which this CPU lacks (it has none of "
                         f"{', '.join(NATIVE_FLAGS[mode])}); accepted here: {', '.join(ok)}")
    return mode


def apply_torch(mode: str) -> None:
    """Turn `mode` on for every oneDNN primitive kind torch sets it for (strict: leave torch's own defaults)."""
    import torch

    if mode not in TORCH_MODES:
        raise ValueError(TORCH_NO_F16)
    if mode != "strict":
        for kind in TORCH_KINDS:
            getattr(torch.backends.mkldnn, kind).fp32_precision = mode


def onednn_default() -> str:
    """oneDNN's process-wide default mode, from the environment it read at start ("strict" when unset)."""
    return next((os.environ[v].strip().lower() for v in DEFAULT_MODE_VARIABLES if os.environ.get(v, "").strip()),
                "strict")


def torch_read_back(mode: str) -> dict:
    """torch's settings as read after setting them, oneDNN's default mode, and (for a fast-math mode) the kernels
    oneDNN picks under them for a small convolution and matmul."""
    import torch

    out = {f"torch.backends.mkldnn.{kind}.fp32_precision": getattr(torch.backends.mkldnn, kind).fp32_precision
           for kind in TORCH_KINDS}
    out["onednn_default_fpmath_mode"] = onednn_default()
    if mode != "strict":
        kernels = onednn_kernels(mode)
        if kernels is not None:
            out["onednn_kernels"] = kernels
    return out


def onednn_kernels(mode: str) -> dict | None:
    """{primitive: {implementation, fpmath, reduced}} of the probe's convolution and matmul (PROBE), from
    oneDNN's verbose log; `reduced` says whether the implementation computes in `mode`'s type (None: its name does
    not say). None when the log cannot be read (a torch without oneDNN or its verbose mode)."""
    import torch

    if not torch.backends.mkldnn.is_available():
        return None
    x, weight = torch.randn(1, 64, 28, 28), torch.randn(64, 64, 3, 3)
    a, b = torch.randn(4, 256), torch.randn(256, 256)

    def work():
        with torch.no_grad():
            torch.nn.functional.conv2d(x, weight, padding=1)
            torch.nn.functional.linear(a, b)

    try:
        lines = _verbose_lines(work)
    except Exception:  # noqa: BLE001  (no verbose mode in this build: the settings read back are all there is)
        return None
    kernels = {}
    for line in lines:
        fields = line.split(",")
        if "exec" not in fields:
            continue
        at = fields.index("exec")
        primitive, implementation, attributes = fields[at + 2], fields[at + 3], ",".join(fields[at + 6:at + 7])
        if primitive == "reorder" or primitive in kernels:
            continue
        found = re.search(r"attr-fpmath:(\w+)", attributes)
        kernels[primitive] = {"implementation": implementation, "fpmath": found[1] if found else "strict",
                              "reduced": reduced(implementation, mode)}
    return kernels or None


def reduced(implementation: str, mode: str) -> bool | None:
    """Whether a oneDNN implementation (`brg_matmul:avx512_core_amx`) computes in `mode`'s type: AMX tiles or an
    ISA named for the type do; another x86 ISA (`jit:avx512_core`) computes fp32; other names do not say (Arm's
    Compute Library dispatches its bf16 kernels under the same name)."""
    name = implementation.lower()
    if "amx" in name or _MODE_TAGS.get(mode, mode) in name:
        return True
    return False if ("avx" in name or "sse" in name) else None


def _verbose_lines(work) -> list[str]:
    """What oneDNN's verbose mode prints (to the C stdout) while `work()` runs, caught in a file."""
    import ctypes

    import torch

    libc = ctypes.CDLL(None)
    sys.stdout.flush()
    libc.fflush(None)
    saved = os.dup(1)
    with tempfile.TemporaryFile() as caught:
        os.dup2(caught.fileno(), 1)
        try:
            with torch.backends.mkldnn.verbose(torch.backends.mkldnn.VERBOSE_ON):
                work()
        finally:
            libc.fflush(None)
            os.dup2(saved, 1)
            os.close(saved)
        caught.seek(0)
        return caught.read().decode(errors="replace").splitlines()


def kernel_warning(read_back: dict, mode: str) -> str | None:
    """The warning of a record whose fast math changed no kernel: oneDNN ran fp32 implementations with the mode
    set, so its timings are strict math's."""
    kernels = read_back.get("onednn_kernels") or {}
    if mode == "strict" or not kernels or any(k["reduced"] is not False for k in kernels.values()):
        return None
    names = ", ".join(f"{p} {k['implementation']}" for p, k in kernels.items())
    return (f"fpmath {mode} asked, but oneDNN runs fp32 kernels with it on this CPU ({names}, for {PROBE}): "
            "torch's fast math computes as strict here")


def default_warning() -> str | None:
    """The warning of a record made under a oneDNN default mode other than strict."""
    mode = onednn_default()
    if mode == "strict":
        return None
    return (f"oneDNN's default fpmath mode is {mode} in this environment ({' or '.join(DEFAULT_MODE_VARIABLES)}): "
            "every oneDNN primitive of the process, eager fp32's reference included, may compute in it, so strict "
            "is not strict and the output check compares fast math with fast math")

