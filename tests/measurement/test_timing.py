"""Timing logic on a fake clock: each pass advances it by a chosen duration, so nothing here is timed."""

import itertools

import numpy as np
import pytest

from aio_examples.core.errors import UsageError
from aio_examples.measurement import timing
from aio_examples.measurement.scenarios.turns import TurnsScenario
from aio_examples.measurement.timing import Measurement, StopRule, consume, measure


class FakeClock:
    """Wall time advances only when a pass says so; CPU time runs `cores` times as fast."""

    def __init__(self):
        self.ns = 0
        self.cores = 1.0
        self.slept = []

    def process_time_ns(self):
        return int(self.ns * self.cores)

    def perf_counter_ns(self):
        return self.ns

    def perf_counter(self):
        return self.ns / 1e9

    def sleep(self, seconds):
        self.ns += int(seconds * 1e9)
        self.slept.append(seconds)

    def time(self):
        return 1.8e9 + self.ns / 1e9


@pytest.fixture
def clock(monkeypatch):
    from aio_examples.measurement.scenarios import turns

    c = FakeClock()
    monkeypatch.setattr(timing, "time", c)
    monkeypatch.setattr(turns, "time", c)        # the turns scenario's rounds run on the same clock
    return c


def passes(clock, durations_ms, log=None, name=None):
    it = iter(durations_ms)

    def fn():
        clock.ns += int(next(it) * 1e6)
        if log is not None:
            log.append(name)
    return fn


def test_warm_up_runs_until_stable_and_records_first_pass(clock):
    m = Measurement(passes(clock, [500, 200, 120, 100, 101, 99] + [100] * 10_000), StopRule())
    m.warm_up()
    assert m.first_pass_ms == pytest.approx(500)
    assert m.warmup_passes == 6          # 100, 101, 99 are the first three passes within 10%
    assert m.samples_ns == []


def test_warm_up_has_a_minimum_of_two_passes(clock):
    m = Measurement(passes(clock, [100] * 100), StopRule(warmup_window=1))
    m.warm_up()
    assert m.warmup_passes == 2


def test_warm_up_is_bounded_by_a_share_of_the_timeout(clock):
    noisy = itertools.cycle([100, 200])       # never stable
    m = Measurement(passes(clock, noisy), StopRule(timeout_s=4, warmup_share=0.25))
    m.warm_up()
    assert 1.0 <= m.warmup_s < 1.3


def test_stops_at_confidence_target_after_minimum_count_and_time(clock):
    rng = np.random.default_rng(0)
    m = Measurement(passes(clock, rng.normal(50, 0.5, 100_000)), StopRule())
    measure([m])
    assert m.stop_reason == "confidence"
    assert m.confidence_met
    assert len(m.samples_ns) >= 10 and m.measured_s >= 2.0
    assert m.measured_s < 5


def test_noisy_pass_stops_at_timeout_without_confidence(clock):
    rng = np.random.default_rng(0)
    m = Measurement(passes(clock, rng.uniform(10, 100, 100_000)), StopRule(timeout_s=3))
    measure([m])
    assert m.stop_reason == "timeout"
    assert not m.confidence_met
    assert 3.0 <= m.measured_s < 3.2


def test_observed_cores_is_cpu_time_over_wall_time_of_measured_rounds(clock):
    clock.cores = 2.0
    m = Measurement(passes(clock, [10] * 50), StopRule(num_runs=20))
    measure([m])
    assert m.observed_cores == pytest.approx(2.0)


def test_first_output_is_kept_for_output_checks(clock):
    outputs = iter(range(100))

    def fn():
        clock.ns += 1_000_000
        return next(outputs)

    m = Measurement(fn, StopRule(num_runs=5))
    measure([m])
    assert m.first_output == 0 and len(m.samples_ns) == 5


def test_num_runs_is_exact(clock):
    m = Measurement(passes(clock, [10] * 1000), StopRule(num_runs=7))
    measure([m])
    assert len(m.samples_ns) == 7 and m.stop_reason == "num_runs"


def test_a_pass_longer_than_the_timeout_still_gives_one_sample(clock):
    m = Measurement(passes(clock, [5000] * 10), StopRule(timeout_s=1))
    measure([m])
    assert len(m.samples_ns) == 1 and m.stop_reason == "timeout"


def test_interleaved_rounds_alternate_between_measurements(clock):
    log = []
    a = Measurement(passes(clock, [100] * 10_000, log, "a"), StopRule(num_runs=30))
    b = Measurement(passes(clock, [100] * 10_000, log, "b"), StopRule(num_runs=30))
    measure([a, b], round_s=0.5)
    measured = log[-60:]
    switches = sum(1 for x, y in itertools.pairwise(measured) if x != y)
    assert switches >= 5                     # rounds of ~5 passes each: a.. b.. a.. b..
    assert len(a.samples_ns) == len(b.samples_ns) == 30


def test_round_order_changes_so_no_backend_always_follows_the_same_one(clock, monkeypatch):
    log = []
    sleep = clock.sleep
    monkeypatch.setattr(clock, "sleep", lambda s: (log.append("|"), sleep(s)))      # the gap ends a round
    ms = [Measurement(passes(clock, [100] * 10_000, log, name), StopRule(num_runs=60)) for name in "abc"]
    measure(ms, round_s=0.5)
    turns = [t for t in "".join(log).split("|") if t]           # e.g. "aaaaa", one backend's round
    order = [turns[0][-1]] + [t[0] for t in turns[1:30]]          # 10 full rounds (turns[0] has the warm-ups)
    rounds = [order[i:i + 3] for i in range(0, 30, 3)]
    assert all(sorted(r) == ["a", "b", "c"] for r in rounds)     # every round measures every one
    predecessors = {x: {order[i - 1] for i in range(1, len(order)) if order[i] == x} for x in "abc"}
    assert all(len(p - {x}) == 2 for x, p in predecessors.items())   # neighbours vary
    assert len({r[0] for r in rounds}) >= 2                      # so does who goes first


def test_interleaved_rounds_leave_an_idle_gap_but_a_lone_measurement_does_not(clock):
    ms = [Measurement(passes(clock, [100] * 10_000), StopRule(num_runs=30)) for _ in range(2)]
    measure(ms, round_s=0.5)
    assert len(clock.slept) >= 2 * (30 // 5) and set(clock.slept) == {timing.ROUND_GAP_S}
    clock.slept.clear()
    measure([Measurement(passes(clock, [100] * 100), StopRule(num_runs=30))], round_s=0.5)
    assert clock.slept == []


def test_a_failing_pass_ends_only_its_own_measurement(clock):
    def broken():
        raise RuntimeError("boom")
    seen = []
    good = Measurement(passes(clock, [10] * 1000), StopRule(num_runs=5))
    bad = Measurement(broken, StopRule(num_runs=5))
    measure([bad, good], on_error=lambda m, exc: seen.append((m, str(exc))))
    assert seen == [(bad, "boom")]
    assert len(good.samples_ns) == 5


def test_consume_reads_nested_outputs():
    touched = []

    class T:
        def numel(self):
            return 1

        def reshape(self, *_):
            return [self]

        def item(self):
            touched.append(self)
    consume({"a": [T(), (T(), None)], "b": T()})
    assert len(touched) == 3


@pytest.mark.parametrize("kwargs", [{"timeout_s": 0}, {"num_runs": 0}, {"ci_target": 0}])
def test_invalid_stop_rules_are_usage_errors(kwargs):
    with pytest.raises(UsageError):
        StopRule(**kwargs)


class CountingProbe:
    """A machine probe that takes 50 ms of the fake clock and reads 1, 2, 3, ... (its reference ten times that)."""

    def __init__(self, clock):
        self.clock, self.readings = clock, iter(range(1, 1000))

    def slice(self):
        self.clock.ns += int(0.05e9)
        i = float(next(self.readings))
        return [i, 10 * i]


def test_a_probe_is_read_after_every_round_of_a_lone_measurement(clock):
    """With a machine probe even one measurement runs in rounds, and each round records how many passes
    it made and what the probe read right after them: the passes add up, and the readings are in order."""
    m = Measurement(passes(clock, [100] * 10_000), StopRule(num_runs=40))
    measure([m], round_s=0.5, probe=CountingProbe(clock))
    assert sum(n for n, _, _ in m.rounds) == len(m.samples_ns) == 40
    assert [n for n, _, _ in m.rounds] == [5] * 8                   # 0.5 s rounds of 100 ms passes
    assert [[p, r] for _, p, r in m.rounds] == [[float(i), 10.0 * i] for i in range(1, 9)]


def test_the_machine_probe_is_a_real_timed_workload():
    from aio_examples.machine.probe import REFERENCE_S, SLICE_S, MachineProbe

    probe = MachineProbe()
    readings = [probe.slice() for _ in range(3)]
    assert all(len(r) == 2 and 0 < r[0] < 1000 * SLICE_S * 10 and 0 < r[1] < 1000 * REFERENCE_S * 10
               for r in readings)


def sweep_side(commands: list[str]):
    """The sweep's end of real pipes to a point taking turns: (Turns for the point, thread that sends
    `commands` one at a time, each after the point's answer, and what the point answered)."""
    import os
    import threading
    from multiprocessing.connection import Connection

    from aio_examples.measurement.scenarios.turns import Turns

    to_r, to_w = os.pipe()
    from_r, from_w = os.pipe()
    to_point, from_point = Connection(to_w, readable=False), Connection(from_r, writable=False)
    heard = []

    def drive():
        heard.append(from_point.recv())
        for command in commands:
            to_point.send(command)
            if command == "go":
                heard.append(from_point.recv())
    return Turns(f"{to_r},{from_w}"), threading.Thread(target=drive), heard


# Taking turns is a scenario (measurement/scenarios/turns.py) over these timing mechanics.
def test_taking_turns_runs_one_round_per_go_until_stop_whatever_the_stop_rule_says(clock):
    """A point taking turns says ready once warmed up, measures exactly one round for each go (its own
    stop rule would have stopped it after 2 s: the sweep decides), answers done, and stops on stop; each
    turn keeps its passes, the probe's reading and when it began."""
    turns, driver, heard = sweep_side(["go"] * 6 + ["stop"])
    m = Measurement(passes(clock, [100] * 10_000), StopRule(timeout_s=2.0))
    driver.start()
    TurnsScenario(turns, round_s=0.5).measure([m], None, CountingProbe(clock), 2.0)
    driver.join(timeout=10)
    assert heard == ["ready"] + ["done"] * 6
    assert [n for n, _, _ in m.rounds] == [5] * 6 and sum(n for n, _, _ in m.rounds) == len(m.samples_ns)
    assert [p for _, p, _ in m.rounds] == [float(i) for i in range(1, 7)]
    assert m.stop_reason == "turns" and len(m.turn_starts) == 6
    assert all(b - a >= 0.5 for a, b in zip(m.turn_starts, m.turn_starts[1:]))


def test_a_point_whose_pass_fails_still_answers_every_turn(clock):
    """A failure ends the measurement, not the conversation: the sweep is never left waiting."""
    def broken():
        raise RuntimeError("boom")

    turns, driver, heard = sweep_side(["go"] * 3 + ["stop"])
    m = Measurement(broken, StopRule(timeout_s=2.0), first_pass_ms=1.0)     # warmed up already
    seen = []
    driver.start()
    TurnsScenario(turns).measure([m], lambda m, exc: seen.append(str(exc)), None, 2.0)
    driver.join(timeout=10)
    assert heard == ["ready", "done", "done", "done"] and seen == ["boom"]
    assert m.stop_reason == "error" and m.rounds == []


def test_a_point_taking_turns_measures_one_backend():
    turns, _, _ = sweep_side([])
    with pytest.raises(UsageError, match="exactly one backend"):
        TurnsScenario(turns).measure([Measurement(lambda: None, StopRule(), first_pass_ms=1.0)] * 2, None, None, 1.0)


def test_a_measurement_done_at_its_target_stays_in_the_rounds_while_another_runs(clock):
    rng = np.random.default_rng(0)
    steady = Measurement(passes(clock, rng.normal(10, 0.01, 100_000)), StopRule(timeout_s=4, min_time_s=0.5))
    noisy = Measurement(passes(clock, rng.uniform(10, 100, 100_000)), StopRule(timeout_s=3))
    measure([steady, noisy], round_s=0.5)
    assert steady.stop_reason == "confidence" and noisy.stop_reason == "timeout"
    assert steady.measured_s >= 2.5          # kept in the rounds, not stopped at 0.5 s
    assert steady.measured_s < 4.2           # ... and no further than its own timeout, nor the noisy one's end


def test_a_measurement_kept_in_the_rounds_stops_at_its_own_timeout(clock):
    rng = np.random.default_rng(0)
    steady = Measurement(passes(clock, rng.normal(10, 0.01, 100_000)), StopRule(timeout_s=1.5, min_time_s=0.5))
    noisy = Measurement(passes(clock, rng.uniform(10, 100, 100_000)), StopRule(timeout_s=4))
    measure([steady, noisy], round_s=0.5)
    assert 1.5 <= steady.measured_s < 2.1 and noisy.measured_s >= 4
    assert steady.stop_reason == "confidence"
