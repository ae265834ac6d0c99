"""The report across machines: real records of a small sweep, and a second machine derived from them (another CPU
and machine_type, half the latency, twice the throughput), side by side, under a latency bound, with prices."""

import copy

import pandas as pd
import pytest
from conftest import run_cli

from aio_examples.core import records as res
from aio_examples.reporting import fleet
from aio_examples.reporting.report import build_report

BIG = {"cpu_model": "Fleet Test CPU", "machine_type": "big.2x", "logical_cpus": 8, "machine_cpus": 8}
PRICE_A, PRICE_BIG = 0.34, 0.58


def derived(r: res.Result, factor: float, **env) -> res.Result:
    """`r` measured on another machine (env fields replaced), `factor` times its latency."""
    r = copy.deepcopy(r)
    r.env = {**r.env, **env}
    r.latency_ms = {k: v * factor if k != "n" and isinstance(v, float) else v for k, v in r.latency_ms.items()}
    r.samples_ms = [v * factor for v in r.samples_ms]
    r.throughput = {**r.throughput, "value": r.throughput["value"] / factor}
    return r


@pytest.fixture(scope="module")
def two_machines(small_sweep, tmp_path_factory):
    """Machine A: the sweep's records (named by fingerprint), its fastest configuration given a heavy tail (p99
    over the bound); machine big.2x: every configuration at half the latency. The bound lets every other one in."""
    originals = [r for r in res.load_records(small_sweep[0]) if r.status == "ok"]
    assert len(originals) == 4
    for r in originals:
        r.env.pop("machine_type", None)
    bound = 1.01 * max(r.latency_ms["p99"] for r in originals)
    heavy = max(originals, key=lambda r: r.throughput["value"])
    big = [derived(r, 0.5, **BIG) for r in originals]
    a = [derived(r, 1.0) for r in originals]
    a[originals.index(heavy)].latency_ms["p99"] = 10 * bound
    folder = tmp_path_factory.mktemp("fleet-records")
    for r in a + big:
        res.append(folder, r)
    prices = folder / "prices.toml"
    prices.write_text(f'currency = "USD"\n[prices]\n"{heavy.machine}" = {PRICE_A}\n"big.2x" = {PRICE_BIG}\n')
    out = tmp_path_factory.mktemp("fleet-report")
    proc = run_cli(["-m", "aio_examples", "report", str(folder), "--output", str(out), "--prices", str(prices),
                    "--latency-ms", f"{bound:.6f}"])
    assert proc.returncode == 0, proc.stderr[-2000:]
    return {"a": a, "big": big, "heavy": heavy, "bound": float(f"{bound:.6f}"), "folder": folder, "out": out,
            "proc": proc, "prices": prices, "fingerprint": heavy.machine}


def test_each_configuration_is_shown_side_by_side_on_both_machines(two_machines):
    rows = fleet.frame(two_machines["a"] + two_machines["big"])
    wide = fleet.side_by_side(rows)
    a, big = two_machines["fingerprint"], "big.2x"
    assert len(wide) == 4 and set(rows.machine) == {a, big}
    assert list(wide[(big, "median ms")]) == pytest.approx(list(0.5 * wide[(a, "median ms")]))
    assert list(wide[(big, "throughput")]) == pytest.approx(list(2 * wide[(a, "throughput")]))
    page = (two_machines["out"] / "report.html").read_text()
    assert "id='fleet'" in page and "Fleet Test CPU" in page and "8 CPUs offered" in page
    assert page.count("big.2x") >= 3 and page.count(a) >= 3          # machines, columns, best rows


def test_the_best_configuration_of_a_machine_keeps_within_the_latency_bound(two_machines):
    best = pd.read_csv(two_machines["out"] / "fleet.csv").set_index("machine")
    heavy, bound = two_machines["heavy"], two_machines["bound"]
    within = [r for r in two_machines["a"] if r.latency_ms["p99"] <= bound]
    expected = max(within, key=lambda r: r.throughput["value"])
    on_a = best.loc[two_machines["fingerprint"]]
    assert (on_a.backend, on_a.threads) == (expected.backend, expected.threads)
    assert (on_a.backend, on_a.threads) != (heavy.backend, heavy.threads) and on_a.p99_ms <= bound
    on_big = best.loc["big.2x"]                                       # no heavy tail there: the fastest wins
    assert (on_big.backend, on_big.threads) == (heavy.backend, heavy.threads)
    assert on_big.core_share == pytest.approx(heavy.threads / 8)
    unbounded = fleet.best(fleet.frame(two_machines["a"]))            # without the bound the heavy tail wins
    assert (unbounded.backend[0], unbounded.threads[0]) == (heavy.backend, heavy.threads)


def test_cost_per_million_comes_from_throughput_and_price_and_the_cheapest_machine_is_named(two_machines):
    best = pd.read_csv(two_machines["out"] / "fleet.csv").set_index("machine")
    for machine, price in ((two_machines["fingerprint"], PRICE_A), ("big.2x", PRICE_BIG)):
        row = best.loc[machine]
        assert row.price_per_hour == price and row.currency == "USD"
        assert row.cost_per_million == pytest.approx(price / (row.throughput * 3600) * 1e6)
        assert row.inferences_per_dollar == pytest.approx(row.throughput * 3600 / price)
    # big.2x: the heavy configuration at twice its throughput for 0.58/h; A: a slower one for 0.34/h.
    cost_big = PRICE_BIG / (2 * two_machines["heavy"].throughput["value"] * 3600) * 1e6
    assert best.loc["big.2x"].cost_per_million == pytest.approx(cost_big)
    assert cost_big < best.loc[two_machines["fingerprint"]].cost_per_million
    assert list(best.cheapest) == [m == "big.2x" for m in best.index]
    lines = [line for line in two_machines["proc"].stdout.splitlines() if line.startswith("  squeezenet")]
    assert len(lines) == 1 and "big.2x" in lines[0] and f"{cost_big:.4g} USD per million images" in lines[0]
    md = (two_machines["out"] / "fleet.md").read_text()
    assert "whole machine" in md and "big.2x" in md


def test_a_machine_without_a_price_gets_no_cost_and_is_named(two_machines, tmp_path):
    prices = tmp_path / "p.toml"
    prices.write_text('[prices]\n"big.2x" = 1.5\n')
    machines = fleet.Fleet.of(two_machines["a"] + two_machines["big"], prices)
    costs = machines.best.set_index("machine").cost_per_million
    assert pd.isna(costs[two_machines["fingerprint"]]) and costs["big.2x"] > 0
    assert machines.unpriced() == [two_machines["fingerprint"]]
    assert f"No price, so no cost columns, for: {two_machines['fingerprint']}" in fleet.table(machines)


def test_a_multi_instance_run_counts_with_its_aggregate_and_not_its_instances(two_machines):
    one = two_machines["a"][0]
    aggregate = copy.deepcopy(one)
    aggregate.instances, aggregate.instance = 2, {"count": 2}
    aggregate.throughput = {**one.throughput, "value": 3 * one.throughput["value"]}
    part = copy.deepcopy(aggregate)
    part.instance, part.throughput = {"index": 0, "count": 2}, {**one.throughput, "value": 1.0}
    rows = fleet.frame([one, aggregate, part])
    assert sorted(rows.instances) == [1, 2]
    assert rows[rows.instances == 2].throughput.item() == pytest.approx(3 * one.throughput["value"])
    assert fleet.best(rows).instances.item() == 2


BAD_PRICES = {
    "not-toml": ("[prices\n", "is not valid TOML"),
    "no-table": ('currency = "USD"\n', "has no [prices] table"),
    "not-a-number": ('[prices]\n"big.2x" = "cheap"\n', "the price of 'big.2x' is 'cheap', not a number"),
    "zero": ('[prices]\n"big.2x" = 0\n', "the price of 'big.2x' is 0"),
    "negative": ('[prices]\n"big.2x" = -0.5\n', "the price of 'big.2x' is negative (-0.5)"),
    "unknown-machine": ('[prices]\n"m9.huge" = 1.0\n"big.2x" = 1.0\n', "'m9.huge' not in the results"),
    "unknown-key": ('region = "eu"\n[prices]\n"big.2x" = 1.0\n', "unknown key(s) 'region'"),
}


@pytest.mark.parametrize("case", [*BAD_PRICES, "unreadable", "bound-zero", "bound-negative"])
def test_bad_prices_or_bound_exit_2_with_one_line(two_machines, tmp_path, case):
    prices = tmp_path / "bad.toml"
    args = ["--prices", str(prices)]
    if case in BAD_PRICES:
        prices.write_text(BAD_PRICES[case][0])
        expected = BAD_PRICES[case][1]
    elif case == "unreadable":
        expected = "cannot be read"
    else:
        value = "0" if case == "bound-zero" else "-5"
        args, expected = [f"--latency-ms={value}"], f"--latency-ms '{value}' is invalid; accepted: a number of"
    proc = run_cli(["-m", "aio_examples", "report", str(two_machines["folder"]), "--output", str(tmp_path / "out"),
                    *args])
    assert proc.returncode == 2 and expected in proc.stderr and "accepted:" in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1
    assert not (tmp_path / "out" / "report.html").exists()
    if case == "unknown-machine":       # names the machines the results have
        assert "big.2x" in proc.stderr and two_machines["fingerprint"] in proc.stderr


def test_a_report_over_one_machine_without_prices_has_no_fleet_section(small_sweep, tmp_path):
    written = build_report([small_sweep[0]], tmp_path / "report", include_contended=True)
    assert "id='fleet'" not in written["html"].read_text()
    assert "fleet_csv" not in written and not (tmp_path / "report" / "fleet.csv").exists()
