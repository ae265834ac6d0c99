"""The machine probe: two readings of how fast the machine is right now, measured beside a model.

A shared virtual machine moves under a benchmark. Two kinds of move were measured here:

* the hand-over: at several threads a run slowed by tens of percent for seconds to minutes while each
  core alone computed as fast as before (the 1-s medians of one 2-thread process wandered between 1.9 and
  3.9 ms, while a single-threaded matmul on each core stayed within 3%): the host placed the virtual cores
  nearer or further apart, and a barrier took longer;
* the whole machine: on another day every configuration, one thread or two, ran up to 11% faster or 7%
  slower than usual for ten minutes and more at a time, and one-core numpy kernels moved with them (see
  docs/regression.md).

So a process that asks for it (`run --probe`, a sweep's `probe = true`) reads both after each round of
its model's passes, and `compare` relates each configuration's round medians to them and takes the
machine's share out of the change (stats.machine_slope):

* the probe: element-wise adds small enough that the hand-over between threads dominates, on the model's
  own thread count. It runs on the framework's own thread pool, so a framework build that changes how
  fast its threads synchronise moves it too (every report prints its change beside the raw one);
* the reference: 256x256 float32 matmuls by numpy's own BLAS on one thread: nothing of the framework
  under test runs in it, so no framework build can move it; only the machine (or a new numpy) can. Of
  the kernels tried here (smaller and larger matmuls, a vectorised exp, element-wise adds in L2, L3 and
  memory, a matrix-vector product, a Python loop), it read the same machine state most alike in every
  process (its process medians within 0.8% of one another, against 1.8 to 29% for most others: a small
  matmul's or an add's speed depends on where its buffers happen to lie), and followed the models'
  process medians best.
"""

import time

import numpy as np

SLICE_S = 0.05          # probe time after each round of the model: a tenth or less of the round
ADDS = 200              # adds per probe pass (about 1 ms at 2 threads here)
ELEMENTS = 65536        # large enough for the framework to split an add over two threads, small for L2
REFERENCE_S = 0.03      # reference time after each round
MATMULS, SIDE = 8, 256  # one reference pass: about 2 ms here


class MachineProbe:
    """`slice()` -> [probe ms, reference ms]: each the median of its passes over its share of time."""

    name = f"{ADDS} element-wise adds of {ELEMENTS} float32 on the intra-op threads"
    reference = f"{MATMULS} float32 matmuls {SIDE}x{SIDE} by numpy's BLAS on one thread"

    def __init__(self):
        import torch
        from threadpoolctl import ThreadpoolController

        self._torch = torch
        self._x, self._y, self._out = torch.randn(ELEMENTS), torch.randn(ELEMENTS), torch.empty(ELEMENTS)
        rng = np.random.default_rng(0)
        self._a, self._b = (rng.standard_normal((SIDE, SIDE), dtype=np.float32) for _ in range(2))
        self._c = np.empty_like(self._a)
        # numpy's BLAS would split a matmul over every core; the reference is one core's speed.
        self._blas = ThreadpoolController().select(user_api="blas")
        for _ in range(3):          # the thread pools start, the buffers are touched
            self._pass()
            self._reference(0)

    def _pass(self) -> int:
        add, x, y, out = self._torch.add, self._x, self._y, self._out
        t0 = time.perf_counter_ns()
        for _ in range(ADDS):
            add(x, y, out=out)
        return time.perf_counter_ns() - t0

    def _reference_pass(self) -> int:
        a, b, c = self._a, self._b, self._c
        t0 = time.perf_counter_ns()
        for _ in range(MATMULS):
            np.matmul(a, b, out=c)
        return time.perf_counter_ns() - t0

    def _reference(self, seconds: float) -> float:
        """Median ms of the reference passes over `seconds` (at least one), BLAS held to one thread."""
        with self._blas.limit(limits=1):
            return _median_ms(self._reference_pass, seconds)

    def slice(self) -> list[float]:
        return [round(_median_ms(self._pass, SLICE_S), 5), round(self._reference(REFERENCE_S), 5)]


def _median_ms(one_pass, seconds: float) -> float:
    times = []
    end = time.perf_counter() + seconds
    while not times or time.perf_counter() < end:
        times.append(one_pass())
    return float(np.median(times)) / 1e6
