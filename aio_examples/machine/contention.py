"""What other processes take of this process's cores: how a shared machine spoils a measurement unseen.

Measured here: a busy loop sharing the one CPU of a 1-thread eager resnet_18 run (64x64) made it 2x slower
(11.5 -> 23.7 ms), and before this module nothing in the record said so. The kernel counts every core's busy time (/proc/stat, read through
psutil); the busy time of our cores minus our own CPU time is what the others took.
"""

import os
import time
from typing import NamedTuple

import psutil

# A quarter of a core beyond the spare cores of the run's affinity set (measurement/runner.py): above what
# quiet runs read here (0.00; daemons and the 10-ms tick rounding of /proc/stat
# stay within hundredths), and half of what one busy loop sharing a run's core reads (0.50, and the run then
# measured 2x slower). At several threads even less can cost more: a barrier waits for the slowest thread.
CONTENDED_CORES = 0.25


class Snapshot(NamedTuple):
    busy_s: float       # CPU seconds the cores of our affinity set were busy (user, nice, system, irq, steal)
    own_s: float        # this process's CPU seconds (all its threads)
    wall_s: float       # time.monotonic()


def snapshot(cores=None) -> Snapshot:
    """Read the counters; `cores` defaults to this process's affinity set when read."""
    cores = os.sched_getaffinity(0) if cores is None else cores
    per_cpu = psutil.cpu_times(percpu=True)
    own = psutil.Process().cpu_times()
    # Steal is time the hypervisor gave to other machines: taken from us alike.
    busy = sum(t.user + t.nice + t.system + t.irq + t.softirq + getattr(t, "steal", 0.0)
               for c, t in enumerate(per_cpu) if c in cores)
    return Snapshot(busy, own.user + own.system, time.monotonic())


def elsewhere_s(before: Snapshot, after: Snapshot) -> float:
    """Core-seconds other processes took of our cores between two snapshots. Not floored: summed over a
    measurement's rounds, the tick rounding of single readings cancels out."""
    return (after.busy_s - before.busy_s) - (after.own_s - before.own_s)


def busy_elsewhere(before: Snapshot, after: Snapshot) -> float:
    """Average number of our cores other processes kept busy between two snapshots (0 at least)."""
    wall = after.wall_s - before.wall_s
    return max(0.0, elsewhere_s(before, after) / wall) if wall > 0 else 0.0
