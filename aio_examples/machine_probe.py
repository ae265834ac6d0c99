"""The machine probe: how fast the machine hands work between its cores right now, measured beside a model.

On a shared virtual machine a run on several threads can slow down by tens of percent for seconds to
minutes while each core alone computes exactly as fast as before (measured here at 2 threads: the 1-s
medians of one process wandered between 1.9 and 3.9 ms, while a single-threaded matmul on each core
stayed within 3%). What moved is the time a barrier takes: the host places the virtual cores nearer or
further apart. No number of repeats within one night tells that from a slower build the next night.

So a process that asks for it (`run --probe`, a sweep's `probe = true`) measures, after each round of
its model's passes, a short fixed workload made of nothing but such barriers: element-wise adds small
enough that the hand-over between threads dominates, on the model's own thread count. `compare` then
relates each configuration's round medians to the probe's and takes the machine's share out of the
change (stats.machine_slope). The probe is the framework's own thread pool: a framework build that
changes how fast its threads synchronise moves the probe too, and every report prints the probe's change
beside the raw one.
"""

import time

import numpy as np

SLICE_S = 0.05          # probe time after each round of the model: a tenth or less of the round
ADDS = 200              # adds per probe pass (about 1 ms at 2 threads here)
ELEMENTS = 65536        # large enough for the framework to split an add over two threads, small for L2


class MachineProbe:
    """`slice()` -> the median milliseconds of one probe pass over SLICE_S of passes."""

    name = f"{ADDS} element-wise adds of {ELEMENTS} float32 on the intra-op threads"

    def __init__(self):
        import torch

        self._torch = torch
        self._x, self._y, self._out = torch.randn(ELEMENTS), torch.randn(ELEMENTS), torch.empty(ELEMENTS)
        for _ in range(3):          # the thread pool starts, the buffers are touched
            self._pass()

    def _pass(self) -> int:
        add, x, y, out = self._torch.add, self._x, self._y, self._out
        t0 = time.perf_counter_ns()
        for _ in range(ADDS):
            add(x, y, out=out)
        return time.perf_counter_ns() - t0

    def slice(self) -> float:
        times = []
        end = time.perf_counter() + SLICE_S
        while not times or time.perf_counter() < end:
            times.append(self._pass())
        return float(np.median(times)) / 1e6
