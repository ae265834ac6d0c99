"""Is aio's quick tuning (the default) as good a choice as its thorough one?

For each model, aio tunes twice on an empty cache of its own: `--tune quick` and `--tune thorough` (the wall
time of each first run is the time to a first answer). Then the two decisions are measured against each other
in one interleaved run: two processes, each running the cached decision of one cache (with the race and the
switching a later run does), take one-second turns, so drift hits both alike. This is done twice, with the quick
process started first and last (two processes of one engine differ by a percent or two by which was prepared
first), and the verdict follows benchmarks/aio_vs_baselines.py's noise rule: PASS when quick's combined median
is at most thorough's, or slower only within noise (no more than half the spread between the two orders' ratios,
or the 95% confidence intervals of the two medians overlapping in both orders); UNSTABLE when the two orders'
ratios disagree by more than 10%.

    python benchmarks/quick_vs_thorough.py [--models resnet_50_v1,mobilenet_v2,vit_b_16,bert_base,distilbert_base,
        efficientnet_b0] [--threads 2] [--timeout 10] [--output results/quick_vs_thorough]
"""

import argparse
import json
import math
import os
import random
import subprocess
import sys
import time
from pathlib import Path

from aio_vs_baselines import _geomean, _ms, verdict

from aio_examples.drivers.turns import Taker
from aio_examples.drivers.worker import run_argv
from aio_examples.measurement.timing import ORDER_SEED, ROUND_GAP_S, ROUND_S

MODES = ("quick", "thorough")
SIX = "resnet_50_v1,mobilenet_v2,vit_b_16,bert_base,distilbert_base,efficientnet_b0"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default=SIX)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--timeout", type=float, default=10.0, help="measured seconds per decision in each order")
    ap.add_argument("--output", default="results/quick_vs_thorough")
    args = ap.parse_args()
    out = Path(args.output).absolute()
    rows = []
    for model in args.models.split(","):
        caches = {mode: out / model / f"cache-{mode}" for mode in MODES}
        tuned = {mode: _tune(model, mode, caches[mode], args, out / model / f"tune-{mode}") for mode in MODES}
        runs = [_pair(model, caches, order, args, out / model / f"{order[0]}-first") for order in (MODES, MODES[::-1])]
        row = _compare(model, tuned, runs)
        rows.append(row)
        print(_line(row), flush=True)
    print("\n| model | quick: first answer, tuning, choice | thorough: first answer, tuning, choice | "
          "quick ms | thorough ms | quick / thorough (quick first, last) | verdict |")
    print("|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['model']} | {_tuned(r['quick'])} | {_tuned(r['thorough'])} | {_ms(r['quick_ms'])} | "
              f"{_ms(r['thorough_ms'])} | {_ratio(r)} ({r['orders']}) | {r['verdict']} |")
    verdicts = [r["verdict"].split(" ")[0] for r in rows]
    print(f"\n{verdicts.count('PASS')} PASS, {verdicts.count('FAIL')} FAIL, {verdicts.count('UNSTABLE')} UNSTABLE "
          f"of {len(rows)} models")
    return 0 if verdicts.count("PASS") == len(rows) else 1


def _tune(model: str, mode: str, cache: Path, args, folder: Path) -> dict:
    """aio's first run on an empty cache in `mode`: its wall time, tuning time and choice."""
    folder.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "AIO_CACHE_DIR": str(cache)}
    start = time.perf_counter()
    subprocess.run([sys.executable, "-m", "aio_examples", "run", model, "--backend", "aio", "--tune", mode, "-t",
                    str(args.threads), "--timeout", "5", "--output", str(folder)], env=env, check=False)
    wall = time.perf_counter() - start
    records = _records(folder)
    r = records[-1] if records else {}
    tuning = (r.get("backend_info") or {}).get("tuning") or {}
    return {"wall_s": wall, "tuning_s": tuning.get("tuning_s"), "strategy": r.get("strategy"),
            "status": r.get("status"), "saved": "not_saved" not in tuning}


def _pair(model: str, caches: dict, order: tuple, args, folder: Path) -> dict:
    """The two cached decisions in two processes taking turns (started in `order`): mode -> record."""
    folder.mkdir(parents=True, exist_ok=True)
    takers = []
    for mode in order:
        argv = run_argv(model, {}, backend="aio", precision="fp32", threads=args.threads, timeout=args.timeout,
                        output=folder / mode)
        env = {**os.environ, "AIO_CACHE_DIR": str(caches[mode]), "AIO_TUNE": mode}
        taker = Taker.spawn(argv, env, None, math.ceil(args.timeout / ROUND_S), context=mode)
        if taker.wait_ready(1800):
            takers.append(taker)
        else:
            taker.stop(60)
    order_ = random.Random(ORDER_SEED)
    while waiting := [t for t in takers if t.alive and t.turns_left > 0]:
        order_.shuffle(waiting)
        for t in waiting:
            time.sleep(ROUND_GAP_S)
            t.turn(600)
    for t in takers:
        t.stop(600)
    return {mode: (_records(folder / mode) or [None])[-1] for mode in order}


def _records(folder: Path) -> list[dict]:
    path = folder / "results.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def _compare(model: str, tuned: dict, runs: list[dict]) -> dict:
    row = {"model": model, **tuned, "quick_ms": None, "thorough_ms": None, "orders": "-", "verdict": "FAIL"}
    pairs = [(run.get("quick"), run.get("thorough")) for run in runs]
    if not all(q and t and q["status"] == "ok" and t["status"] == "ok" for q, t in pairs):
        row["verdict"] = "FAIL (a decision did not run: " + "; ".join(
            f"{m} {(r or {}).get('status')}: {(r or {}).get('reason')}" for q, t in pairs for m, r in
            (("quick", q), ("thorough", t)) if not r or r["status"] != "ok") + ")"
        return row
    row["quick_ms"] = _geomean([q["latency_ms"]["median"] for q, _ in pairs])
    row["thorough_ms"] = _geomean([t["latency_ms"]["median"] for _, t in pairs])
    row["strategies"] = [(q.get("strategy"), t.get("strategy")) for q, t in pairs]
    row["orders"] = ", ".join(f"{q['latency_ms']['median'] / t['latency_ms']['median']:.3f}" for q, t in pairs)
    row["verdict"] = verdict(pairs, row["quick_ms"] / row["thorough_ms"])
    return row


def _tuned(t: dict) -> str:
    saved = "" if t["saved"] else ", not saved"
    return f"{t['wall_s']:.0f} s, {t['tuning_s'] or 0:.0f} s, {t['strategy']}{saved}"


def _ratio(row) -> str:
    return f"{row['quick_ms'] / row['thorough_ms']:.3f}" if row["quick_ms"] and row["thorough_ms"] else "-"


def _line(row) -> str:
    return (f"{row['model']}: quick {_tuned(row['quick'])} -> {_ms(row['quick_ms'])}; thorough "
            f"{_tuned(row['thorough'])} -> {_ms(row['thorough_ms'])}; ratio {_ratio(row)} ({row['orders']}): "
            f"{row['verdict']}")


if __name__ == "__main__":
    sys.exit(main())
