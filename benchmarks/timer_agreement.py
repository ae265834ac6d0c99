"""Does the harness's median agree with torch.utils.benchmark's adaptive_autorange?

Both time the same eager model at the same thread count in this one process, in alternating
short rounds (harness then Timer, Timer then harness, ...) so drift of a shared machine hits both alike;
the medians of all their samples are compared. Prints PASS when they agree within the
tolerance (default 5%).

    python benchmarks/timer_agreement.py [--model resnet_50_v1] [--threads 2] [--rounds 12] [--round-s 4]
"""

import argparse
import statistics
import sys
import time

import torch
import torch.utils.benchmark as tb

from aio_examples.backends import get_backend
from aio_examples.machine.threads import resolve_threads
from aio_examples.measurement.runner import RunRequest, run
from aio_examples.measurement.timing import StopRule
from aio_examples.models import get_model


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="resnet_50_v1")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--batch-size", type=int, default=1)
    ap.add_argument("--rounds", type=int, default=12)
    ap.add_argument("--round-s", type=float, default=4.0, help="seconds each method measures per round")
    ap.add_argument("--tolerance", type=float, default=0.05)
    args = ap.parse_args()

    choice = resolve_threads(args.threads)
    spec = get_model(args.model)
    shape = spec.shape()
    module = spec.build(shape=shape)
    inputs = spec.example_inputs(args.batch_size, shape, module)
    req = RunRequest(spec, ["eager"], "fp32", args.batch_size, choice, shape,
                     rule=StopRule(timeout_s=args.round_s), module=module, example_inputs=inputs)
    one_pass = eager_pass(spec, module, inputs, "fp32", choice.threads, shape)

    harness_ms, timer_ms = [], []

    def harness_round() -> str:
        r = run(req)[0]
        harness_ms.extend(r.samples_ms)
        return f"harness {r.median_ms:7.2f} ms (n={r.latency_ms['n']:3d})"

    def timer_round() -> str:
        times = autorange_ms(one_pass, choice.threads, args.round_s)
        timer_ms.extend(times)
        return f"adaptive_autorange {statistics.median(times):7.2f} ms (n={len(times):3d})"

    start = time.perf_counter()
    for i in range(args.rounds):
        # Alternate which goes first, so a periodic disturbance cannot favour one of them.
        order = (harness_round, timer_round) if i % 2 == 0 else (timer_round, harness_round)
        print(f"round {i + 1:2d}: " + "   ".join(step() for step in order), flush=True)
    h, t = statistics.median(harness_ms), statistics.median(timer_ms)
    ratio = h / t
    ok = abs(ratio - 1) <= args.tolerance
    print(f"\n{args.model} eager fp32 b{args.batch_size} t{choice.threads}, {time.perf_counter() - start:.0f} s: "
          f"harness median {h:.2f} ms (n={len(harness_ms)}), adaptive_autorange median {t:.2f} ms "
          f"(n={len(timer_ms)}), ratio {ratio:.3f} -> {'PASS' if ok else 'FAIL'} (tolerance {args.tolerance:.0%})")
    return 0 if ok else 1


def eager_pass(spec, module, inputs, precision: str, threads: int, shape: dict):
    """The pass the harness times on its eager backend at `precision` (the module is cast in place)."""
    return spec.make_pass(get_backend("eager").prepare(module, inputs, precision, threads, None), shape)


def serve_rounds(conn, model: str, precision: str, batch_size: int, threads: int, seconds: float) -> None:
    """A process timing the eager pass one round per "round" message (agreement.py's eager tool): torch alone in
    its process, as a user's script would time it."""
    spec = get_model(model)
    shape = spec.shape()
    module = spec.build(shape=shape).eval()
    one_pass = eager_pass(spec, module, spec.example_inputs(batch_size, shape, module), precision, threads, shape)
    conn.send("ready")
    while conn.recv() == "round":
        conn.send(autorange_ms(one_pass, threads, seconds))


def autorange_ms(one_pass, threads: int, seconds: float) -> list[float]:
    """torch.utils.benchmark's adaptive_autorange over about `seconds` of `one_pass`: its times, ms per pass."""
    timer = tb.Timer("one_pass()", globals={"one_pass": one_pass}, num_threads=threads)
    with torch.no_grad():
        m = timer.adaptive_autorange(min_run_time=seconds, max_run_time=seconds)
    return [t * 1e3 for t in m.times]


if __name__ == "__main__":
    sys.exit(main())
