"""What the CPU can do, as far as the passes' choices depend on it."""

import platform
from functools import cache
from pathlib import Path

_BF16_FLAGS = {"avx512_bf16", "amx_bf16", "bf16"}       # x86 flags, and the aarch64 feature
_VNNI_FLAGS = {"avx512_vnni", "avx_vnni", "amx_int8"}


@cache
def cpu_flags() -> frozenset[str]:
    """Instruction-set flags from /proc/cpuinfo (x86 "flags", aarch64 "Features"); empty when unknown."""
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return frozenset()
    return frozenset(flag for line in text.splitlines() if line.split(":")[0].strip() in ("flags", "Features")
                     for flag in line.split(":", 1)[1].split())


def reduced_dtype():
    """bf16 where the CPU has bf16 instructions, else fp16; and why."""
    import torch

    flags = cpu_flags()
    if flags & _BF16_FLAGS:
        return torch.bfloat16, "CPU has " + "/".join(sorted(flags & _BF16_FLAGS))
    if not flags and torch.backends.mkldnn.is_available() and torch.ops.mkldnn._is_mkldnn_bf16_supported():
        return torch.bfloat16, "oneDNN reports bf16 support"
    return torch.float16, "no bf16 instructions (avx512_bf16, amx_bf16) on this CPU"


def int8_activation_max() -> tuple[int, str]:
    """Largest quantized activation value.

    x86 CPUs without VNNI multiply u8 x s8 pairs into saturating int16 sums, which wrecks results for
    activations near 255; 7-bit activations (0..127) cannot saturate.
    """
    if platform.machine().lower() in ("x86_64", "amd64", "i686") and not cpu_flags() & _VNNI_FLAGS:
        return 127, "7-bit activations: no VNNI on this x86 CPU, so 8-bit ones would saturate int16 sums"
    return 255, "8-bit activations"
