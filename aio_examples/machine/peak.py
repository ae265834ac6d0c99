"""This machine's practical matrix-multiply peak, per precision and thread count.

A model's achieved FLOP/s means little alone; as a share of what the machine can do at all it says
how much headroom a backend leaves. The peak is the best of several engines on large square GEMMs:
torch's own (`torch.mm`, oneDNN/MKL underneath), oneDNN through torch at bf16, and OpenVINO's MatMul.
Each (precision, threads) is measured in its own process so the thread count is in effect before
the libraries start their pools, and the table is cached per machine (CPU model, ISA, versions).
The memory-bandwidth roofline (bandwidth.py) is measured and cached the same way, through the helpers here.
"""

import json
import sys
import time

from ..core.paths import cache_dir, write_json_atomic
from ..core.processes import run_isolated
from .environment import capture
from .threads import thread_env

PEAK_PRECISIONS = ("fp32", "bf16", "int8")     # int8: integer multiply-adds, counted as 2 ops like FLOPs
SIZE = 2048                    # large enough to be compute bound, small enough to take ~0.1 s a pass
MEASURE_S = 2.0


def fingerprint() -> str:
    env = capture({})
    return "|".join([env.get("cpu_model") or "?", env.get("arch") or "?", ",".join(env.get("isa") or []),
                     f"torch {env['versions'].get('torch')}", f"openvino {env['versions'].get('openvino')}"])


def cache_path(kind: str = "peak"):
    """This machine's cache file of one kind of measurement (`peak`: GEMM, `bandwidth`: memory), named by
    a digest of its fingerprint: another CPU, ISA or library version is another file."""
    import hashlib

    return cache_dir(kind) / (hashlib.sha256(fingerprint().encode()).hexdigest()[:16] + ".json")


def cached(kind: str = "peak") -> dict:
    """The cached table of this machine or empty. `peak`: {"fingerprint", "peaks": {precision: {threads:
    {"gflops", "engine", "engines"}}}}; `bandwidth`: see bandwidth.py."""
    try:
        return json.loads(cache_path(kind).read_text())
    except (OSError, ValueError):
        return {}


def measure_in_child(kind: str, module: str, args: list[str], threads: int, timeout_s: float) -> dict:
    """Run `python -m module args... DEST` with `threads` in effect from its start (DEST: a file beside the
    `kind` cache, one per calling process); the JSON object it wrote there, or {"error": why it did not}."""
    import os

    part = cache_path(kind).with_suffix(f".{os.getpid()}.part")
    env = {**os.environ, **thread_env(threads)}
    outcome = run_isolated(["-m", module, *args, str(part)], timeout_s, env=env)
    try:
        result = json.loads(part.read_text())
        part.unlink()
    except (OSError, ValueError):
        result = {"error": outcome.reason}
    return result


def peak_gflops(precision: str, threads: int) -> float | None:
    entry = (cached().get("peaks") or {}).get(precision, {}).get(str(threads))
    return entry["gflops"] if entry else None


def measure_peaks(precisions, threads_list, timeout_s: float = 300.0) -> dict:
    """Measure every (precision, threads) in a fresh process; merge into the machine's cached table."""
    path = cache_path()
    table = cached() or {"fingerprint": fingerprint(), "peaks": {}}
    for precision in precisions:
        for threads in threads_list:
            engines = measure_in_child("peak", "aio_examples.machine.peak", [precision, str(threads)], threads, timeout_s)
            speeds = {k: v for k, v in engines.items() if isinstance(v, float)}
            best = max(speeds, key=speeds.get) if speeds else None
            table["peaks"].setdefault(precision, {})[str(threads)] = {
                "gflops": speeds[best] if best else None, "engine": best, "engines": engines}
    write_json_atomic(path, table, indent=1)
    return table


def _time_gflops(fn, flops: float) -> float:
    fn()
    fn()
    n, start = 0, time.perf_counter()
    while time.perf_counter() - start < MEASURE_S:
        fn()
        n += 1
    return flops * n / (time.perf_counter() - start) / 1e9


def _engines(precision: str, threads: int) -> dict:
    """GFLOP/s of each engine that can run this precision here (errors recorded, not raised)."""
    import torch

    torch.set_num_threads(threads)
    flops = 2.0 * SIZE ** 3
    out: dict = {}
    if precision == "int8":     # int8 x int8 -> int32 (oneDNN's VNNI/AMX kernels where the CPU has them)
        a, b = (torch.randint(-128, 128, (SIZE, SIZE), dtype=torch.int8) for _ in range(2))
        try:
            out["torch._int_mm"] = _time_gflops(lambda: torch._int_mm(a, b), flops)
        except Exception as exc:  # noqa: BLE001
            out["torch._int_mm"] = f"{type(exc).__name__}: {exc}"
        out["openvino"] = _openvino_matmul(precision, threads, flops)
        return out
    dtype = {"fp32": torch.float32, "bf16": torch.bfloat16}[precision]
    a, b = torch.randn(SIZE, SIZE).to(dtype), torch.randn(SIZE, SIZE).to(dtype)
    try:
        out["torch.mm"] = _time_gflops(lambda: torch.mm(a, b), flops)
    except Exception as exc:  # noqa: BLE001
        out["torch.mm"] = f"{type(exc).__name__}: {exc}"
    if precision == "bf16":
        try:
            lin = torch.nn.Linear(SIZE, SIZE, bias=False).to(dtype).eval()
            with torch.no_grad():
                packed = torch.jit.freeze(torch.jit.trace(lin, (a,)))
                out["onednn-linear"] = _time_gflops(lambda: packed(a), flops)
        except Exception as exc:  # noqa: BLE001
            out["onednn-linear"] = f"{type(exc).__name__}: {exc}"
    out["openvino"] = _openvino_matmul(precision, threads, flops)
    return out


def _openvino_matmul(precision: str, threads: int, flops: float):
    """GFLOP/s of OpenVINO's MatMul at the precision (int8: both operands through FakeQuantize, which its
    low-precision transformations turn into an int8 GEMM), or why it could not be measured."""
    try:
        import numpy as np
        import openvino as ov
        from openvino import opset13 as ops

        param = x = ops.parameter([SIZE, SIZE], np.float32)
        w = ops.constant(np.random.rand(SIZE, SIZE).astype(np.float32) - 0.5)
        if precision == "int8":
            def quantized(node, low, high, levels):
                bounds = [ops.constant(np.array(v, np.float32)) for v in (low, high, low, high)]
                return ops.fake_quantize(node, *bounds, levels)

            # u8 activations, symmetric s8 weights (255 levels: a whole zero point), as NNCF quantizes them
            x, w = quantized(x, 0.0, 1.0, 256), quantized(w, -0.5, 0.5, 255)
        model = ov.Model([ops.matmul(x, w, False, True)], [param])      # weights [out, in], as a Linear's
        hint = {"fp32": "f32", "bf16": "bf16", "int8": "f32"}[precision]
        compiled = ov.Core().compile_model(model, "CPU", {"INFERENCE_NUM_THREADS": threads,
                                                         "INFERENCE_PRECISION_HINT": hint,
                                                         "PERFORMANCE_HINT": "LATENCY", "NUM_STREAMS": 1})
        runs = compiled.get_property("INFERENCE_PRECISION_HINT").get_type_name()
        if runs != hint:           # e.g. bf16 asked on a CPU without native bf16: not this precision's peak
            return f"runs {runs}, not {hint}"
        if precision == "int8":
            gemms = [op.get_rt_info()["runtimePrecision"].astype(str) for op in compiled.get_runtime_model().get_ops()
                     if op.get_rt_info()["layerType"].astype(str) in ("FullyConnected", "MatMul")]
            if not any(g in ("i8", "u8") for g in gemms):
                return f"the GEMM runs {', '.join(gemms) or 'nowhere'}, not int8"
        request = compiled.create_infer_request()
        xin = np.random.rand(SIZE, SIZE).astype(np.float32)
        return _time_gflops(lambda: request.infer([xin], share_inputs=True), flops)
    except Exception as exc:  # noqa: BLE001
        return f"{type(exc).__name__}: {exc}"


if __name__ == "__main__":          # one (precision, threads) measurement in its own process
    prec, n_threads, dest = sys.argv[1], int(sys.argv[2]), sys.argv[3]
    from pathlib import Path

    Path(dest).parent.mkdir(parents=True, exist_ok=True)
    Path(dest).write_text(json.dumps(_engines(prec, n_threads)))
