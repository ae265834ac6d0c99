"""Generation: a prompt prefilled, then exactly `new_tokens` tokens decoded greedily, timed token by token.

Configurations are driven in interleaved rounds like the latency scenario; each pass is one whole
generation, and the pass itself stamps every token (models/nlp.py: GreedyGeneration), so the per-token
figures come from the loop, not from wall time divided by tokens. A record gets `metrics.generation`:

- `ttft_ms`: time to first token (the prompt's prefill, with Whisper's encoder), per pass;
- `itl_ms`: inter-token latency, every gap between two decoded tokens of every pass;
- `tpot_ms`: time per output token after the first, per pass ((end to end - TTFT) / (new tokens - 1));
- `e2e_ms`: the whole generation, per pass;
- `prompt_tokens`: the prompt's length (`--seq-len`; Whisper's: its 4 start-of-transcript tokens);
- prefill and decode tokens/s (batch x prompt / TTFT, batch / TPOT, at the medians), the KV-cache bytes,
  the bytes of weights a decode step reads and, with the machine's memory bandwidth, the share of that
  roofline the decode reached;
- `recompilations`: graphs compiled during measured passes. Warm-up generates with the exact shapes first,
  so any compilation there is a bug of the path (a dynamic shape): the configuration fails.
"""

from ..stats import summarize
from ..timing import measure
from .base import Scenario


def _percentiles(values_ns) -> dict:
    s = summarize([v / 1e6 for v in values_ns])
    return {"p50": s.median, "p90": s.p90, "p99": s.p99, "mean": s.mean, "n": s.n}


class GenerationScenario(Scenario):
    name = "generation"
    key = "generation"

    def measure(self, measurements, on_error, probe, timeout_s):
        measure(measurements, on_error=on_error, probe=probe)

    def annotate(self, result, measurement, task_size):
        extra = measurement.extra_ns           # taken here, so the runner does not summarise them again
        ttft, itl, compiles = extra.pop("ttft", []), extra.pop("itl", []), extra.pop("compiles", [])
        facts = getattr(measurement.fn, "facts", {}) or {}
        if not ttft:
            return
        shape = result.input_shape
        # the pass's own prompt length (Whisper's shape has none: its prompt is the start-of-transcript tokens)
        batch, prompt, new = shape["batch_size"], facts.get("prompt_tokens", shape.get("seq_len")), shape["new_tokens"]
        e2e = measurement.samples_ns
        tpot = [(total - first) / (new - 1) for total, first in zip(e2e, ttft, strict=True)] if new > 1 else []
        gen = {"prompt_tokens": prompt, "new_tokens": new, "batch_size": batch,
               "ttft_ms": _percentiles(ttft), "e2e_ms": _percentiles(e2e),
               **({"tpot_ms": _percentiles(tpot), "itl_ms": _percentiles(itl)} if tpot else {}),
               "recompilations": int(sum(compiles)), **facts}
        # the tokens the first token waited for: the prompt, and a text encoder-decoder's source (BART's article)
        gen["prefill_tokens_per_s"] = batch * (prompt + facts.get("source_tokens", 0)) / (gen["ttft_ms"]["p50"] / 1e3)
        if tpot:
            gen["decode_tokens_per_s"] = batch / (gen["tpot_ms"]["p50"] / 1e3)
        _roofline(gen, result.threads)
        result.metrics["generation"] = gen
        result.metrics["ttft_ms"] = {"median": gen["ttft_ms"]["p50"], "p90": gen["ttft_ms"]["p90"],
                                     "n": gen["ttft_ms"]["n"]}
        if gen["recompilations"]:
            result.status = "failed"
            result.reason = (f"{gen['recompilations']} graph(s) compiled during measured passes: the path "
                             "recompiles for shapes its warm-up did not show, so its timings include compilation")


def _roofline(gen: dict, threads: int) -> None:
    """Decode reads every weight once per token: weight bytes x tokens/s against the memory bandwidth."""
    weight_bytes = gen.get("weight_bytes")
    if not weight_bytes or "decode_tokens_per_s" not in gen:
        return
    from ...machine.bandwidth import memory_bandwidth, roofline_share

    bandwidth = memory_bandwidth(threads)       # measured once per machine and thread count, then cached
    if not bandwidth.get("roofline_gb_s"):
        gen["memory_bandwidth_error"] = bandwidth.get("error")
        return
    gen["memory_bandwidth_gb_s"] = bandwidth["roofline_gb_s"]
    # a batch shares one read of the weights, so the roofline counts steps, not tokens
    steps_per_s = gen["decode_tokens_per_s"] / gen["batch_size"]
    gen["roofline_share"] = roofline_share(weight_bytes, steps_per_s, bandwidth["roofline_gb_s"])
