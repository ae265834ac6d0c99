"""Does the harness's median agree with torch.utils.benchmark's adaptive_autorange?

Both time the same eager model at the same thread count in this one process, alternating
(harness, Timer, harness, Timer, ...) so machine drift hits both. Prints both medians, the
ratio and PASS when they agree within the tolerance (default 5%).

    python benchmarks/timer_agreement.py [--model resnet_50_v1] [--threads 2] [--rounds 3]
"""

import argparse
import statistics
import sys
import time

import torch
import torch.utils.benchmark as tb

from aio_examples.backends import get_backend
from aio_examples.models import get_model
from aio_examples.runner import RunRequest, run
from aio_examples.threads import resolve_threads
from aio_examples.timing import StopRule


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="resnet_50_v1")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--batch-size", type=int, default=1)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--timeout", type=float, default=60.0, help="harness budget per round (its default stop rule)")
    ap.add_argument("--tolerance", type=float, default=0.05)
    args = ap.parse_args()

    choice = resolve_threads(args.threads)
    spec = get_model(args.model)
    shape = spec.shape()
    req = RunRequest(spec, ["eager"], "fp32", args.batch_size, choice, shape, rule=StopRule(timeout_s=args.timeout))
    module = spec.build(shape=shape)
    inputs = spec.example_inputs(args.batch_size, shape, module)
    req.module, req.example_inputs = module, inputs
    prepared = get_backend("eager").prepare(module, inputs, "fp32", choice.threads)
    one_pass = spec.make_pass(prepared, shape)

    harness, timer = [], []
    for i in range(args.rounds):
        start = time.perf_counter()
        r = run(req)[0]
        harness.append(r.median_ms)
        print(f"round {i + 1}: harness median {r.median_ms:.2f} ms (n={r.latency_ms['n']}, "
              f"confidence met: {r.confidence_met}, {time.perf_counter() - start:.1f} s)", flush=True)
        with torch.no_grad():
            m = tb.Timer("one_pass()", globals={"one_pass": one_pass}, num_threads=choice.threads).adaptive_autorange(
                max_run_time=args.timeout / 2)
        timer.append(m.median * 1e3)
        print(f"round {i + 1}: Timer.adaptive_autorange median {m.median * 1e3:.2f} ms "
              f"({len(m.times)} blocks of {m.number_per_run})", flush=True)
    h, t = statistics.median(harness), statistics.median(timer)
    ratio = h / t
    ok = abs(ratio - 1) <= args.tolerance
    print(f"\n{args.model} eager fp32 b{args.batch_size} t{choice.threads}: harness {h:.2f} ms, "
          f"adaptive_autorange {t:.2f} ms, ratio {ratio:.3f} -> {'PASS' if ok else 'FAIL'} "
          f"(tolerance {args.tolerance:.0%})")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
