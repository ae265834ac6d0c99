"""Generation on the torch paths and the LLM engines: TTFT, TPOT and decode tokens/s per precision.

Each precision is measured in its own process (a 1B model's copies at four precisions would not all fit in
memory at once), its backends in interleaved rounds beside eager fp32, so the ratios within a precision are
from one run. It prints one row per configuration and, per precision, the decode speed of aio's own PyTorch
path (`aio_torch`; `aio` too when asked for) over the fastest other path's and the fastest LLM engine's, its
whole-pass speed (aio tunes on whole passes), and the share of the memory-bandwidth roofline each decode
reached:

    python3 benchmarks/generation.py --output results/generation            # llama_3_2_1b, 512 + 128, 2 threads
    python3 benchmarks/generation.py --config-override num_hidden_layers=2   # a quick look
"""

import argparse
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

OURS = ("aio", "aio_torch")            # aio, and its own PyTorch path alone (torch.compile(backend="aio"))
ENGINES = ("llama_cpp", "openvino_genai", "onnxruntime_genai")


def measure(args, precision: str, out: Path) -> None:
    run = [sys.executable, "-m", "aio_examples", "run", args.model, "-p", precision, "--backend", args.backends,
           "-b", str(args.batch_size), "-t", str(args.threads), "--seq-len", str(args.seq_len),
           "--new-tokens", str(args.new_tokens), "--timeout", str(args.timeout), "--output", str(out), "--json"]
    for item in args.config_override or []:
        run += ["--config-override", item]
    subprocess.run(run, check=True, stdout=subprocess.DEVNULL)


def table(out: Path) -> str:
    import pandas as pd

    from aio_examples.core.records import load_records

    rows = []
    for r in load_records(out):
        gen = r.metrics.get("generation") or {}
        if r.run_id and r.status == "ok" and gen:
            rows.append({"run": r.run_id, "backend": r.backend, "precision": r.precision, "mode": r.precision_mode,
                         "strategy": r.strategy, "ttft p50 ms": gen["ttft_ms"]["p50"],
                         "ttft p90 ms": gen["ttft_ms"]["p90"], "tpot p50 ms": gen["tpot_ms"]["p50"],
                         "tpot p90 ms": gen["tpot_ms"]["p90"], "pass p50 s": gen["e2e_ms"]["p50"] / 1000,
                         "decode tok/s": gen["decode_tokens_per_s"],
                         "roofline %": 100 * gen.get("roofline_share", float("nan")),
                         "weights MiB": gen["weight_bytes"] / 2**20})
        elif r.status != "ok":
            rows.append({"run": r.run_id, "backend": r.backend, "precision": r.precision, "mode": r.status,
                         "strategy": (r.reason or "")[:60]})
    frame = pd.DataFrame(rows)
    lines = [frame.drop(columns="run").to_markdown(index=False, floatfmt=".2f"), ""]
    for (run, precision), group in frame.dropna(subset=["decode tok/s"]).groupby(["run", "precision"]):
        ours = group[group.backend.isin(OURS)]
        others = group[~group.backend.isin(OURS)]
        engines = group[group.backend.isin(ENGINES)]
        for _, mine in ours.iterrows():
            if len(others):
                best = others.sort_values("decode tok/s").iloc[-1]
                lines.append(f"{precision}: {mine.backend} decodes at {mine['decode tok/s'] / best['decode tok/s']:.2f}x "
                             f"the fastest other path ({best.backend}, {best['mode']}), in the same run")
            if len(engines):
                best = engines.sort_values("decode tok/s").iloc[-1]
                lines.append(f"{precision}: {mine.backend} decodes at {mine['decode tok/s'] / best['decode tok/s']:.2f}x "
                             f"the fastest LLM engine ({best.backend}), {mine['roofline %']:.0f}% of the roofline "
                             f"against its {best['roofline %']:.0f}%")
            if len(others):        # aio tunes on whole passes: a faster prefill can outweigh a slower decode
                passes = others.sort_values("pass p50 s").iloc[0]
                lines.append(f"{precision}: {mine.backend}'s whole pass (prefill and decode) at "
                             f"{passes['pass p50 s'] / mine['pass p50 s']:.2f}x the speed of the fastest other "
                             f"({passes.backend}, {passes['pass p50 s']:.2f} s)")
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="llama_3_2_1b")
    parser.add_argument("--precisions", default="bf16,int8,int4", help="each in its own run, beside eager fp32")
    # the engines first: their conversions write files while the torch paths' copies do not exist yet
    # aio_torch rather than aio: aio may hand generation to an engine, aio_torch is its own PyTorch path
    parser.add_argument("--backends", default="llama_cpp,openvino_genai,onnxruntime_genai,eager,inductor,aio_torch",
                        help="a precision an engine does not run is recorded as unsupported, with the reason")
    parser.add_argument("--seq-len", type=int, default=512)
    parser.add_argument("--new-tokens", type=int, default=128)
    parser.add_argument("-b", "--batch-size", type=int, default=1)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--timeout", type=float, default=120.0, help="measured seconds per configuration")
    parser.add_argument("--config-override", action="append")
    parser.add_argument("--output", default="results/generation")
    args = parser.parse_args()
    out = Path(args.output)
    for precision in args.precisions.split(","):
        measure(args, precision, out)
    print(table(out))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
