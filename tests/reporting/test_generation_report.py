"""Reports of text generation: per-token columns, the table "Generation" and the decode charts, from fixed
records whose figures are known; a report without generation records keeps its columns and has none of it."""

import pandas as pd
import pytest

from aio_examples.core import records as res
from aio_examples.reporting import generation
from aio_examples.reporting.report import COLUMNS, build_report, summary_frame

BOX = {"hostname": "box", "allocator": "default", "cpu_model": "Test CPU", "arch": "x86_64", "logical_cpus": 2}
MODES = {"fp32": "native", "bf16": "cast", "int8": "w8a16", "int4": "w4a16-g128"}
WEIGHTS = {"fp32": 400 * 2 ** 20, "bf16": 200 * 2 ** 20, "int8": 100 * 2 ** 20, "int4": 50 * 2 ** 20}
BANDWIDTH = 40.0        # GB/s


def percentiles(p50):
    return {"p50": p50, "p90": 1.5 * p50, "p99": 2 * p50, "mean": 1.1 * p50, "n": 20}


def gen_record(backend, precision, tpot_ms, prompt=128, batch=1, new=16, status="ok", model="llm", bandwidth=True):
    """A generation record: decode tokens/s = batch / TPOT, its roofline share from the weights and BANDWIDTH."""
    decode = batch / (tpot_ms / 1e3)
    block = {"prompt_tokens": prompt, "new_tokens": new, "batch_size": batch, "ttft_ms": percentiles(prompt / 10),
             "e2e_ms": percentiles(prompt / 10 + tpot_ms * (new - 1)), "tpot_ms": percentiles(tpot_ms),
             "itl_ms": percentiles(tpot_ms * 0.9), "recompilations": 0, "weight_bytes": WEIGHTS[precision],
             "kv_cache_bytes": 2 * 2 ** 20 * batch * (prompt + new) // 144,
             "prefill_tokens_per_s": batch * prompt / (prompt / 10 / 1e3), "decode_tokens_per_s": decode}
    if bandwidth:
        block["memory_bandwidth_gb_s"] = BANDWIDTH
        block["roofline_share"] = WEIGHTS[precision] * decode / batch / (BANDWIDTH * 1e9)
    e2e = block["e2e_ms"]["p50"]
    return res.Result(model=model, task="text-generation", backend=backend, precision=precision, batch_size=batch,
                      threads=2, status=status, reason=None if status == "ok" else "2 graph(s) compiled",
                      input_shape={"batch_size": batch, "seq_len": prompt, "new_tokens": new,
                                   "config.num_hidden_layers": 2},
                      precision_mode=MODES[precision], scenario={"name": "generation", "key": "generation"},
                      latency_ms={"median": e2e, "p90": 1.5 * e2e, "p99": 2 * e2e},
                      throughput={"value": batch * new / (e2e / 1e3), "unit": "tokens/s"},
                      metrics={"generation": block, "ttft_ms": {"median": prompt / 10}}, env=dict(BOX)).to_dict()


def other(median=10.0):
    """A model measured in latency rounds: no generation block."""
    return res.Result(model="cnn", task="image-classification", backend="eager", precision="fp32", batch_size=1,
                      threads=2, input_shape={"batch_size": 1, "input_size": 64},
                      latency_ms={"median": median, "p90": median, "p99": median},
                      throughput={"value": 100.0, "unit": "images/s"}, env=dict(BOX)).to_dict()


def write_records(folder, rows):
    folder.mkdir()
    for row in rows:
        res.append(folder, res.Result.from_dict(row))
    return folder


SWEPT = [gen_record(b, p, tpot * (1 + prompt / 1024) / batch ** 0.5, prompt=prompt, batch=batch)
         for b, tpot in (("eager", 20.0), ("inductor", 8.0)) for p in ("bf16", "int4")
         for prompt in (128, 1024) for batch in (1, 4)]


def test_generation_records_get_their_columns_beside_the_throughput_with_the_recorded_figures():
    df = summary_frame([gen_record("eager", "fp32", 25.0), gen_record("eager", "int4", 10.0), other()], peaks={})
    at = list(df.columns).index("unit") + 1
    assert list(df.columns[at:at + len(generation.NAMES)]) == generation.NAMES
    assert [c for c in df.columns if c not in generation.NAMES] == COLUMNS        # the rest as before
    int4 = df[(df.model == "llm") & (df.precision == "int4")].iloc[0]
    assert (int4.ttft_p50_ms, int4.ttft_p90_ms, int4.tpot_p50_ms, int4.tpot_p90_ms) == (12.8, 12.8 * 1.5, 10.0, 15.0)
    assert int4.itl_p99_ms == pytest.approx(18.0) and int4.decode_tokens_per_s == pytest.approx(100.0)
    assert int4.prefill_tokens_per_s == pytest.approx(10_000.0)
    # 50 MiB read per token at 100 tokens/s against 40 GB/s
    assert int4.roofline_share_pct == pytest.approx(100 * 50 * 2 ** 20 * 100 / 40e9)
    assert int4.kv_cache_mib == 2.0                                              # 2 MiB at 128 + 16 tokens
    cnn = df[df.model == "cnn"].iloc[0]
    assert all(pd.isna(cnn[c]) for c in generation.NAMES)


def test_a_report_of_generation_records_has_the_section_its_columns_and_the_decode_charts(tmp_path):
    failed = gen_record("inductor", "int8", 1.0, status="failed")               # recompiled: listed, never plotted
    written = build_report([write_records(tmp_path / "run", [*SWEPT, failed, other()])], tmp_path / "report")
    csv = pd.read_csv(written["csv"])
    assert set(generation.NAMES) <= set(csv.columns)
    md = (tmp_path / "report" / "summary.md").read_text()
    assert "| decode_tokens_per_s " in md and "| 2.000 " in md          # as formatted: KV-cache MiB, three decimals
    page = written["html"].read_text()
    section = page.split("id='generation'>Generation</h2>")[1].split("<h2")[0]
    assert "TTFT p50 (ms)" in section and "roofline share" in section and "int4 (w4a16-g128)" in section
    assert "failed" in section                                                    # with its status
    # the bandwidth-bound decode rate: 40 GB/s / 50 MiB per step, times the batch of 4
    assert f"<td>{40e9 / (50 * 2 ** 20) * 4:.0f}</td>" in section
    plots = tmp_path / "report" / "plots"
    for name in ("llm-decode-p128-n16.png", "llm-decode-p1024-n16.png", "llm-decode-prompt.png",
                 "llm-decode-batch.png"):
        assert (plots / name).stat().st_size > 1000, name
    for alt in ("decode tokens/s vs roofline (prompt 128, 16 new)", "decode tokens/s vs prompt length",
                "decode tokens/s vs batch size"):
        assert f'alt="llm: {alt}"' in page
    models = page.split("id='models'>Per model</h2>")[1]
    cnn_table = models.split("<h3>cnn</h3>")[1].split("<h3>")[0]
    assert "ttft_p50_ms" not in cnn_table and "ttft_p50_ms" in models.split("<h3>llm</h3>")[1]


def test_decode_charts_need_something_to_compare_and_a_roofline_is_drawn_only_where_known(tmp_path):
    gen = generation.frame([res.Result.from_dict(r) for r in (gen_record("eager", "bf16", 20.0, bandwidth=False),
                                                               gen_record("eager", "int4", 10.0))])
    assert pd.isna(gen.bound_tokens_per_s[0]) and gen.bound_tokens_per_s[1] == pytest.approx(40e9 / (50 * 2 ** 20))
    charts = generation.plots(gen, "llm", tmp_path)
    assert list(charts) == ["decode tokens/s vs roofline"]        # one prompt, one batch: no line charts
    assert charts["decode tokens/s vs roofline"] == tmp_path / "llm-decode.png"
    assert generation.plots(gen, "nothing", tmp_path) == {}


def test_without_generation_records_the_report_has_no_generation_columns_section_or_charts(tmp_path):
    rows = [other(10.0), other(12.0)]
    assert list(summary_frame(rows, peaks={}).columns) == COLUMNS
    written = build_report([write_records(tmp_path / "run", rows)], tmp_path / "report")
    assert list(pd.read_csv(written["csv"]).columns) == COLUMNS
    assert "id='generation'" not in written["html"].read_text()
    assert not list((tmp_path / "report" / "plots").glob("*decode*"))
