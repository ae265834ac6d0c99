"""How often the nightly comparison cries wolf, and how often it catches a real slowdown, on this machine.

    python benchmarks/regression_detector.py                     # runs the nightly sweep twice, then judges
    python benchmarks/regression_detector.py --runs A B          # two existing runs of the same sweep

The runs are of the nightly sweep (sweeps/nightly.toml: the quick zoo, each point in two processes taking turns), or
of any sweep given twice.
1. Noise model from the two real runs, per configuration: its processes' passes (as measured, in order);
   per backend and thread count: how far a process's median settles from its configuration's median
   process (every observed deviation, the disturbed processes' long slow tail included).
2. Synthetic pairs of whole runs built from that noise: every process of every configuration is a real
   process's passes of that configuration, block-resampled (blocks keep the drift within a process), moved
   by a deviation drawn from its backend's and thread count's observed ones (their heavy tail included),
   and keeping whether that process met its confidence target (the runner stops a process the moment its
   interval is narrow enough: recomputing the interval on resampled passes would miss it about half the
   time, and make sides look less confident than measured ones are). Runs that carry the machine readings
   (the nightly sweep's probe = true) instead draw each process from the configuration's real processes
   (either run), rebuilt from its own one-second rounds drawn with replacement, each round with the readings
   taken beside it: the machine's state and the readings of it stay together (a process that took
   turns with the others, the nightly sweep's interleave, is rebuilt from blocks of four consecutive
   turns: the machine's slow states outlast one turn). The new run is
   slowed down by 0%, 3%, 5%, 10% or 20%. Each pair is judged by aio_examples.analysis.compare like a real one, whole runs at a time
   (so the between-run noise is estimated as in a real comparison); --pairs configurations are counted
   per row.
3. The real runs: the second against the first (nothing changed: no regression may be flagged), each
   against the other slowed down by 5%, 10% and 20% (what a user meets: the machine's own moves between
   the runs included; reported, not a target), and the 1-thread points against the 2-thread points of the
   same run (a real slowdown: must be flagged).

Targets: at most 2 regressions in the pure-noise pairs, at least 95% of 10% slowdowns flagged, no
regression between the two real runs, and the real thread comparison flagged.
"""

import argparse
import json
import subprocess
import sys
from collections import Counter
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from aio_examples.analysis import compare as cmp
from aio_examples.analysis.history import load_run
from aio_examples.analysis.noise import noise_group, take_out_machine
from aio_examples.analysis.runs import Run
from aio_examples.core.records import Result
from aio_examples.measurement.stats import split_rounds, summarize
from aio_examples.reporting.regression import summary_line, to_markdown

SLOWDOWNS = (0.0, 0.03, 0.05, 0.10, 0.20)
BLOCK = 10
# Turns of a process that took turns with the others (sweep interleave) are drawn four at a time: one
# process's consecutive turns are about half a minute apart, and the machine's slow states last minutes.
TURN_BLOCK = 4


def sweep(out: Path, config: Path):
    subprocess.run([sys.executable, "-m", "aio_examples", "sweep", "--config", str(config), "--output", str(out),
                    "--quiet"], cwd=ROOT, check=True)


def noise_model(a: Run, b: Run):
    """configurations: (key, normalised pass sequences with their processes' confidence_met and machine
    reading rounds (None without), typical median, processes a run);
    deviations: noise group (backend, threads) -> every process's log median minus that of its
    configuration's median process (both runs); the run-to-run changes of the configurations' medians."""
    ca, cb = a.configurations(), b.configurations()
    configs, deviations, shifts = [], {}, []
    for key in sorted(ca.keys() & cb.keys(), key=str):
        ea, eb = ca[key], cb[key]
        groups = ea["groups"] + eb["groups"]
        if ea["record"].status != "ok" or eb["record"].status != "ok" or min(g.size for g in groups) < 20:
            continue
        logs = np.log([np.median(g) for g in groups])
        # From the median of the configuration's processes (both runs): a disturbed process stays an outlier
        # on its side instead of pulling the centre, and every other process, towards it.
        deviations.setdefault(noise_group(key), []).extend(logs - np.median(logs))
        shifts.append(np.log(eb["median_ms"] / ea["median_ms"]))
        typical = float(np.exp(np.median(logs)))
        # A probed process keeps its own level (the machine state its readings saw); without them a
        # process is its shape only, and synthetic_run draws its level from the noise group's deviations.
        configs.append((key, [(g / (typical if r else np.median(g)), m, r)
                              for g, m, r in zip(groups, ea["met"] + eb["met"], ea["rounds"] + eb["rounds"],
                                                 strict=True)],
                        typical, len(ea["groups"]), took_turns(ea["record"])))
    return configs, {k: np.array(v) for k, v in deviations.items()}, np.array(shifts)


def adjusted_spread(a: Run, b: Run) -> dict:
    """threads -> how far a process's median settles from its configuration's (robust sd, both runs), once
    compare has taken the machine readings' share out of the two real runs (empty without readings)."""
    ca, cb = a.configurations(), b.configurations()
    keys = [k for k in sorted(ca.keys() & cb.keys(), key=str) if ca[k]["groups"] and cb[k]["groups"]]
    adjusted = take_out_machine(ca, cb, keys)
    deviations = {}
    for key in adjusted:
        logs = np.log([np.median(g) for g in ca[key]["groups"] + cb[key]["groups"]])
        deviations.setdefault(ca[key]["record"].threads, []).extend(logs - np.median(logs))
    return {t: 1.4826 * float(np.median(np.abs(d))) for t, d in sorted(deviations.items())}


def block_resample(rng, seq: np.ndarray) -> np.ndarray:
    n = seq.size
    starts = rng.integers(0, max(1, n - BLOCK + 1), size=n // BLOCK + 1)
    return np.concatenate([seq[s:s + BLOCK] for s in starts])[:n]


def round_resample(rng, seq: np.ndarray, rounds: list, block: int = 1) -> tuple[np.ndarray, list]:
    """A process rebuilt from its own rounds drawn with replacement, `block` consecutive rounds at a time:
    each round keeps its passes and the machine readings taken beside them, so the process keeps the machine
    states it ran in (and, with blocks, how long they lasted)."""
    chunks = split_rounds(seq, rounds)
    n = len(rounds)
    starts = rng.integers(max(1, n - block + 1), size=-(-n // block))
    picks = np.concatenate([np.arange(s, min(s + block, n)) for s in starts])[:n]
    return np.concatenate([chunks[i] for i in picks]), [list(rounds[i]) for i in picks]


def synthetic_record(key, samples, confident: bool, rounds=None, turns=False) -> Result:
    model, task, backend, precision, batch, threads, instances = key[:7]
    s = summarize(samples)
    return Result.from_dict({"model": model, "task": task, "backend": backend, "precision": precision, "batch_size": batch, "threads": threads,
            "instances": instances, "status": "ok", "samples_ms": samples.tolist(), "latency_ms": s.to_dict(),
            "throughput": {"value": 1000.0 * batch / s.mean, "unit": "units/s"},
            "confidence_met": confident, "probe": {"rounds": rounds} if rounds else None,
            "turns": [[r[0], None] for r in rounds] if turns else None})


def synthetic_run(rng, configs, deviations, factor=1.0) -> Run:
    """One run of every configuration. Without the machine readings, each process is a real pass sequence
    (block-resampled) moved by a process-level deviation of its noise group (backend and threads). With it,
    each process is one of the configuration's real processes (either run) rebuilt from its own rounds
    (round_resample): its level, its machine state and the readings of it stay together, which a
    deviation drawn apart from them would break."""
    records = []
    for key, sequences, median, processes, turns in configs:
        for _ in range(processes):
            seq, met, rounds = sequences[rng.integers(len(sequences))]
            if rounds:
                passes, rounds = round_resample(rng, seq, rounds, TURN_BLOCK if turns else 1)
                records.append(synthetic_record(key, median * factor * passes, met, rounds, turns))
            else:
                shift = np.exp(rng.choice(deviations[noise_group(key)]))
                records.append(synthetic_record(key, median * factor * shift * block_resample(rng, seq), met))
    return Run("synthetic", records)


def synthetic(configs, deviations, pairs, threshold, seed=20261121):
    """slowdown -> verdict counts over `pairs` configurations, and slowdown -> threads -> (flagged, judged)."""
    rng = np.random.default_rng(seed)
    outcome, by_threads = {}, {}
    for slowdown in SLOWDOWNS:
        rows = []
        while len(rows) < pairs:
            base = synthetic_run(rng, configs, deviations)
            new = synthetic_run(rng, configs, deviations, 1 + slowdown)
            rows += cmp.compare(base, new, threshold).rows
        rows = rows[:pairs]
        outcome[slowdown] = dict(Counter(row["verdict"] for row in rows))
        by_threads[slowdown] = {t: (sum(r["verdict"] == "regression" for r in rows if r["threads"] == t),
                                    sum(r["threads"] == t for r in rows))
                                for t in sorted({r["threads"] for r in rows})}
    return outcome, by_threads


def took_turns(record: Result) -> bool:
    return bool(record.turns)


def slowed(run: Run, factor: float) -> Run:
    """The same run with every pass `factor` times slower (the machine readings unchanged)."""
    records = []
    for r in run.records:
        r = Result.from_dict(r.to_dict())
        if r.samples_ms:
            r.samples_ms = [x * factor for x in r.samples_ms]
        if r.latency_ms:
            r.latency_ms = {k: v * factor if isinstance(v, (int, float)) and k != "n" else v
                            for k, v in r.latency_ms.items()}
        if (r.throughput or {}).get("value"):
            r.throughput = {**r.throughput, "value": r.throughput["value"] / factor}
        records.append(r)
    return Run(f"{run.label} x{factor:g}", records)


def split_threads(run: Run, threads: int) -> Run:
    return Run(f"{run.label} (threads {threads})", [r for r in run.records if r.threads == threads])


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--runs", nargs=2, metavar=("FIRST", "SECOND"), help="two runs of the same sweep (default: run "
                   "--config twice into --output)")
    p.add_argument("--config", default=str(ROOT / "sweeps" / "nightly.toml"), help="the sweep to run twice")
    p.add_argument("--output", default="results/regression-detector", help="where to write runs and the verdict")
    p.add_argument("--pairs", type=int, default=200)
    p.add_argument("--threshold", default="5%")
    p.add_argument("--seed", type=int, default=20261121, help="of the synthetic pairs: another seed, other pairs "
                   "from the same noise (how much the counts themselves vary)")
    args = p.parse_args()
    threshold = cmp.parse_threshold(args.threshold)
    out = Path(args.output)
    out.mkdir(parents=True, exist_ok=True)
    if args.runs:
        first, second = map(Path, args.runs)
    else:
        first, second = out / "run1", out / "run2"
        for run in (first, second):
            sweep(run, Path(args.config))
    a, b = load_run(first), load_run(second)

    configs, deviations, shifts = noise_model(a, b)
    spread = {name: 1.4826 * float(np.median(np.abs(d))) for name, d in sorted(deviations.items())}
    print(f"noise model: {len(configs)} configurations with >= 20 passes in every process, {configs[0][3]} "
          f"process(es) per configuration and run{' taking turns' if configs[0][4] else ''}; how far a process's median settles from its configuration's "
          f"(robust sd; largest): " + ", ".join(f"{b} t{t} {100 * sd:.2f}% ({100 * np.abs(deviations[(b, t)]).max():.1f}%)"
                                                for (b, t), sd in spread.items())
          + f"; run-to-run change of a configuration: median {100 * np.median(shifts):+.2f}%, largest "
          f"{100 * np.max(np.abs(shifts)):.2f}%")
    adjusted = adjusted_spread(a, b)
    if adjusted:
        print("with the machine readings' share taken out (as compare does between the two runs): "
              + ", ".join(f"t{t} {100 * sd:.2f}%" for t, sd in adjusted.items()))
    outcome, by_threads = synthetic(configs, deviations, args.pairs, threshold, args.seed)
    print(f"\nsynthetic pairs ({args.pairs} per row, threshold {100 * threshold:g}%):\n")
    print("| injected slowdown | regression | suspicious | unchanged | improvement |")
    print("|---|---|---|---|---|")
    for slowdown, v in outcome.items():
        print(f"| {100 * slowdown:g}% | {v.get('regression', 0)} | {v.get('suspicious', 0)} | {v.get('unchanged', 0)} "
              f"| {v.get('improvement', 0)} |")

    print("\nflagged by thread count: " + "; ".join(
        f"{100 * slowdown:g}%: " + ", ".join(f"t{t} {flagged}/{judged}" for t, (flagged, judged) in counts.items())
        for slowdown, counts in by_threads.items()))

    repeat = cmp.compare(a, b, threshold)
    print(f"\nreal repeat runs ({first} -> {second}): {summary_line(repeat)}")
    for note in repeat.notes:
        print(f"  note: {note}")
    for row in repeat.rows:
        if row["verdict"] != "unchanged":
            print(f"  {row['model']} {row['backend']} t{row['threads']}: {row['verdict']}: {row['why']}")
    print("\nreal runs, the newer one slowed down (each real run against the other, slowed; the machine's own "
          "moves between the runs included):")
    real_slowed = {}
    for slowdown in (0.05, 0.10, 0.20):
        rows = (cmp.compare(a, slowed(b, 1 + slowdown), threshold).rows
                + cmp.compare(b, slowed(a, 1 + slowdown), threshold).rows)
        real_slowed[slowdown] = dict(Counter(row["verdict"] for row in rows))
        print(f"  {100 * slowdown:g}%: {real_slowed[slowdown].get('regression', 0)} of {len(rows)} flagged "
              f"({', '.join(f'{n} {v}' for v, n in sorted(real_slowed[slowdown].items()))})")
    fewer = cmp.compare(split_threads(a, 2), split_threads(a, 1), threshold, ignore=("threads",))
    print(f"\nreal 2 threads -> 1 thread ({first}): {summary_line(fewer)}")
    for row in fewer.rows:
        ch = row["latency_change"]
        print(f"  {row['model']} {row['backend']}: {row['verdict']} ({_pct(ch['rel']) if ch else row['why']})")

    checks = {
        "pure noise: at most 2 of the pairs flagged": outcome[0.0].get("regression", 0) <= 2,
        "10% slowdowns: at least 95% flagged": outcome[0.10].get("regression", 0) >= 0.95 * args.pairs,
        "real repeat runs: no regression": repeat.counts["regression"] == 0,
        "real 1 thread vs 2 threads: flagged": fewer.counts["regression"] > 0,
    }
    print()
    for what, ok in checks.items():
        print(f"{'PASS' if ok else 'FAIL'}: {what}")
    (out / "detector.json").write_text(json.dumps({
        "runs": [str(first), str(second)], "threshold": threshold, "pairs": args.pairs,
        "process_sd": {f"{b} t{t}": sd for (b, t), sd in spread.items()},
        "process_sd_adjusted": {f"t{t}": sd for t, sd in adjusted.items()},
        "synthetic": {str(k): v for k, v in outcome.items()},
        "synthetic_flagged_by_threads": {str(k): {str(t): list(c) for t, c in v.items()}
                                         for k, v in by_threads.items()},
        "repeat": repeat.counts, "real_slowed": {str(k): v for k, v in real_slowed.items()},
        "threads": fewer.counts, "checks": checks}, indent=1))
    (out / "repeat.md").write_text(to_markdown(repeat))
    (out / "threads.md").write_text(to_markdown(fewer))
    return 0 if all(checks.values()) else 1


def _pct(x):
    return f"{100 * x:+.1f}%"


if __name__ == "__main__":
    sys.exit(main())
