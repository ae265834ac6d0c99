"""The CPU's name, ISA and vector lengths from canned /proc/cpuinfo of Arm servers (Graviton3/4, Altra Max,
AmpereOne) and x86 ones, as the kernel prints them."""

import functools

import pytest

from aio_examples.core.records import machine_fingerprint
from aio_examples.machine import environment
from aio_examples.machine.cpuinfo import arm_core_name, parse_cpuinfo, read_cpu, vector_bits


def arm64_cpuinfo(cpus: int, bogomips: str, features: str, implementer: str, variant: str, part: str,
                  revision: int) -> str:
    """/proc/cpuinfo as arch/arm64/kernel/cpuinfo.c prints it: one block per CPU, no model name."""
    return "".join(f"processor\t: {cpu}\nBogoMIPS\t: {bogomips}\nFeatures\t: {features}\n"
                   f"CPU implementer\t: {implementer}\nCPU architecture: 8\nCPU variant\t: {variant}\n"
                   f"CPU part\t: {part}\nCPU revision\t: {revision}\n\n" for cpu in range(cpus))


V1_FEATURES = ("fp asimd evtstrm aes pmull sha1 sha2 crc32 atomics fphp asimdhp cpuid asimdrdm jscvt fcma lrcpc "
               "dcpop sha3 sm3 sm4 asimddp sha512 sve asimdfhm dit uscat ilrcpc flagm ssbs paca pacg dcpodp svei8mm "
               "svebf16 i8mm bf16 dgh rng")
V2_FEATURES = ("fp asimd evtstrm aes pmull sha1 sha2 crc32 atomics fphp asimdhp cpuid asimdrdm jscvt fcma lrcpc "
               "dcpop sha3 asimddp sha512 sve asimdfhm dit uscat ilrcpc flagm ssbs sb paca pacg dcpodp sve2 sveaes "
               "svepmull svebitperm svesha3 flagm2 frint svei8mm svebf16 i8mm bf16 dgh rng bti")
N1_FEATURES = "fp asimd evtstrm aes pmull sha1 sha2 crc32 atomics fphp asimdhp cpuid asimdrdm lrcpc dcpop asimddp ssbs"
AMPEREONE_FEATURES = ("fp asimd evtstrm aes pmull sha1 sha2 crc32 atomics fphp asimdhp cpuid asimdrdm jscvt fcma "
                      "lrcpc dcpop sha3 sm3 sm4 asimddp sha512 asimdfhm dit uscat ilrcpc flagm ssbs sb paca pacg "
                      "dcpodp flagm2 frint i8mm bf16 rng bti ecv")

GRAVITON3 = arm64_cpuinfo(64, "2100.00", V1_FEATURES, "0x41", "0x1", "0xd40", 1)
GRAVITON4 = arm64_cpuinfo(96, "2000.00", V2_FEATURES, "0x41", "0x0", "0xd4f", 1)
ALTRA_MAX = arm64_cpuinfo(128, "50.00", N1_FEATURES, "0x41", "0x3", "0xd0c", 1)
AMPEREONE = arm64_cpuinfo(192, "2000.00", AMPEREONE_FEATURES, "0xc0", "0x0", "0xac3", 0)
# A big.LITTLE board: two core types in one file (0xd05, a Cortex-A55, is not in the server table)
MIXED = (arm64_cpuinfo(2, "48.00", N1_FEATURES, "0x41", "0x0", "0xd05", 0)
         + arm64_cpuinfo(2, "48.00", N1_FEATURES, "0x41", "0x1", "0xd0b", 0).replace("processor\t: 0", "processor\t: 2")
         .replace("processor\t: 1", "processor\t: 3"))

XEON = "".join(f"processor\t: {cpu}\nvendor_id\t: GenuineIntel\ncpu family\t: 6\nmodel\t\t: 143\n"
               "model name\t: Intel(R) Xeon(R) Platinum 8480+\nstepping\t: 8\n"
               "flags\t\t: fpu vme de pse tsc msr sse sse2 ssse3 fma sse4_1 sse4_2 avx f16c avx2 avx512f avx512dq "
               "avx512cd avx512bw avx512vl avx_vnni avx512_bf16 amx_bf16 avx512_fp16 amx_tile amx_int8\n\n"
               for cpu in range(4))
# AMD's flags hold `sme` (Secure Memory Encryption): not Arm's Scalable Matrix Extension
EPYC = ("processor\t: 0\nvendor_id\t: AuthenticAMD\nmodel name\t: AMD EPYC 9654 96-Core Processor\n"
        "flags\t\t: fpu sse2 fma avx2 sme sev avx512f avx512_bf16 avx512_vnni\n\n")

ARM_ISA = {
    "graviton3": ["asimd", "asimddp", "asimdfhm", "asimdhp", "asimdrdm", "bf16", "fphp", "i8mm", "sve", "svebf16",
                  "svei8mm"],
    "graviton4": ["asimd", "asimddp", "asimdfhm", "asimdhp", "asimdrdm", "bf16", "fphp", "i8mm", "sve", "sve2",
                  "sveaes", "svebf16", "svebitperm", "svei8mm", "svepmull", "svesha3"],
    "altra_max": ["asimd", "asimddp", "asimdhp", "asimdrdm", "fphp"],
    "ampereone": ["asimd", "asimddp", "asimdfhm", "asimdhp", "asimdrdm", "bf16", "fphp", "i8mm"],
}


@pytest.mark.parametrize("text, vendor, name, isa, midr", [
    (GRAVITON3, "Amazon EC2", "AWS Graviton3 (Neoverse V1)", "graviton3", ("0x41", "0xd40", "0x1", "1")),
    (GRAVITON4, "Amazon EC2", "AWS Graviton4 (Neoverse V2)", "graviton4", ("0x41", "0xd4f", "0x0", "1")),
    (ALTRA_MAX, "GIGABYTE", "Neoverse N1", "altra_max", ("0x41", "0xd0c", "0x3", "1")),
    (AMPEREONE, "Supermicro", "AmpereOne", "ampereone", ("0xc0", "0xac3", "0x0", "0")),
])
def test_arm_servers_are_named_by_their_core(text, vendor, name, isa, midr):
    info = parse_cpuinfo(text, "aarch64", system_vendor=vendor)
    assert info["name"] == name
    assert info["isa"] == ARM_ISA[isa]
    cpu_id = info["cpu_id"]
    assert (cpu_id["implementer"], cpu_id["part"], cpu_id["variant"], cpu_id["revision"]) == midr
    assert "parts" not in cpu_id          # one core type


def test_graviton_needs_the_firmware_to_say_aws():
    assert parse_cpuinfo(GRAVITON3, "aarch64")["name"] == "Neoverse V1"
    assert parse_cpuinfo(GRAVITON3, "aarch64", system_vendor="Ampere")["name"] == "Neoverse V1"
    # Altra and Graviton2 share the Neoverse N1 core
    assert parse_cpuinfo(ALTRA_MAX, "aarch64", system_vendor="Amazon EC2")["name"] == "AWS Graviton2 (Neoverse N1)"


def test_the_socs_own_name_wins():
    info = parse_cpuinfo(ALTRA_MAX, "aarch64", system_vendor="Amazon EC2", soc_machine="Ampere Altra Max")
    assert info["name"] == "Ampere Altra Max (Neoverse N1)"


def test_unknown_parts_and_mixed_cores_are_named_from_the_midr():
    assert arm_core_name(0x41, 0xD99) == "Arm part 0xd99"
    assert arm_core_name(0xC0, 0xAC5) == "Ampere part 0xac5"
    assert arm_core_name(0x99, 0x001) == "implementer 0x99 part 0x001"
    info = parse_cpuinfo(MIXED, "aarch64")
    assert info["name"] == "Arm part 0xd05 + Cortex-A76"
    assert info["cpu_id"]["parts"] == ["0x41/0xd05", "0x41/0xd0b"]


def test_x86_keeps_its_model_name_and_x86_flags():
    info = parse_cpuinfo(XEON, "x86_64")
    assert info["name"] == "Intel(R) Xeon(R) Platinum 8480+"
    assert info["isa"] == ["amx_bf16", "amx_int8", "amx_tile", "avx2", "avx512_bf16", "avx512_fp16", "avx512bw",
                           "avx512cd", "avx512dq", "avx512f", "avx512vl", "avx_vnni", "fma"]
    assert "cpu_id" not in info
    amd = parse_cpuinfo(EPYC, "x86_64")
    assert "sme" not in amd["isa"] and amd["isa"] == ["avx2", "avx512_bf16", "avx512_vnni", "avx512f", "fma"]


@pytest.mark.parametrize("prctl_result, default, bits", [
    (32, None, 256),                    # Neoverse V1: 256-bit SVE
    (16 | (1 << 17), "32", 128),        # PR_SVE_VL_INHERIT set beside the length; prctl wins over the default
    (-1, "16", 128),                    # prctl refused: the kernel's default for new processes
    (None, "64", 512),
    (None, None, None),
    (-1, "garbage", None),
])
def test_vector_length(prctl_result, default, bits):
    assert vector_bits(prctl_result, default) == bits


def _machine(tmp_path, text: str, vendor: str | None = None, sve_default: str | None = None):
    """A canned /proc/cpuinfo, /sys and /proc/sys/abi."""
    tmp_path.mkdir(exist_ok=True)
    (tmp_path / "cpuinfo").write_text(text)
    dmi = tmp_path / "sys" / "devices" / "virtual" / "dmi" / "id"
    dmi.mkdir(parents=True)
    if vendor:
        (dmi / "sys_vendor").write_text(vendor + "\n")
    (tmp_path / "abi").mkdir()
    if sve_default:
        (tmp_path / "abi" / "sve_default_vector_length").write_text(sve_default + "\n")
    return functools.partial(read_cpu, tmp_path / "cpuinfo", "aarch64", tmp_path / "sys", tmp_path / "abi",
                             lambda option: -1)


def test_read_cpu_on_canned_arm_machines(tmp_path):
    g3 = _machine(tmp_path / "g3", GRAVITON3, "Amazon EC2", "32")()
    assert (g3["name"], g3["sve_vector_bits"]) == ("AWS Graviton3 (Neoverse V1)", 256)
    g4 = _machine(tmp_path / "g4", GRAVITON4, "Amazon EC2", "16")()
    assert (g4["name"], g4["sve_vector_bits"]) == ("AWS Graviton4 (Neoverse V2)", 128)
    altra = _machine(tmp_path / "altra", ALTRA_MAX, None, "16")()     # no SVE: a stray default is not read
    assert altra["name"] == "Neoverse N1" and "sve_vector_bits" not in altra


def test_every_record_env_carries_the_arm_cpu(tmp_path, monkeypatch):
    monkeypatch.setattr(environment, "read_cpu", _machine(tmp_path, GRAVITON3, "Amazon EC2", "32"))
    env = environment._static.__wrapped__()
    assert env["cpu_model"] == "AWS Graviton3 (Neoverse V1)" and env["isa"] == ARM_ISA["graviton3"]
    assert env["sve_vector_bits"] == 256 and env["cpu_id"]["part"] == "0xd40"
    assert machine_fingerprint(env) != machine_fingerprint({**env, "cpu_model": "Neoverse V1"})


def test_this_machine_is_read():
    env = environment.capture()
    assert env["cpu_model"] and isinstance(env["isa"], list)
    assert ("cpu_id" in env) == (env["arch"] in ("aarch64", "arm64"))
