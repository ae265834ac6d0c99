"""How often the nightly comparison cries wolf, and how often it catches a real slowdown, on this machine.

    python benchmarks/regression_detector.py                     # runs the quick zoo sweep twice, then judges
    python benchmarks/regression_detector.py --runs A B          # two existing runs of the same sweep

The runs are of the quick zoo sweep (sweeps/quick.toml), or any sweep given twice; with sweep repeats a
configuration has several processes per run.
1. Noise model from the two real runs: each configuration's passes (as measured, in order) and how much a
   process's median moves around its configuration's (robust sd over all configurations).
2. Synthetic pairs built from that noise: every process of either side is block-resampled from a real
   process's passes of that configuration (blocks keep the drift within a process) and moved by its own
   process-level shift, and the new side is slowed down by 0%, 3%, 5%, 10% or 20%. Every pair is judged
   by aio_examples.compare like a real one.
3. The real runs: the second against the first (nothing changed: no regression may be flagged), and the
   1-thread points against the 2-thread points of the same run (a real slowdown: must be flagged).

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

from aio_examples import compare as cmp
from aio_examples.stats import summarize

SLOWDOWNS = (0.0, 0.03, 0.05, 0.10, 0.20)
BLOCK = 10
CONFIDENCE_TARGET = 0.01        # the runner's default: CI of the median within +-1%


def sweep(out: Path):
    subprocess.run([sys.executable, "-m", "aio_examples", "sweep", "--config", str(ROOT / "sweeps" / "quick.toml"),
                    "--output", str(out), "--quiet"], cwd=ROOT, check=True)


def noise_model(a: cmp.Run, b: cmp.Run):
    """Per configuration: its processes' passes (relative to their median), its typical median and how many
    processes a side has; the spread of a process's median around its configuration's (sd, robust); and
    the run-to-run changes of the configurations' medians."""
    ca, cb = a.configurations(), b.configurations()
    configs, deviations, shifts = [], [], []
    for key in ca.keys() & cb.keys():
        ea, eb = ca[key], cb[key]
        groups = ea["groups"] + eb["groups"]
        if ea["record"]["status"] != "ok" or eb["record"]["status"] != "ok" or min(g.size for g in groups) < 20:
            continue
        logs = np.log([np.median(g) for g in groups])
        deviations.extend(logs - logs.mean())
        shifts.append(np.log(eb["median_ms"] / ea["median_ms"]))
        configs.append((key, [g / np.median(g) for g in groups], float(np.exp(logs.mean())), len(ea["groups"])))
    k = len(configs[0][1]) if configs else 2
    # Deviations from the mean of k values have variance sd^2 (k-1)/k; MAD keeps an odd process from ruling.
    process_sd = 1.4826 * np.median(np.abs(deviations)) * np.sqrt(k / max(k - 1, 1))
    return configs, float(process_sd), np.array(shifts)


def block_resample(rng, seq: np.ndarray) -> np.ndarray:
    n = seq.size
    starts = rng.integers(0, max(1, n - BLOCK + 1), size=n // BLOCK + 1)
    return np.concatenate([seq[s:s + BLOCK] for s in starts])[:n]


def synthetic_record(key, samples) -> dict:
    model, backend, precision, batch, threads, instances, _alloc, _shape, _machine = key
    s = summarize(samples)
    return {"model": model, "backend": backend, "precision": precision, "batch_size": batch, "threads": threads,
            "instances": instances, "status": "ok", "samples_ms": samples.tolist(), "latency_ms": s.to_dict(),
            "throughput": {"value": 1000.0 * batch / s.mean, "unit": "units/s"},
            "confidence_met": bool(s.ci_rel_halfwidth <= CONFIDENCE_TARGET)}


def synthetic_side(rng, key, sequences, median, processes, process_sd, factor=1.0) -> list[dict]:
    """One run of a configuration: `processes` records, each a real pass sequence (block-resampled) moved by
    its own process-level shift."""
    return [synthetic_record(key, median * factor * np.exp(rng.normal(0, process_sd))
                             * block_resample(rng, sequences[rng.integers(len(sequences))]))
            for _ in range(processes)]


def synthetic(configs, process_sd, pairs, threshold, seed=20261121):
    rng = np.random.default_rng(seed)
    outcome = {}
    for slowdown in SLOWDOWNS:
        verdicts = Counter()
        for _ in range(pairs):
            key, sequences, median, processes = configs[rng.integers(len(configs))]
            base = synthetic_side(rng, key, sequences, median, processes, process_sd)
            new = synthetic_side(rng, key, sequences, median, processes, process_sd, 1 + slowdown)
            c = cmp.compare(cmp.Run("base", base), cmp.Run("new", new), threshold)
            verdicts[c.rows[0]["verdict"]] += 1
        outcome[slowdown] = dict(verdicts)
    return outcome


def split_threads(run: cmp.Run, threads: int) -> cmp.Run:
    return cmp.Run(f"{run.label} (threads {threads})", [r for r in run.records if r["threads"] == threads])


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--runs", nargs=2, metavar=("FIRST", "SECOND"), help="two runs of the same sweep (default: run "
                   "the quick zoo sweep twice into --output)")
    p.add_argument("--output", default="results/regression-detector", help="where to write runs and the verdict")
    p.add_argument("--pairs", type=int, default=200)
    p.add_argument("--threshold", default="5%")
    args = p.parse_args()
    threshold = cmp.parse_threshold(args.threshold)
    out = Path(args.output)
    out.mkdir(parents=True, exist_ok=True)
    if args.runs:
        first, second = map(Path, args.runs)
    else:
        first, second = out / "run1", out / "run2"
        for run in (first, second):
            sweep(run)
    a, b = cmp.load_run(first), cmp.load_run(second)

    configs, process_sd, shifts = noise_model(a, b)
    print(f"noise model: {len(configs)} configurations with >= 20 passes in every process, "
          f"{configs[0][3]} process(es) per configuration and run; a process's median moves by {100 * process_sd:.2f}% "
          f"(robust sd) around its configuration's; run-to-run change of a configuration: median "
          f"{100 * np.median(shifts):+.2f}%, largest {100 * np.max(np.abs(shifts)):.2f}%")
    outcome = synthetic(configs, process_sd, args.pairs, threshold)
    print(f"\nsynthetic pairs ({args.pairs} per row, threshold {100 * threshold:g}%):\n")
    print("| injected slowdown | regression | suspicious | unchanged | improvement |")
    print("|---|---|---|---|---|")
    for slowdown, v in outcome.items():
        print(f"| {100 * slowdown:g}% | {v.get('regression', 0)} | {v.get('suspicious', 0)} | {v.get('unchanged', 0)} "
              f"| {v.get('improvement', 0)} |")

    repeat = cmp.compare(a, b, threshold)
    print(f"\nreal repeat runs ({first} -> {second}): {cmp.summary_line(repeat)}")
    for row in repeat.rows:
        if row["verdict"] != "unchanged":
            print(f"  {row['model']} {row['backend']} t{row['threads']}: {row['verdict']}: {row['why']}")
    fewer = cmp.compare(split_threads(a, 2), split_threads(a, 1), threshold, ignore=("threads",))
    print(f"\nreal 2 threads -> 1 thread ({first}): {cmp.summary_line(fewer)}")
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
        "runs": [str(first), str(second)], "threshold": threshold, "process_sd": process_sd, "pairs": args.pairs,
        "synthetic": {str(k): v for k, v in outcome.items()}, "repeat": repeat.counts, "threads": fewer.counts,
        "checks": checks}, indent=1))
    (out / "repeat.md").write_text(cmp.to_markdown(repeat))
    (out / "threads.md").write_text(cmp.to_markdown(fewer))
    return 0 if all(checks.values()) else 1


def _pct(x):
    return f"{100 * x:+.1f}%"


if __name__ == "__main__":
    sys.exit(main())
