"""Memory bandwidth: a real triad and read measurement (small arrays, to be quick), its cache, the roofline share
against hand-computed values, the LLC readers on canned machines, and `aio-examples peak` in a real process."""

import json
import math

import pytest
from conftest import run_cli

from aio_examples.core.errors import UsageError
from aio_examples.machine import bandwidth, peak
from aio_examples.machine.bandwidth import (
    default_array_bytes,
    llc_from_lscpu,
    llc_from_sysfs,
    measure_here,
    memory_bandwidth,
    roofline_share,
)

MIB = 1 << 20


@pytest.fixture
def cache(tmp_path, monkeypatch):
    """A cache folder of this test's own: the session's may already hold this machine's bandwidth."""
    monkeypatch.setenv("AIO_CACHE_DIR", str(tmp_path / "cache"))
    return tmp_path / "cache"


def _finite_positive(x) -> bool:
    return isinstance(x, float) and math.isfinite(x) and x > 0


def test_triad_and_read_are_measured_positive_and_finite_and_the_thread_count_is_put_back():
    import torch

    before = torch.get_num_threads()
    entry = measure_here(1, array_bytes=4 * MIB, repeats=3)
    assert torch.get_num_threads() == before
    assert _finite_positive(entry["triad_gb_s"]) and _finite_positive(entry["read_gb_s"])
    assert entry["roofline_gb_s"] == max(entry["read_gb_s"], entry["triad_gb_s"])
    assert entry["roofline_gb_s"] == entry[f"{entry['roofline']}_gb_s"]
    assert entry["threads"] == 1 and entry["array_bytes"] == 4 * MIB and entry["dtype"] == "float32"
    with pytest.raises(UsageError):
        measure_here(0, array_bytes=MIB)


def test_the_bandwidth_is_measured_once_then_read_from_the_machines_cache(cache, monkeypatch):
    first = memory_bandwidth(1, array_bytes=8 * MIB)
    assert first["cached"] is False and "error" not in first, first
    assert _finite_positive(first["triad_gb_s"]) and _finite_positive(first["read_gb_s"])
    path = peak.cache_path(bandwidth.KIND)
    assert path.parent == cache / "bandwidth" and path.name == peak.cache_path().name   # same key as the GEMM peak
    stored = json.loads(path.read_text())
    assert stored["fingerprint"] == peak.fingerprint()
    assert stored["bandwidth"]["1"]["array_bytes"] == 8 * MIB and "cached" not in stored["bandwidth"]["1"]
    assert not list(path.parent.glob("*.part"))

    def no_measuring(*args, **kwargs):
        raise AssertionError("measured again although cached")

    monkeypatch.setattr(peak, "measure_in_child", no_measuring)
    second = memory_bandwidth(1, array_bytes=8 * MIB)
    assert second == {**first, "cached": True}
    with pytest.raises(AssertionError, match="measured again"):     # other arrays are another measurement
        memory_bandwidth(1, array_bytes=4 * MIB)
    with pytest.raises(UsageError):
        memory_bandwidth(0)


def test_roofline_share_is_weight_bytes_times_tokens_per_second_over_the_bandwidth():
    # 7e9 bytes of weights (7B parameters at int8), 5 tokens/s, 50 GB/s: 35 GB/s moved of 50, 0.7.
    assert roofline_share(7_000_000_000, 5.0, 50.0) == pytest.approx(0.7)
    # 124M parameters at fp32 (496 MB) at 100 tokens/s on 40 GB/s: 49.6 / 40 = 1.24 (part stayed in cache).
    assert roofline_share(124_000_000 * 4, 100.0, 40.0) == pytest.approx(1.24)
    assert roofline_share(1_000_000_000, 0.0, 10.0) == 0.0
    for bad in (0.0, -1.0, math.inf, math.nan):
        with pytest.raises(ValueError):
            roofline_share(1, 1.0, bad)
    with pytest.raises(ValueError):
        roofline_share(1, math.nan, 10.0)


def _cache(root, cpu, index, level, kind, size, shared):
    folder = root / f"cpu{cpu}" / "cache" / f"index{index}"
    folder.mkdir(parents=True)
    for name, value in (("level", level), ("type", kind), ("size", size), ("shared_cpu_list", shared)):
        (folder / name).write_text(f"{value}\n")


def test_the_last_level_cache_is_summed_over_its_instances(tmp_path):
    # 2 sockets of 2 CPUs: a 48K L1d and 32K L1i per CPU, a 32 MiB L3 per socket; 64 MiB over the machine.
    for cpu in range(4):
        _cache(tmp_path, cpu, 0, 1, "Data", "48K", str(cpu))
        _cache(tmp_path, cpu, 1, 1, "Instruction", "32K", str(cpu))
        _cache(tmp_path, cpu, 3, 3, "Unified", "32768K", "0-1" if cpu < 2 else "2-3")
    assert llc_from_sysfs(tmp_path) == 64 * MIB
    assert llc_from_sysfs(tmp_path / "none") is None
    lscpu = ("NAME ONE-SIZE ALL-SIZE WAYS TYPE        LEVEL  SETS PHY-LINE COHERENCY-SIZE\n"
             "L1d     49152    98304   12 Data            1    64        1             64\n"
             "L1i     32768    65536    8 Instruction     1    64        1             64\n"
             "L2    1048576  2097152   16 Unified         2  1024        1             64\n"
             "L3   33554432 33554432   16 Unified         3 32768        1             64\n")
    assert llc_from_lscpu(lscpu) == 32 * MIB
    assert llc_from_lscpu("") is None and llc_from_lscpu("lscpu: unrecognized option '-C'") is None


def test_the_arrays_are_four_times_the_cache_and_256_mib_together_within_the_memory():
    assert default_array_bytes(32 * MIB) == 128 * MIB             # 4 x 32 MiB
    assert default_array_bytes(1 * MIB) == 86 * MIB               # 256 MiB / 3, rounded up to whole MiB
    assert default_array_bytes(256 * MIB, memory=1200 * MIB) == 100 * MIB   # 3 arrays within a quarter
    assert default_array_bytes(32 * MIB, memory=0) == 128 * MIB            # memory unknown


@pytest.mark.slow       # the whole command at the machine's own array size (half a minute); the measurement in its child is the test above
def test_peak_prints_the_bandwidth_per_thread_count(tmp_path):
    proc = run_cli(["-m", "aio_examples", "peak", "--only", "bandwidth", "--threads", "1"],
                   env={"AIO_CACHE_DIR": str(tmp_path / "cache")})
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "memory bandwidth of this machine" in proc.stdout and "matrix-multiply" not in proc.stdout
    line = next(x for x in proc.stdout.splitlines() if x.strip().startswith("1 thread(s): read"))
    read, triad = (float(line.split(word)[1].split(",")[0].split()[0]) for word in ("read ", "triad "))
    assert math.isfinite(read) and read > 0 and math.isfinite(triad) and triad > 0
    stored = json.loads(next((tmp_path / "cache" / "bandwidth").glob("*.json")).read_text())
    assert set(stored["bandwidth"]) == {"1"}
    bad = run_cli(["-m", "aio_examples", "peak", "--only", "flops"])
    assert bad.returncode == 2 and "--only" in bad.stderr


# The slow tier: the int8 GEMM peak on every engine, `aio-examples peak`'s own measurement like its bandwidth table
@pytest.mark.slow
def test_the_int8_gemm_peak_is_measured_on_integer_kernels(tmp_path):
    """int8: torch's int8 x int8 -> int32 GEMM and OpenVINO's FakeQuantize MatMul, which must run as an int8 GEMM
    (its runtime precision read back) to count; the figure is cached with fp32's and bf16's."""
    proc = run_cli(["-m", "aio_examples", "peak", "--only", "gemm", "--precisions", "int8", "--threads", "1"],
                   env={"AIO_CACHE_DIR": str(tmp_path / "cache")})
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "int8 1 thread(s):" in proc.stdout
    stored = json.loads(next((tmp_path / "cache" / "peak").glob("*.json")).read_text())
    entry = stored["peaks"]["int8"]["1"]
    assert isinstance(entry["engines"]["openvino"], float), entry      # an int8 GEMM ran
    assert entry["gflops"] == max(v for v in entry["engines"].values() if isinstance(v, float)) > 0
