import numpy as np
import pytest

from aio_examples.measurement.stats import median_ci, summarize


def test_summary_matches_numpy():
    rng = np.random.default_rng(0)
    x = rng.lognormal(3, 0.2, 500)
    s = summarize(x)
    assert s.n == 500
    assert s.median == pytest.approx(np.median(x))
    assert s.mean == pytest.approx(x.mean())
    assert s.p90 == pytest.approx(np.percentile(x, 90))
    assert s.p99 == pytest.approx(np.percentile(x, 99))
    assert s.stdev == pytest.approx(x.std(ddof=1))
    assert (s.min, s.max) == (x.min(), x.max())
    assert s.ci_low <= s.median <= s.ci_high


def test_median_ci_covers_true_median_about_95_percent():
    rng = np.random.default_rng(1)
    true_median = np.exp(3.0)
    hits = 0
    trials = 400
    for _ in range(trials):
        lo, hi = median_ci(rng.lognormal(3.0, 0.3, 60))
        hits += lo <= true_median <= hi
    assert 0.92 <= hits / trials <= 0.995


def test_ci_narrows_with_more_samples_and_is_unknown_for_tiny_samples():
    rng = np.random.default_rng(2)
    small = summarize(rng.normal(100, 5, 30)).ci_rel_halfwidth
    large = summarize(rng.normal(100, 5, 3000)).ci_rel_halfwidth
    assert large < small / 4
    assert summarize([1.0, 2.0, 3.0]).ci_rel_halfwidth == float("inf")


def test_summary_of_nothing_is_an_error():
    with pytest.raises(ValueError):
        summarize([])


def _probed_side(rng, slope, level=1.0, processes=5, rounds=10, passes=20, machine_sd=0.15):
    """Processes whose rounds ran while the machine moved (the probe read it) and the model followed by
    `slope`; `level` is the code's own speed."""
    side = []
    for _ in range(processes):
        probe = np.exp(rng.normal(0, machine_sd, rounds)) * 0.8
        x = np.concatenate([level * 10 * (p / 0.8) ** slope * rng.lognormal(0, 0.02, passes) for p in probe])
        side.append((x, [[passes, float(p * rng.lognormal(0, 0.01))] for p in probe]))
    return side


def test_machine_slope_recovers_how_a_model_follows_the_machine():
    from aio_examples.measurement.stats import machine_slope, without_machine

    rng = np.random.default_rng(3)
    for truth in (0.4, 1.0):
        # A code slowdown of 20% on the second side does not enter the slope (each side is centred).
        sides = [_probed_side(rng, truth), _probed_side(rng, truth, level=1.2)]
        slope, se = machine_slope(sides)
        assert 0 < se < 0.1
        assert abs(slope - truth) < 0.1
        flat = [np.median(without_machine(x, r, slope, 0.8)) for x, r in sides[0]]
        raw = [np.median(x) for x, _ in sides[0]]
        assert np.std(np.log(flat)) < 0.5 * np.std(np.log(raw))
    # A model that does not follow the probe (one thread, a quiet machine) gets nothing taken out.
    assert machine_slope([_probed_side(rng, 0.0), _probed_side(rng, 0.0)])[0] < 0.05
    assert machine_slope([_probed_side(rng, 1.0, processes=1, rounds=3)]) == (0.0, 0.0)   # too few rounds


def _drifting_side(rng, level=1.0, processes=4, rounds=30):
    """Processes on a machine whose speed wanders slowly (a random walk over the rounds, from a level of its
    own a process), read by a reference with a noise of its own every round; the model follows by 1."""
    side = []
    for _ in range(processes):
        state = np.cumsum(rng.normal(0, 0.01, rounds)) + rng.normal(0, 0.04)
        x = np.concatenate([level * 10 * np.exp(s) * rng.lognormal(0, 0.01, 20) for s in state])
        side.append((x, [[20, 1.0, float(np.exp(s + rng.normal(0, 0.03)))] for s in state]))
    return side


def test_a_noisy_reading_flattens_a_slope_fitted_round_by_round_and_blocks_of_rounds_undo_it():
    from aio_examples.measurement.stats import REFERENCE, machine_slope

    rng = np.random.default_rng(5)
    by_round, by_block = [], []
    for _ in range(5):
        sides = [_drifting_side(rng), _drifting_side(rng, level=1.2)]
        by_round.append(machine_slope(sides, REFERENCE)[0])
        by_block.append(machine_slope(sides, REFERENCE, block=5)[0])
    assert np.median(by_round) < 0.8 and 0.85 < np.median(by_block) < 1.15


def turned_process(rng, turns: int, turn_sd: float, passes: int = 25, level: float = 1.0):
    """Passes of a process that took `turns` turns, each at its own machine state (lognormal, turn_sd)."""
    states = level * np.exp(rng.normal(0, turn_sd, turns))
    return (np.concatenate([s * 10 * rng.lognormal(0, 0.01, passes) for s in states]),
            [[passes, 1.8e9 + i] for i in range(turns)])


def test_turn_noise_is_how_much_the_median_of_the_turns_moves():
    """Against the sd of the side median over many simulated sides: the turns' estimate is close, grows
    with the turns' spread, has up to T - 1 degrees of freedom per process, and needs enough turns."""
    from aio_examples.measurement.stats import median_variance, turn_noise

    rng = np.random.default_rng(3)
    for turn_sd in (0.05, 0.15):
        sides = [[turned_process(rng, 20, turn_sd) for _ in range(2)] for _ in range(400)]
        truth = np.std([np.log(np.median([np.median(g) for g, _ in side])) for side in sides])
        estimates = [turn_noise([g for g, _ in side], [t for _, t in side]) for side in sides[:40]]
        assert all(34 <= dof <= 38 for _, dof in estimates)      # a turn far out is set aside
        assert np.median([se for se, _ in estimates]) == pytest.approx(truth, rel=0.3)
        assert np.median([se for se, _ in estimates]) == pytest.approx(
            turn_sd * np.sqrt(np.pi / 2 / 20 * median_variance(2)), rel=0.3)
    g, t = turned_process(rng, 4, 0.1)
    assert turn_noise([g], [t])[1] == 0 and turn_noise([g], [None])[1] == 0
