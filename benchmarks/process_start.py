"""How long a configuration's process takes to start: forked from the fork server against a fresh interpreter.

Each process imports what every configuration's process imports before its first pass (the CLI, the runner, torch,
torchvision, transformers' model code, torch.compile's front end), puts one tensor through torch, and exits; its
wall time from the driver's call to its exit is the start-up a run pays per configuration. The two kinds of start
alternate in one run, so the machine's drift hits both alike; the server's own start (once per driver) is
reported apart.

    python benchmarks/process_start.py [--rounds 5]
"""

import argparse
import os
import statistics
import sys
import time

from aio_examples.core import forkserver
from aio_examples.core.processes import run_isolated

CONFIGURATION = ("import aio_examples.cli.commands, aio_examples.measurement.runner, torch, transformers.modeling_utils,"
                 " torch._dynamo; from aio_examples.compat.torchvision_shim import ensure_torchvision;"
                 " ensure_torchvision(); torch.ones(8).sum()")


def timed(env: dict) -> float:
    start = time.perf_counter()
    outcome = run_isolated(["-c", CONFIGURATION], 600, env=env)
    if outcome.returncode != 0:
        sys.exit(f"process_start: a process failed: {outcome.reason}")
    return time.perf_counter() - start


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=5)
    args = ap.parse_args()
    forked_env, fresh_env = dict(os.environ), {**os.environ, forkserver.ENABLE_ENV: "0"}
    forked_env.pop(forkserver.ENABLE_ENV, None)
    server = timed(forked_env)                  # the first fork waits for the server's own imports
    times = {"fresh interpreter": [], "forked": []}
    for _ in range(args.rounds):
        times["fresh interpreter"].append(timed(fresh_env))
        times["forked"].append(timed(forked_env))
    print(f"fork server started and forked its first process in {server:.2f} s (once per driver)")
    print(f"{'start':<18} {'median s':>9} {'min s':>7} {'max s':>7}  ({args.rounds} each, alternating)")
    for name, values in times.items():
        print(f"{name:<18} {statistics.median(values):9.3f} {min(values):7.3f} {max(values):7.3f}")
    ratio = statistics.median(times["fresh interpreter"]) / statistics.median(times["forked"])
    print(f"a forked start is {ratio:.0f}x faster")
    return 0


if __name__ == "__main__":
    sys.exit(main())
