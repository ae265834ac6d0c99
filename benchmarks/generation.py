"""Generation on the torch paths and the LLM engines: TTFT, TPOT and decode tokens/s per precision.

Each precision is measured in its own run (a 1B model's copies at four precisions would not all fit in
memory at once), its backends in interleaved rounds beside eager fp32. It prints one row per configuration
and, per precision, the decode speed of aio's own PyTorch path (`aio_torch`; `aio` too when asked for) over
the fastest other path's and the fastest LLM engine's, its whole-pass speed (aio tunes on whole passes), and
the share of the memory-bandwidth roofline each decode reached.

When a precision's configurations do not fit in memory together, the runner measures them in groups one
after another, and ratios across groups carry the machine's drift. Then `aio_torch` is measured again beside
each engine it did not share rounds with, the two in interleaved rounds in one process (no eager fp32
configuration beside them, which is what lets two full-size copies fit), and those ratios are printed too
(`--no-pairs` skips this):

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


def measure_pair(args, precision: str, engine: str, out: Path) -> None:
    """aio_torch and `engine` in interleaved rounds in one process of its own (this script's `--pair`)."""
    run = [sys.executable, __file__, "--pair", f"{precision}:{engine}", "--model", args.model, "-b", str(args.batch_size),
           "--threads", str(args.threads), "--seq-len", str(args.seq_len), "--new-tokens", str(args.new_tokens),
           "--timeout", str(args.timeout), "--output", str(out)]
    for item in args.config_override or []:
        run += ["--config-override", item]
    subprocess.run(run, check=True)


def pair(args, precision: str, engine: str, out: Path) -> None:
    from aio_examples.machine.threads import ThreadChoice
    from aio_examples.measurement.runner import RunRequest, run
    from aio_examples.measurement.timing import StopRule
    from aio_examples.models import get_model

    spec = get_model(args.model).with_config(args.config_override)
    out.mkdir(parents=True, exist_ok=True)
    run(RunRequest(spec, [engine, "aio_torch"], [precision], args.batch_size, ThreadChoice(args.threads, "--threads"),
                   spec.shape(seq_len=args.seq_len, new_tokens=args.new_tokens),
                   rule=StopRule(timeout_s=args.timeout)), out, reference=False)


def unpaired(out: Path) -> list[tuple[str, str]]:
    """(precision, engine) whose ok records did not share rounds with aio_torch's in the main runs."""
    from aio_examples.core.records import load_records

    records = [r for r in load_records(out) if r.status == "ok"]
    ours = {r.precision: set((r.scenario.get("rounds") or {}).get("with") or [])
            for r in records if r.backend == "aio_torch"}
    # once each, though the folder may hold several runs
    return list(dict.fromkeys((r.precision, r.backend) for r in records if r.backend in ENGINES
                              and r.precision in ours and f"{r.backend}/{r.precision}" not in ours[r.precision]))


def pairs_table(out: Path) -> list[str]:
    from aio_examples.core.records import load_records

    by_run: dict = {}
    for r in load_records(out):
        gen = r.metrics.get("generation") or {}
        if r.status == "ok" and gen:
            by_run.setdefault(r.run_id, {})[r.backend] = (r.precision, gen["decode_tokens_per_s"],
                                                           100 * gen.get("roofline_share", float("nan")))
    lines = []
    for found in by_run.values():
        mine = found.pop("aio_torch", None)
        for engine, (precision, tokens, share) in found.items():
            if mine:
                lines.append(f"{precision}: aio_torch decodes at {mine[1] / tokens:.2f}x {engine} in interleaved "
                             f"rounds ({mine[1]:.2f} against {tokens:.2f} tokens/s, {mine[2]:.0f}% and {share:.0f}% "
                             "of the roofline)")
    return lines


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
                             f"the fastest other path ({best.backend}, {best['mode']}), in the same run (in groups "
                             "one after another if the runner said so)")
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
    parser.add_argument("--no-pairs", action="store_true", help="skip measuring aio_torch again beside each engine "
                        "it did not share rounds with")
    parser.add_argument("--pair", help=argparse.SUPPRESS)       # PRECISION:ENGINE, in a process of its own
    args = parser.parse_args()
    out = Path(args.output)
    if args.pair:
        precision, engine = args.pair.split(":")
        pair(args, precision, engine, out)
        return 0
    for precision in args.precisions.split(","):
        measure(args, precision, out)
    todo = [] if args.no_pairs else unpaired(out)
    for precision, engine in todo:
        measure_pair(args, precision, engine, out / "pairs")
    print(table(out))
    if todo:
        print("\n".join(["", *pairs_table(out / "pairs")]))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
