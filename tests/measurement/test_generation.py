"""The generation scenario on a small Llama (`--config-override`): token timestamps, recompilations, bad input."""

import pytest
from conftest import run_cli

from aio_examples.core.errors import UsageError
from aio_examples.machine.threads import ThreadChoice
from aio_examples.measurement.runner import RunRequest, run
from aio_examples.measurement.scenarios import GenerationScenario
from aio_examples.measurement.timing import Measurement, StopRule
from aio_examples.models import get_model

TINY = ["num_hidden_layers=2", "hidden_size=128", "intermediate_size=256", "num_attention_heads=4",
        "num_key_value_heads=2", "head_dim=32", "vocab_size=512"]
SHAPE = {"seq_len": 16, "new_tokens": 6}


def tiny_llama():
    return get_model("llama_3_2_1b").with_config(TINY)


def test_prefill_and_decode_stamps_add_up_to_the_end_to_end_time(tmp_path):
    spec = tiny_llama()
    [r] = run(RunRequest(spec, ["eager"], "fp32", 2, ThreadChoice(1, "--threads"), spec.shape(**SHAPE),
                         rule=StopRule(timeout_s=0.5)), tmp_path)
    assert r.status == "ok" and r.scenario["name"] == "generation"
    gen = r.metrics["generation"]
    n = gen["e2e_ms"]["n"]
    assert gen["ttft_ms"]["n"] == n and gen["itl_ms"]["n"] == n * (SHAPE["new_tokens"] - 1)
    accounted = gen["ttft_ms"]["mean"] + (SHAPE["new_tokens"] - 1) * gen["itl_ms"]["mean"]
    assert accounted == pytest.approx(gen["e2e_ms"]["mean"], rel=0.05)
    assert gen["tpot_ms"]["mean"] == pytest.approx(gen["itl_ms"]["mean"], rel=0.05)
    assert gen["decode_tokens_per_s"] == pytest.approx(2 / (gen["tpot_ms"]["p50"] / 1e3))
    assert gen["prefill_tokens_per_s"] == pytest.approx(2 * 16 / (gen["ttft_ms"]["p50"] / 1e3))
    # the static cache: layers x (keys + values) x batch x kv heads x (prompt + new) x head dim x fp32
    assert gen["kv_cache_bytes"] == 2 * 2 * 2 * 2 * (16 + 6) * 32 * 4
    assert gen["weight_bytes"] > 0 and 0 < gen["roofline_share"] < 2
    assert r.input_shape["config.num_hidden_layers"] == 2 and "config.num_hidden_layers=2" in r.key().shape


def test_inductor_generation_compiles_in_warm_up_only(tmp_path):
    from aio_examples.models.nlp import graphs_compiled

    spec = tiny_llama()
    before = graphs_compiled()
    [r] = run(RunRequest(spec, ["inductor"], "fp32", 1, ThreadChoice(1, "--threads"), spec.shape(**SHAPE),
                         rule=StopRule(timeout_s=0.5)), tmp_path)
    assert r.status == "ok", r.reason
    assert r.metrics["generation"]["recompilations"] == 0
    # one graph, the decode step's (the prefill runs eager), and none more for the teacher-forced output check:
    # each would hold another frozen copy of the weights
    assert graphs_compiled() - before == 1 and r.backend_info["prefill"] == "eager"


def test_a_pass_that_compiles_while_measured_fails_its_configuration():
    spec = tiny_llama()
    from aio_examples.core.records import Result

    r = Result.for_config(spec, "inductor", "fp32", 1, 1, spec.shape(**SHAPE))
    m = Measurement(lambda: None, StopRule())
    m.samples_ns = [10_000_000, 12_000_000]
    m.extra_ns = {"ttft": [4_000_000, 4_000_000], "itl": [1_000_000] * 10, "compiles": [0, 1]}
    GenerationScenario().annotate(r, m, 6)
    assert r.status == "failed" and "1 graph(s) compiled during measured passes" in r.reason


def test_config_overrides_are_checked_against_the_config():
    spec = get_model("llama_3_2_1b")
    assert dict(spec.with_config(["num_hidden_layers=2", "rms_norm_eps=1e-6"]).config_overrides) == {
        "num_hidden_layers": 2, "rms_norm_eps": 1e-6}
    with pytest.raises(UsageError, match="LlamaConfig has no 'num_layers'"):
        spec.with_config(["num_layers=2"])
    with pytest.raises(UsageError, match="num_hidden_layers takes a int"):
        spec.with_config(["num_hidden_layers=two"])
    with pytest.raises(UsageError, match="accepted: KEY=VALUE"):
        spec.with_config(["num_hidden_layers"])
    with pytest.raises(UsageError, match="does not apply to resnet_18"):
        get_model("resnet_18").with_config(["num_hidden_layers=2"])


@pytest.mark.parametrize(("flags", "message"), [
    (["--new-tokens", "0"], "--new-tokens '0' is invalid"),
    (["--seq-len", "131072"], "is too long for llama_3_2_1b; accepted: at most 131072"),
    (["--config-override", "num_layers=2"], "LlamaConfig has no 'num_layers'"),
    (["-b", "4096", "--seq-len", "8192"], "GiB for llama_3_2_1b"),
    # nine configurations' own weights (about 39 GiB with the built model) are refused before building,
    # each named with its share, when all are alive at once in one process (a process each: measured in groups)
    (["-p", "bf16,int8,int4", "--backend", "eager,inductor,aio", "--launcher", "inline"], "inductor/bf16 4.6"),
])
def test_bad_generation_input_is_one_line_and_exit_2(flags, message, tmp_path):
    proc = run_cli(["-m", "aio_examples", "run", "llama_3_2_1b", *flags, "--output", str(tmp_path)], timeout=300)
    assert proc.returncode == 2 and message in proc.stderr, proc.stderr[-500:]
    assert len(proc.stderr.strip().splitlines()) == 1


def test_int8_and_int4_are_weight_only_with_bf16_activations_and_fewer_weight_bytes(tmp_path):
    spec = tiny_llama()
    records = run(RunRequest(spec, ["eager"], ["bf16", "int8", "int4"], 1, ThreadChoice(1, "--threads"),
                             spec.shape(**SHAPE), rule=StopRule(timeout_s=0.3)), tmp_path)
    by = {r.precision: r for r in records}
    assert all(r.status == "ok" for r in records), [(r.precision, r.reason) for r in records]
    assert by["int8"].precision_mode == "w8a16" and by["int4"].precision_mode == "w4a16-g128"
    assert by["int4"].backend_info["group_size"] == 128 and by["int4"].backend_info["quantized_linears"] == 15
    weights = {p: r.metrics["generation"]["weight_bytes"] for p, r in by.items()}
    assert weights["int4"] < weights["int8"] < weights["bf16"]


def test_int4_is_refused_where_it_does_not_apply(tmp_path):
    spec = get_model("resnet_18")
    records = run(RunRequest(spec, ["eager", "inductor", "onnxruntime"], "int4", 1, ThreadChoice(1, "--threads"),
                             {"input_size": 32}, rule=StopRule(timeout_s=0.2)), tmp_path)
    assert all(r.status == "unsupported" and "int4 is weight-only quantization for text generation" in r.reason
               for r in records)
    llama = tiny_llama()
    [r] = run(RunRequest(llama, ["openvino"], "int4", 1, ThreadChoice(1, "--threads"), llama.shape(**SHAPE),
                         rule=StopRule(timeout_s=0.2)), tmp_path)
    assert r.status == "unsupported" and r.reason


@pytest.mark.slow      # compiles two decode graphs; the passes themselves are tested in tests/aio_compile
def test_aios_own_path_decodes_int8_with_int8_activations_and_merges_quantized_rows(tmp_path):
    spec = tiny_llama()
    records = run(RunRequest(spec, ["aio_torch"], ["int8", "int4"], 1, ThreadChoice(1, "--threads"),
                             spec.shape(**SHAPE), rule=StopRule(timeout_s=0.5)), tmp_path)
    by = {r.precision: r for r in records}
    assert all(r.status == "ok" and r.check["passed"] for r in records), [(r.precision, r.reason) for r in records]
    assert by["int8"].precision_mode == "w8a8-dynamic" and by["int4"].precision_mode == "w4a16-g128"
    int8 = by["int8"].backend_info["passes"]
    # the decode graph's linears: q/k/v and gate/up merged per layer (2 layers), then each in oneDNN's int8 GEMM
    assert int8["merge_linear"]["groups"] == 4 and by["int4"].backend_info["passes"]["merge_linear"]["groups"] == 4
    assert int8["quantize_int8"]["onednn_int8_linears"] == int8["quantize_int8"]["quantized"]["Linear"] == 2 * 4 + 1
    assert all(r.metrics["generation"]["recompilations"] == 0 for r in records)
    assert "skip_guard_on_all_nn_modules" in by["int8"].backend_info["guards"]


@pytest.mark.slow      # tunes two compiled strategies per precision: the second tier
def test_aio_weighs_its_compiled_generation_path_against_inductors_eagers_and_the_engines(tmp_path, monkeypatch):
    from aio_examples.backends import BACKENDS

    # every strategy weighed: a quick tuning on a slow machine leaves out what its budget does not reach
    monkeypatch.setenv("AIO_TUNE", "thorough")
    spec = tiny_llama()
    records = run(RunRequest(spec, ["aio"], ["bf16", "int8"], 1, ThreadChoice(1, "--threads"), spec.shape(**SHAPE),
                             rule=StopRule(timeout_s=0.5)), tmp_path)
    # llama.cpp (BF16, Q8_0) and OpenVINO GenAI (bf16 weights as F16, Q8_0) run both precisions;
    # ONNX Runtime GenAI neither (fp32 and int4 only): refused
    engines = {name for name in ("llama_cpp", "openvino_genai") if BACKENDS[name].unavailable_reason() is None}
    for r in records:
        assert r.status == "ok", r.reason
        assert r.metrics["generation"]["recompilations"] == 0
        tuning = r.backend_info["tuning"]
        assert set(tuning["medians_ms"]) == {"compiled", "inductor", "eager"} | engines, tuning["refused"]
        assert r.strategy in tuning["medians_ms"]
        if BACKENDS["onnxruntime_genai"].unavailable_reason() is None:
            assert "fp32 and int4" in tuning["refused"]["onnxruntime_genai"]
    bf16 = next(r for r in records if r.precision == "bf16")
    if bf16.strategy == "compiled":      # q/k/v and gate/up merged: 2 merges per layer
        assert bf16.backend_info["passes"]["merge_linear"]["groups"] == 4
