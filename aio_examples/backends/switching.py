"""One pass over several prepared engines that runs whichever is fastest now, switching at run time.

On a shared machine, engines within a few percent of each other trade the lead from one minute to the next
(mobilenet_v2 fp32 here: ONNX Runtime 4.3 ms a pass for a few seconds, then 7, while OpenVINO stayed at 6.2),
so a choice made once at preparation, however carefully raced, is wrong for part of the run. This pass keeps
them all and does what a multi-armed bandit with sliding windows does: it runs the leader, and every
`PROBE_EVERY` passes it runs another engine for `PROBE_PASSES` passes (the first warms that engine's caches,
the last is timed). It switches when the other's median over its last `WINDOW` probes is below the leader's
over its last `WINDOW` passes. An engine a probe finds clearly slower is probed half as often (down to once
in `MAX_PROBE_EVERY` passes), so engines far apart cost little; one that comes close is probed often again.
Every pass is a real pass of one engine: what the runner times is what the switching costs.
"""

import statistics
import time
from collections import deque

from .base import Prepared

PROBE_EVERY = 16         # passes of the leader between two probes of an engine that is close
MAX_PROBE_EVERY = 512    # ... and of one that is clearly slower, after its interval doubled probe by probe
PROBE_PASSES = 2         # passes of another engine per probe: its caches are cold on the first
WINDOW = 7               # timed passes per engine whose median is compared
MIN_TIMED = 3            # timed passes each engine needs before a switch
CLEARLY_SLOWER = 1.05    # a probed engine's median this far above the leader's doubles its interval
RACE_BEHIND_EVERY = 64   # the first interval of an engine the race found clearly slower


class SwitchingPass:
    """Call with one input tuple per engine (in `names` order); returns the output of the engine that ran. The
    first engine leads at the start. `stats` (a dict, e.g. the record's backend_info entry) is kept up to date:
    passes per engine, switches, and the leader."""

    def __init__(self, names: list[str], fns: list, stats: dict | None = None, medians_ms: dict | None = None):
        """`medians_ms`: what a race just measured of each engine, if anything: each window starts with it, and
        an engine clearly slower there starts at RACE_BEHIND_EVERY, so a short run is not spent finding out
        again what the race found."""
        self.names, self._fns, self.leader = list(names), list(fns), 0
        seeds = [(medians_ms or {}).get(n) for n in self.names]
        self._timed = [deque([] if ms is None else [ms * 1e6], maxlen=WINDOW) for ms in seeds]
        ahead = seeds[0]
        self._every = [RACE_BEHIND_EVERY if ms and ahead and ms > ahead * CLEARLY_SLOWER else PROBE_EVERY
                       for ms in seeds]
        self._due = list(self._every)      # leader passes until each engine's next probe
        self._probing, self._left, self._cold = None, 0, False
        self.stats = stats if stats is not None else {}
        self.stats.update(engines=self.names, passes=dict.fromkeys(self.names, 0), switches=0,
                          leader=self.names[0], probe_every=PROBE_EVERY, probe_passes=PROBE_PASSES)

    def shares(self) -> str:
        """The engines that ran, most passes first, with each one's share (`onnxruntime 97%+openvino 3%`); the
        engine's name alone when one ran every pass."""
        passes = self.stats["passes"]
        total = sum(passes.values())
        ran = sorted((n for n in self.names if passes[n]), key=lambda n: -passes[n])
        if len(ran) <= 1:
            return ran[0] if ran else self.names[0]
        return "+".join(f"{n} {_percent(passes[n] / total)}" for n in ran)

    def __call__(self, *inputs):
        i = self._next()
        start = time.perf_counter_ns()
        out = self._fns[i](*inputs[i])
        self._after(i, time.perf_counter_ns() - start)
        return out

    def _next(self) -> int:
        if self._probing is not None:
            return self._probing
        for j in range(len(self.names)):
            if j != self.leader:
                self._due[j] -= 1
        due = [j for j in range(len(self.names)) if j != self.leader and self._due[j] <= 0]
        if not due:
            return self.leader
        self._probing = min(due, key=lambda j: self._due[j])
        self._left = PROBE_PASSES
        return self._probing

    def _after(self, i: int, ns: int) -> None:
        self.stats["passes"][self.names[i]] += 1
        if i == self._probing:
            self._left -= 1
            if self._left <= 0:         # (<=: calls from two threads at once must still end the probe)
                self._timed[i].append(ns)
                self._probing, self._cold = None, True
                self._decide(i)
        elif self._cold:            # the leader's first pass after a probe found its caches taken
            self._cold = False
        else:
            self._timed[i].append(ns)

    def _decide(self, probed: int) -> None:
        ahead, mine = self._timed[probed], self._timed[self.leader]
        if len(ahead) < MIN_TIMED or len(mine) < MIN_TIMED:     # too few to judge: probed again at its interval
            self._due[probed] = self._every[probed]
            return
        theirs, ours = statistics.median(ahead), statistics.median(mine)
        if theirs < ours:
            old, self.leader = self.leader, probed
            self._every[old] = self._due[old] = PROBE_EVERY
            self.stats["switches"] += 1
            self.stats["leader"] = self.names[probed]
            return
        self._every[probed] = min(2 * self._every[probed], MAX_PROBE_EVERY) if theirs > ours * CLEARLY_SLOWER \
            else PROBE_EVERY
        self._due[probed] = self._every[probed]


def switching(prepared: dict[str, Prepared], leader: str, stats: dict, medians_ms: dict | None = None) -> Prepared:
    """A Prepared running the fastest of `prepared` at each moment, starting with `leader`; `stats` gets its
    passes per engine, switches and each engine's precision mode; `medians_ms` is what was just measured of
    each engine in quiet rounds (None: nothing to trust, each window starts empty). The record's strategy
    names the engines that ran, with their shares of the passes.
    Its inputs are each engine's own. Its precision mode is the engines' (joined with "+" where they differ:
    OpenVINO's pinned f32 beside ONNX Runtime's native fp32), so the record names every mode its passes ran in."""
    names = [leader, *(n for n in prepared if n != leader)]
    parts = [prepared[n] for n in names]
    fn = SwitchingPass(names, [p.fn for p in parts], stats, medians_ms)
    stats["precision_modes"] = {n: p.precision_mode for n, p in zip(names, parts, strict=True)}
    return Prepared(fn, tuple(p.inputs for p in parts), "+".join(dict.fromkeys(p.precision_mode for p in parts)),
                    dict(parts[0].info), convert=lambda inputs: tuple(p.feed(inputs) for p in parts),
                    strategy_ran=fn.shares)


def _percent(share: float) -> str:
    return "<1%" if share < 0.005 else f"{100 * share:.0f}%"

