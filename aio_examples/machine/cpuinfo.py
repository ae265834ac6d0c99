"""What the CPU is: its name, its ISA features and, on Arm, its SVE/SME vector lengths.

x86 names itself in /proc/cpuinfo's `model name`. arm64 does not: each processor block gives `CPU implementer`
and `CPU part` (the MIDR_EL1 fields) and a `Features` line, so the core is decoded here with the ids of the
Linux kernel's arch/arm64/include/asm/cputype.h. A cloud's own name for its chip (AWS Graviton) is not in the
MIDR: it comes from the platform's firmware (SMBIOS system vendor, or the SoC name the SMCCC SOC_ID call
gives, /sys/bus/soc/devices/soc0/machine). The SVE vector length differs between cores that all say `sve`, and
kernels are chosen by it (llama.cpp's KleidiAI SVE kernels run at one length only); it is not in /proc/cpuinfo
at all: prctl(PR_SVE_GET_VL) gives this process's, /proc/sys/abi/sve_default_vector_length the one new
processes start with.

The parsers take canned text so tests can describe machines that are not here.
"""

import ctypes
import ctypes.util
import platform
from pathlib import Path

# The x86 `flags` and the arm64 `Features` worth recording: the vector, matrix and dot-product extensions the
# kernels of the frameworks choose by. Per architecture: x86's `sme` is AMD's memory encryption, not Arm's SME.
X86_ISA_PREFIXES = ("avx2", "avx512", "amx", "avx_vnni", "fma")
ARM_ISA_PREFIXES = ("fphp", "asimd", "sve", "sme", "bf16", "ebf16", "i8mm")
ARM_MACHINES = ("aarch64", "arm64")

# (implementer, part) -> core, from cputype.h (ARM_CPU_IMP_ARM 0x41, ARM_CPU_IMP_AMPERE 0xC0)
ARM_CORES = {
    (0x41, 0xD0C): "Neoverse N1",         # AWS Graviton2, Ampere Altra and Altra Max
    (0x41, 0xD40): "Neoverse V1",         # AWS Graviton3
    (0x41, 0xD49): "Neoverse N2",         # also Microsoft Azure Cobalt 100
    (0x41, 0xD4F): "Neoverse V2",         # AWS Graviton4
    (0x41, 0xD83): "Neoverse V3AE",
    (0x41, 0xD84): "Neoverse V3",
    (0x41, 0xD8E): "Neoverse N3",
    (0x41, 0xD0B): "Cortex-A76",
    (0x41, 0xD41): "Cortex-A78",
    (0x41, 0xD44): "Cortex-X1",
    (0xC0, 0xAC3): "AmpereOne",           # AMPERE_CPU_PART_AMPERE1
    (0xC0, 0xAC4): "AmpereOne (AC04)",    # AMPERE_CPU_PART_AMPERE1A
}
IMPLEMENTERS = {0x41: "Arm", 0x42: "Broadcom", 0x43: "Cavium", 0x46: "Fujitsu", 0x48: "HiSilicon",
                0x4E: "NVIDIA", 0x51: "Qualcomm", 0x61: "Apple", 0x6D: "Microsoft", 0xC0: "Ampere"}
# AWS builds Graviton on Arm's cores: the part says which generation when the firmware says AWS
GRAVITON = {(0x41, 0xD0C): "AWS Graviton2", (0x41, 0xD40): "AWS Graviton3", (0x41, 0xD4F): "AWS Graviton4"}

PR_SVE_GET_VL, PR_SME_GET_VL, PR_VL_LEN_MASK = 51, 64, 0xFFFF      # linux/prctl.h


def _blocks(text: str) -> list[dict[str, str]]:
    """The `key : value` lines of /proc/cpuinfo, one dict per processor block (blank lines separate them)."""
    blocks: list[dict[str, str]] = [{}]
    for line in text.splitlines():
        if not line.strip():
            if blocks[-1]:
                blocks.append({})
            continue
        key, sep, value = line.partition(":")
        if sep:
            blocks[-1].setdefault(key.strip(), value.strip())
    return [b for b in blocks if b]


def _hex(value: str | None) -> int | None:
    try:
        return int(value, 0) if value else None
    except ValueError:
        return None


def arm_core_name(implementer: int, part: int) -> str:
    """The core's name, or the implementer and the raw part when this table does not know it."""
    known = ARM_CORES.get((implementer, part))
    if known:
        return known
    return f"{IMPLEMENTERS.get(implementer, f'implementer {implementer:#04x}')} part {part:#05x}"


def arm_cpu_name(ids: list[tuple[int, int]], system_vendor: str | None = None, soc_machine: str | None = None) -> str:
    """The name users know: 'AWS Graviton3 (Neoverse V1)', 'Neoverse N1', 'AmpereOne'; each core type once on
    a machine that mixes them. The firmware's SoC name wins, then a Graviton known by its part on AWS."""
    cores = " + ".join(dict.fromkeys(arm_core_name(i, p) for i, p in ids)) or "unknown Arm CPU"
    if soc_machine:
        return f"{soc_machine} ({cores})"
    graviton = {GRAVITON.get(i) for i in ids}
    if system_vendor and system_vendor.lower().startswith("amazon") and len(graviton) == 1 and None not in graviton:
        return f"{graviton.pop()} ({cores})"
    return cores


def parse_cpuinfo(text: str, machine: str, system_vendor: str | None = None, soc_machine: str | None = None) -> dict:
    """{"name", "isa", "flags"} from /proc/cpuinfo's text, plus {"cpu_id"} on Arm (the first processor's MIDR
    fields, and the distinct parts when the cores differ). `name` is None when the text does not say it."""
    blocks = _blocks(text)
    first = blocks[0] if blocks else {}
    if machine in ARM_MACHINES:
        flags = first.get("Features", "").split()
        ids = [(i, p) for b in blocks
               if (i := _hex(b.get("CPU implementer"))) is not None and (p := _hex(b.get("CPU part"))) is not None]
        ids = list(dict.fromkeys(ids))
        out = {"name": arm_cpu_name(ids, system_vendor, soc_machine) if ids or soc_machine else None,
               "flags": flags, "isa": sorted(f for f in flags if f.startswith(ARM_ISA_PREFIXES))}
        if ids:
            out["cpu_id"] = {"implementer": first.get("CPU implementer"), "part": first.get("CPU part"),
                             "variant": first.get("CPU variant"), "revision": first.get("CPU revision")}
            if len(ids) > 1:
                out["cpu_id"]["parts"] = [f"{i:#04x}/{p:#05x}" for i, p in ids]
        return out
    flags = (first.get("flags") or first.get("Features") or "").split()
    name = next((b[k] for b in blocks for k in ("model name", "Model name") if b.get(k)), None)
    return {"name": name, "flags": flags, "isa": sorted(f for f in flags if f.startswith(X86_ISA_PREFIXES))}


def _read(path: Path) -> str | None:
    try:
        return path.read_text().strip() or None
    except OSError:
        return None


def vector_bits(prctl_result: int | None, default_bytes: str | None) -> int | None:
    """A vector length in bits from prctl's answer (bytes in its low 16 bits, negative when unsupported), else
    from the kernel's default for new processes (bytes, as /proc/sys/abi/*_default_vector_length holds it)."""
    if prctl_result is not None and prctl_result >= 0 and prctl_result & PR_VL_LEN_MASK:
        return (prctl_result & PR_VL_LEN_MASK) * 8
    value = _hex(default_bytes)
    return value * 8 if value and value > 0 else None


def _prctl(option: int) -> int | None:
    """prctl(option) of this thread, or None where libc or the call is missing."""
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
        return int(libc.prctl(option, 0, 0, 0, 0))
    except (OSError, AttributeError):
        return None


def read_cpu(cpuinfo: Path = Path("/proc/cpuinfo"), machine: str | None = None, sysfs: Path = Path("/sys"),
             abi: Path = Path("/proc/sys/abi"), prctl=_prctl) -> dict:
    """This machine's CPU as the records keep it: name, ISA features and, on Arm, MIDR fields and SVE/SME
    vector lengths (`sve_vector_bits`, `sme_vector_bits`). The arguments describe another machine in tests."""
    machine = machine or platform.machine()
    text = _read(cpuinfo) or ""
    info = parse_cpuinfo(text, machine, _read(sysfs / "devices/virtual/dmi/id/sys_vendor"),
                         _read(sysfs / "bus/soc/devices/soc0/machine"))
    info["name"] = info["name"] or platform.processor() or machine
    if machine in ARM_MACHINES:
        for ext, option in (("sve", PR_SVE_GET_VL), ("sme", PR_SME_GET_VL)):
            if ext in info["flags"]:
                bits = vector_bits(prctl(option), _read(abi / f"{ext}_default_vector_length"))
                if bits:
                    info[f"{ext}_vector_bits"] = bits
    return info
