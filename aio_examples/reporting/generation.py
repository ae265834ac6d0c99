"""The report's view of text generation: per-token columns, the table "Generation" and its charts.

Records measured by the generation scenario carry `metrics.generation` (measurement/scenarios/generation.py):
time to first token, time per output token, inter-token latency, prefill and decode tokens/s, the bytes of
weights and KV cache, and the share of the memory-bandwidth roofline the decode reached. Only when some
record has that block do the summary get its columns and the page its section, so other reports keep theirs.

Decode reads every weight once per step, so its bandwidth-bound rate is bandwidth / weight bytes steps/s
(times the batch in tokens/s): the charts draw it beside what each backend x precision reached.
"""

import textwrap
from pathlib import Path

from ..core.paths import safe_name
from ..core.records import KEY_FIELDS, Result
from .plots import default_runtime, plot_decode_lines, plot_decode_roofline

MIB = 2 ** 20
# Summary columns, in order: (column, block field, percentile or scale).
COLUMNS = [("ttft_p50_ms", "ttft_ms", "p50"), ("ttft_p90_ms", "ttft_ms", "p90"), ("tpot_p50_ms", "tpot_ms", "p50"),
           ("tpot_p90_ms", "tpot_ms", "p90"), ("itl_p99_ms", "itl_ms", "p99"),
           ("prefill_tokens_per_s", "prefill_tokens_per_s", 1), ("decode_tokens_per_s", "decode_tokens_per_s", 1),
           ("roofline_share_pct", "roofline_share", 100), ("kv_cache_mib", "kv_cache_bytes", 1 / MIB)]
NAMES = [c for c, _, _ in COLUMNS]
HEADERS = {"ttft_p50_ms": "TTFT p50 (ms)", "ttft_p90_ms": "TTFT p90 (ms)", "tpot_p50_ms": "TPOT p50 (ms)",
           "tpot_p90_ms": "TPOT p90 (ms)", "itl_p99_ms": "ITL p99 (ms)", "prefill_tokens_per_s": "prefill tokens/s",
           "decode_tokens_per_s": "decode tokens/s", "roofline_share_pct": "roofline share", "kv_cache_mib": "KV cache (MiB)"}


def _value(block: dict, field: str, part):
    v = block.get(field)
    if isinstance(part, str):
        v = (v or {}).get(part) if isinstance(v, dict) else None
    elif v is not None:
        v = v * part
    return v if isinstance(v, (int, float)) and not isinstance(v, bool) else None


def summary_columns(blocks) -> dict:
    """{column: values} of the generation blocks (None for a record without one); nothing at all when no
    record has one."""
    blocks = [b if isinstance(b, dict) else {} for b in blocks]
    if not any(blocks):
        return {}
    return {name: [_value(b, field, part) for b in blocks] for name, field, part in COLUMNS}


def block_of(r: Result) -> dict | None:
    gen = (r.metrics or {}).get("generation")
    return gen if isinstance(gen, dict) else None


def frame(records):
    """One row per generation configuration (the latest record wins, as in the summary): its key, status,
    precision mode, prompt and new tokens, config overrides, the summary's columns and the bandwidth-bound
    decode tokens/s (`bound_tokens_per_s`, when the record has the weight bytes and the bandwidth)."""
    import pandas as pd

    rows = []
    for r in records:
        if r.is_instance:
            continue
        gen = block_of(r) or {}
        config = ", ".join(f"{k[len('config.'):]}={v}" for k, v in sorted((r.input_shape or {}).items())
                           if k.startswith("config."))
        weight, bandwidth = gen.get("weight_bytes"), gen.get("memory_bandwidth_gb_s")
        batch = gen.get("batch_size") or r.batch_size
        rows.append({**r.key()._asdict(), "status": r.status, "timestamp": r.timestamp, "reason": r.reason or "",
                     "precision_mode": r.precision_mode or "", "has_block": bool(gen),
                     "prompt_tokens": gen.get("prompt_tokens", (r.input_shape or {}).get("seq_len")),
                     "new_tokens": gen.get("new_tokens", (r.input_shape or {}).get("new_tokens")), "config": config,
                     "weight_mib": weight / MIB if weight else None,
                     "bound_tokens_per_s": bandwidth * 1e9 / weight * batch if weight and bandwidth else None,
                     **{name: _value(gen, field, part) for name, field, part in COLUMNS}})
    if not rows:
        return pd.DataFrame()
    df = pd.DataFrame(rows).sort_values("timestamp", kind="stable").drop_duplicates(list(KEY_FIELDS), keep="last")
    df = df[df.has_block].drop(columns="has_block")
    df = df.astype({"prompt_tokens": "Int64", "new_tokens": "Int64"})     # whole numbers, even beside other rows
    return df.sort_values(["model", "prompt_tokens", "new_tokens", "batch_size", "threads", "backend",
                           "precision"]).reset_index(drop=True)


def _setting(rows) -> dict | None:
    """Where a model's generation charts compare: one instance, the default runtime, the first machine, the
    smallest batch and the most threads measured."""
    ok = rows[(rows.status == "ok") & (rows.instances == 1) & default_runtime(rows)]
    ok = ok[ok.decode_tokens_per_s.notna()]
    if ok.empty:
        return None
    ok = ok[ok.machine == min(ok.machine.unique())]
    return {"rows": ok, "batch": int(ok.batch_size.min()), "threads": int(ok.threads.max())}


def _varying(rows, columns) -> list[str]:
    return [c for c in columns if rows[c].nunique(dropna=False) > 1]


def plots(gen, model: str, folder: Path) -> dict:
    """{name: path} of `model`'s generation charts: decode tokens/s per backend x precision against the roofline
    (one chart per prompt, new tokens and config, at the smallest batch and the most threads), and, when a
    sweep varied them, decode tokens/s against the prompt length and against the batch size."""
    if gen is None or gen.empty:
        return {}
    setting = _setting(gen[gen.model == model])
    if setting is None:
        return {}
    ok, batch, threads = setting["rows"], setting["batch"], setting["threads"]
    out = {}
    at = ok[(ok.batch_size == batch) & (ok.threads == threads)]
    groups = list(at.groupby(["prompt_tokens", "new_tokens", "config"], dropna=False))
    tokens = [(p, n) for (p, n, _), _ in groups]
    for i, ((prompt, new, config), g) in enumerate(groups):
        several = len(groups) > 1
        suffix = ""
        if several:         # a chart per prompt and new tokens (and per config, numbered, when that varies too)
            suffix = f"-p{prompt}-n{new}" + (f"-{i + 1}" if tokens.count((prompt, new)) > 1 else "")
        title = (f"{model}: decode tokens/s, prompt {prompt}, {new} new tokens, batch {batch}, {threads} thread(s)"
                 + ("\n" + textwrap.fill(f"config {config}", 120) if config else ""))
        path = folder / safe_name(f"{model}-decode{suffix}.png")
        out["decode tokens/s vs roofline" + (f" (prompt {prompt}, {new} new)" if several else "")] = \
            plot_decode_roofline(g, title, path)
    by_prompt = ok[(ok.batch_size == batch) & (ok.threads == threads)]
    if by_prompt.prompt_tokens.nunique() > 1:
        out["decode tokens/s vs prompt length"] = plot_decode_lines(
            by_prompt, "prompt_tokens", ["backend", "precision", *_varying(by_prompt, ["new_tokens", "config"])],
            f"{model}: decode tokens/s vs prompt length, batch {batch}, {threads} thread(s)",
            folder / safe_name(f"{model}-decode-prompt.png"))
    by_batch = ok[ok.threads == threads]
    if by_batch.batch_size.nunique() > 1:
        out["decode tokens/s vs batch size"] = plot_decode_lines(
            by_batch, "batch_size",
            ["backend", "precision", *_varying(by_batch, ["prompt_tokens", "new_tokens", "config"])],
            f"{model}: decode tokens/s vs batch size, {threads} thread(s)",
            folder / safe_name(f"{model}-decode-batch.png"))
    return out


def fmt(df):
    """The generation columns of a frame as the Markdown and HTML show them (ms and tokens/s to two decimals,
    the roofline share in percent with one)."""
    import pandas as pd

    shown = df.copy()
    for name in NAMES:
        if name not in shown:
            continue
        spec = "{:.1f}%" if name == "roofline_share_pct" else "{:.3f}" if name == "kv_cache_mib" else "{:.2f}"
        shown[name] = shown[name].map(lambda v, s=spec: "" if pd.isna(v) else s.format(v))
    return shown


def table(gen) -> str:
    """The table "Generation" (HTML): one row per configuration with generation metrics."""
    import pandas as pd

    shown = fmt(gen)
    shown["precision"] = [p if not m or m == p else f"{p} ({m})" for p, m in zip(gen.precision, gen.precision_mode)]
    shown["roofline tokens/s"] = gen.bound_tokens_per_s.map(lambda v: "" if pd.isna(v) else f"{v:.0f}")
    shown["weights (MiB)"] = gen.weight_mib.map(lambda v: "" if pd.isna(v) else f"{v:.2f}")
    columns = ["model", "backend", "precision", "batch_size", "threads", "prompt_tokens", "new_tokens", "status",
               *NAMES, "roofline tokens/s", "weights (MiB)"]
    if gen.config.astype(bool).any():
        columns.insert(7, "config")
    return shown[columns].rename(columns={**HEADERS, "batch_size": "batch", "prompt_tokens": "prompt",
                                          "new_tokens": "new tokens"}).to_html(index=False)


INTRO = ("<p>Text generation, token by token: time to first token (TTFT: the prompt's prefill), time per output "
         "token after it (TPOT) and the gaps between tokens (ITL), as percentiles over the measured generations; "
         "prefill and decode tokens/s at the medians; the KV cache. Decode reads every weight once per step, so "
         "memory bandwidth / weight bytes is the most steps per second it can make: the roofline share is how "
         "much of that it reached, and roofline tokens/s that limit in tokens (times the batch). Each model's "
         "charts under Per model plot decode tokens/s per backend x precision against it.</p>")
