"""fp32 fast math on a CPU (machine/fpmath.py): which modes canned /proc/cpuinfo of x86 and Arm servers accept, the
one-line refusal of the others, and torch's setting read back with the kernels oneDNN picks under it."""

import pytest
import torch

from aio_examples.core.errors import UsageError
from aio_examples.machine import fpmath
from aio_examples.machine.cpuinfo import parse_cpuinfo


def x86(flags: str) -> str:
    return f"processor\t: 0\nvendor_id\t: AuthenticAMD\nmodel name\t: A CPU\nflags\t\t: fpu sse2 {flags}\n\n"


def arm64(features: str) -> str:
    return (f"processor\t: 0\nBogoMIPS\t: 2100.00\nFeatures\t: fp asimd {features}\nCPU implementer\t: 0x41\n"
            "CPU architecture: 8\nCPU variant\t: 0x1\nCPU part\t: 0xd40\nCPU revision\t: 1\n\n")


CPUS = {   # name: (/proc/cpuinfo, machine, the modes it accepts)
    "EPYC with AVX-512 BF16": (x86("avx2 avx512f avx512_vnni avx512_bf16"), "x86_64", ("strict", "bf16")),
    "Xeon with AMX and AVX-512 FP16": (x86("avx512f avx512_bf16 avx512_fp16 amx_tile amx_bf16 amx_int8"), "x86_64",
                                       ("strict", "bf16", "f16")),
    "Xeon without either": (x86("avx2 avx512f avx512_vnni"), "x86_64", ("strict",)),
    "Graviton2 / Altra (Neoverse N1)": (arm64("fphp asimdhp asimddp"), "aarch64", ("strict", "f16")),
    "Graviton3 (Neoverse V1)": (arm64("fphp asimdhp sve svebf16 i8mm bf16"), "aarch64", ("strict", "bf16", "f16")),
}


@pytest.mark.parametrize("name", CPUS)
def test_the_modes_a_cpu_accepts_follow_its_native_arithmetic(name):
    text, machine, modes = CPUS[name]
    flags = parse_cpuinfo(text, machine)["flags"]
    assert fpmath.accepted(flags) == modes
    for mode in modes:
        assert fpmath.check_cpu(mode, flags) == mode


def test_f16_on_a_cpu_without_fp16_arithmetic_is_a_one_line_error_naming_what_it_accepts():
    text, machine, _ = CPUS["EPYC with AVX-512 BF16"]
    with pytest.raises(UsageError) as refused:
        fpmath.check_cpu("f16", parse_cpuinfo(text, machine)["flags"])
    said = str(refused.value)
    assert "\n" not in said and said.startswith("--fpmath-mode f16 needs native f16 arithmetic")
    assert said.endswith("accepted here: strict, bf16") and "avx512_fp16" in said and "asimdhp" in said
    text, machine, _ = CPUS["Xeon without either"]
    with pytest.raises(UsageError, match="accepted here: strict$"):
        fpmath.check_cpu("bf16", parse_cpuinfo(text, machine)["flags"])


def test_an_implementation_name_says_whether_it_computes_narrower():
    assert fpmath.reduced("brg_matmul:avx512_core_amx", "bf16") is True
    assert fpmath.reduced("brg_conv_fwd:avx512_core_amx_fp16", "f16") is True
    assert fpmath.reduced("jit:avx512_core_bf16", "bf16") is True
    assert fpmath.reduced("jit:avx512_core", "bf16") is False
    assert fpmath.reduced("brg_matmul:avx2", "bf16") is False
    assert fpmath.reduced("gemm:acl", "bf16") is None        # Arm's Compute Library does not say


@pytest.fixture
def torch_strict():
    """torch's fp32_precision settings put back after a test that turns fast math on in this process."""
    kinds = {kind: getattr(torch.backends.mkldnn, kind).fp32_precision for kind in fpmath.TORCH_KINDS}
    yield
    for kind, value in kinds.items():
        getattr(torch.backends.mkldnn, kind).fp32_precision = value


@pytest.mark.skipif(not torch.backends.mkldnn.is_available(), reason="a torch without oneDNN")
def test_torch_fast_math_is_read_back_from_torch_and_from_the_kernels_onednn_creates(torch_strict, monkeypatch):
    for variable in fpmath.DEFAULT_MODE_VARIABLES:
        monkeypatch.delenv(variable, raising=False)
    strict = fpmath.torch_read_back("strict")
    assert "onednn_kernels" not in strict and strict["onednn_default_fpmath_mode"] == "strict"
    assert {strict[f"torch.backends.mkldnn.{k}.fp32_precision"] for k in fpmath.TORCH_KINDS} <= {"none", "ieee"}
    fpmath.apply_torch("bf16")
    back = fpmath.torch_read_back("bf16")
    assert all(back[f"torch.backends.mkldnn.{k}.fp32_precision"] == "bf16" for k in fpmath.TORCH_KINDS)
    kernels = back["onednn_kernels"]
    # oneDNN's own log of the primitives torch created: the attribute reached both kinds (torch hands an fp32
    # matmul to oneDNN under fast math only where oneDNN has bf16 kernels for it; an AVX2 CPU's stays in its BLAS)
    native = "bf16" in fpmath.accepted(fpmath.cpu_flags())
    assert "convolution" in kernels and ("matmul" in kernels or not native)
    assert {k["fpmath"] for k in kernels.values()} == {"bf16"}
    honoured = [k["reduced"] for k in kernels.values()]
    # a warning exactly when every kernel computes fp32 all the same (here: a CPU without AMX)
    assert (fpmath.kernel_warning(back, "bf16") is not None) == all(h is False for h in honoured)
    with pytest.raises(ValueError, match="no f16"):
        fpmath.apply_torch("f16")


def test_a_onednn_default_mode_in_the_environment_is_a_warning(monkeypatch):
    for variable in fpmath.DEFAULT_MODE_VARIABLES:
        monkeypatch.delenv(variable, raising=False)
    assert fpmath.default_warning() is None
    monkeypatch.setenv("DNNL_DEFAULT_FPMATH_MODE", "BF16")
    assert fpmath.onednn_default() == "bf16" and "eager fp32's reference included" in fpmath.default_warning()
