"""Is the optimized backend at least as fast as the best baseline, at each precision?

For each model and precision, one process measures `aio` and every baseline (torchscript,
inductor, onnxruntime, openvino) in interleaved rounds, so drift hits all alike, and compares
medians. A baseline that cannot run the precision (status unsupported) is left out; a `fail_accuracy`
baseline is left out too (a wrong answer is no target). PASS when aio's median is at most the best
baseline's, or slower only within noise (the 95% confidence intervals of the two medians overlap).

    python benchmarks/aio_vs_baselines.py [--models resnet_50_v1,mobilenet_v2,bert_base,distilbert_base]
        [--precisions fp32,bf16] [--threads 2] [--timeout 30] [--output results/aio_vs_baselines]
"""

import argparse
import json
import subprocess
import sys
from pathlib import Path

BASELINES = ("torchscript", "inductor", "onnxruntime", "openvino")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default="resnet_50_v1,mobilenet_v2,bert_base,distilbert_base")
    ap.add_argument("--precisions", default="fp32,bf16")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--batch-size", type=int, default=1)
    ap.add_argument("--timeout", type=float, default=30.0, help="measured seconds per configuration")
    ap.add_argument("--output", default="results/aio_vs_baselines")
    args = ap.parse_args()

    out = Path(args.output)
    rows, ok = [], True
    for model in args.models.split(","):
        for precision in args.precisions.split(","):
            records = _measure(model, precision, args, out)
            row = _compare(model, precision, records)
            rows.append(row)
            ok &= row["verdict"].startswith("PASS")
            print(_line(row), flush=True)
    print("\n| model | precision | aio (strategy) | best baseline | aio / best | verdict |")
    print("|---|---|---|---|---|---|")
    for row in rows:
        print(f"| {row['model']} | {row['precision']} | {_ms(row['aio'])} ({row['strategy']}) | "
              f"{row['best']} {_ms(row['best_ms'])} | {_ratio(row)} | {row['verdict']} |")
    print("\nall PASS" if ok else "\nsome FAIL")
    return 0 if ok else 1


def _measure(model, precision, args, out) -> list[dict]:
    """One process per model x precision: aio and the baselines measured in interleaved rounds."""
    folder = out / f"{model}-{precision}"
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "results.jsonl"
    start = len(path.read_text().splitlines()) if path.exists() else 0
    cmd = [sys.executable, "-m", "aio_examples", "run", model, "--backend", ",".join(("aio", *BASELINES)),
           "-p", precision, "-t", str(args.threads), "-b", str(args.batch_size), "--timeout", str(args.timeout),
           "--output", str(folder)]
    subprocess.run(cmd, check=False)
    lines = path.read_text().splitlines()[start:] if path.exists() else []
    return [json.loads(line) for line in lines]


def _compare(model, precision, records) -> dict:
    by = {r["backend"]: r for r in records if r["precision"] == precision}
    aio = by.get("aio")
    row = {"model": model, "precision": precision, "aio": None, "strategy": "-", "best": "-", "best_ms": None,
           "verdict": "FAIL"}
    # The verdict can be recomputed from the records: python benchmarks/aio_vs_baselines.py --render-only
    if not aio or aio["status"] != "ok":
        row["strategy"] = f"{aio['status']}: {aio['reason']}" if aio else "missing"
        return row
    row.update(aio=aio["latency_ms"]["median"], strategy=aio.get("strategy"))
    baselines = {b: by[b] for b in BASELINES if b in by and by[b]["status"] == "ok"}
    if not baselines:
        row["verdict"] = "PASS (no baseline runs)"
        return row
    best = min(baselines, key=lambda b: baselines[b]["latency_ms"]["median"])
    best_lat = baselines[best]["latency_ms"]
    row.update(best=best, best_ms=best_lat["median"])
    # Slower by more than noise = the 95% confidence intervals of the two medians do not overlap.
    overlap = aio["latency_ms"]["ci_low"] <= best_lat["ci_high"]
    row["verdict"] = "PASS" if row["aio"] <= best_lat["median"] else "PASS (within noise)" if overlap else "FAIL"
    return row


def _ms(value) -> str:
    return "-" if value is None else f"{value:.2f} ms"


def _ratio(row) -> str:
    return f"{row['aio'] / row['best_ms']:.3f}" if row["aio"] and row["best_ms"] else "-"


def _line(row) -> str:
    return (f"{row['model']} {row['precision']}: aio {_ms(row['aio'])} ({row['strategy']}), best baseline "
            f"{row['best']} {_ms(row['best_ms'])}, ratio {_ratio(row)}: {row['verdict']}")


if __name__ == "__main__":
    sys.exit(main())
