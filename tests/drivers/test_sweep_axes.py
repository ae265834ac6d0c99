"""Sweep axes of shape (prompt lengths, new tokens) and the architecture's config overrides: each value a point of
its own, keyed as its record is, refused in one line when wrong; a real tiny sweep of a small Llama whose points
and records match, and whose rerun resumes everything."""

import json
from pathlib import Path

import pytest
from conftest import run_cli

from aio_examples.cli import main
from aio_examples.core import records as res
from aio_examples.core.errors import UsageError
from aio_examples.drivers.sweep import SweepConfig, launch_of
from aio_examples.drivers.worker import parse_run_argv
from aio_examples.machine.topology import read_topology
from aio_examples.models import get_model

SMALL_LLAMA = ["num_hidden_layers=2", "hidden_size=256", "intermediate_size=512", "num_attention_heads=8",
               "num_key_value_heads=2", "head_dim=32", "vocab_size=2048"]


def test_each_value_of_a_shape_axis_is_a_point_for_the_models_with_that_dimension():
    cfg = SweepConfig(["squeezenet", "gpt2"], backends=["eager"], threads=[1], seq_lens=[16, 32], new_tokens=[4, 8])
    points = cfg.points([1])
    assert [(p.model, dict(p.shape)) for p in points] == [
        ("squeezenet", {}),                     # no sequence: one point, at its own shape
        ("gpt2", {"seq_len": 16, "new_tokens": 4}), ("gpt2", {"seq_len": 16, "new_tokens": 8}),
        ("gpt2", {"seq_len": 32, "new_tokens": 4}), ("gpt2", {"seq_len": 32, "new_tokens": 8})]
    assert len({p.point_id for p in points}) == 5
    assert points[1].key.shape == "new_tokens=4,seq_len=16"
    # The single-value form is the same configuration, so either resumes the other.
    single = SweepConfig(["gpt2"], backends=["eager"], threads=[1], shape={"seq_len": 16, "new_tokens": 4})
    assert single.points([1])[0].point_id == points[1].point_id


def test_config_overrides_go_to_every_point_and_into_its_key_as_into_its_record():
    cfg = SweepConfig(["llama_3_2_1b"], backends=["eager"], precisions=["fp32", "int4"], threads=[1],
                      seq_lens=[16], new_tokens=[4], config_overrides=SMALL_LLAMA)
    plain = SweepConfig(["llama_3_2_1b"], backends=["eager"], precisions=["fp32", "int4"], threads=[1],
                        seq_lens=[16], new_tokens=[4])
    points = cfg.points([1])
    spec = get_model("llama_3_2_1b").with_config(SMALL_LLAMA)
    record = res.Result.for_config(spec, "eager", "fp32", 1, 1, spec.shape(seq_len=16, new_tokens=4))
    assert points[0].key.shape == record.shape_label and "config.num_hidden_layers=2" in record.shape_label
    assert {p.point_id for p in points}.isdisjoint(p.point_id for p in plain.points([1]))
    launch = launch_of(points[0], cfg, Path("/nonexistent"), read_topology())
    _, args = parse_run_argv(launch.argv)              # the point's process is given every override
    assert args.config_override == SMALL_LLAMA and (args.seq_len, args.new_tokens) == (16, 4)


def test_a_sweep_file_takes_the_axes_and_a_flag_replaces_a_dimension_in_either_form(tmp_path):
    path = tmp_path / "gen.toml"
    path.write_text('models = ["gpt2"]\nbackends = ["eager"]\nseq_lens = [16, 32]\nnew_tokens = [4]\n'
                    'config_overrides = ["n_layer=2"]\n')
    cfg = SweepConfig.from_toml(path)
    assert (cfg.seq_lens, cfg.new_tokens, cfg.config_overrides) == ([16, 32], [4], ["n_layer=2"])
    one = SweepConfig.from_toml(path, {"shape": {"seq_len": 64}})          # --seq-len 64 over the file's list
    assert one.seq_lens is None and one.shape == {"seq_len": 64} and one.new_tokens == [4]
    path.write_text('models = ["gpt2"]\nshape = {seq_len = 16, new_tokens = 4}\n')
    listed = SweepConfig.from_toml(path, {"seq_lens": [8, 16], "new_tokens": [2]})
    assert listed.shape == {} and (listed.seq_lens, listed.new_tokens) == ([8, 16], [2])


@pytest.mark.parametrize(("argv", "says"), [
    (["gpt2", "--seq-lens", "0"], "--seq-lens '0' is invalid; accepted: a comma list of whole numbers >= 1"),
    (["gpt2", "--seq-lens", "16,,32"], "--seq-lens '16,,32' has an empty item"),
    (["gpt2", "--seq-lens", "16,16"], "lists 16 more than once"),
    (["gpt2", "--new-tokens", "x"], "--new-tokens 'x' is invalid"),
    (["gpt2", "--new-tokens", "1.5"], "--new-tokens '1.5' is invalid"),
    (["gpt2", "--seq-len", "16", "--seq-lens", "16,32"], "seq_lens and shape.seq_len are both given"),
    (["gpt2", "--seq-lens", "100000"], "is too long for gpt2"),
    (["squeezenet", "--seq-lens", "16"], "seq_lens does not apply to squeezenet"),
    (["squeezenet", "--config-override", "n_layer=2"], "--config-override does not apply to squeezenet"),
    (["gpt2", "--config-override", "nope=2"], "GPT2Config has no 'nope'"),
    (["gpt2", "--config-override", "n_layer"], "accepted: KEY=VALUE"),
])
def test_bad_axis_values_are_refused_in_one_line(tmp_path, capsys, argv, says):
    assert main(["sweep", *argv, "--output", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and says in err, err
    assert not (tmp_path / "out" / "results.jsonl").exists()


@pytest.mark.parametrize(("body", "says"), [
    ('seq_lens = "16"', "seq_lens '16' is invalid; accepted: a non-empty list of whole numbers >= 1"),
    ("seq_lens = []", "seq_lens [] is invalid"),
    ("new_tokens = [0]", "new_tokens value 0 is invalid; accepted: whole numbers >= 1"),
    ("new_tokens = [true]", "new_tokens value True is invalid"),
    ("new_tokens = [2.5]", "new_tokens value 2.5 is invalid"),
    ('config_overrides = "n_layer=2"', 'config_overrides \'n_layer=2\' is invalid; accepted: a list of "KEY=VALUE"'),
    ('config_overrides = [""]', "config_overrides [''] is invalid"),
    ('config_overrides = ["n_layer=2", "n_layer=2"]', "config_overrides lists n_layer=2 more than once"),
    ("shape = {seq_len = 16}\nseq_lens = [16]", "seq_lens and shape.seq_len are both given"),
])
def test_bad_axis_keys_in_a_sweep_file_are_named(tmp_path, body, says):
    path = tmp_path / "bad.toml"
    path.write_text(f'models = ["gpt2"]\n{body}\n')
    with pytest.raises(UsageError) as error:
        SweepConfig.from_toml(path)
    assert says in str(error.value) and "\n" not in str(error.value)


@pytest.mark.slow       # the default tier stays under 15 minutes
def test_a_tiny_llama_sweep_over_two_prompt_lengths_records_every_point_and_resumes(tmp_path):
    out = tmp_path / "sweep"
    args = ["-m", "aio_examples", "sweep", "llama_3_2_1b", "--backends", "eager", "--precisions", "fp32",
            "--seq-lens", "16,32", "--new-tokens", "4", "--threads", "1", "--timeout", "0.5", "--point-timeout",
            "300", "--quiet", "--output", str(out), *(x for o in SMALL_LLAMA for x in ("--config-override", o))]
    first = run_cli(args)
    assert first.returncode == 0, first.stderr[-2000:]
    assert "2 point(s) run (2 ok)" in first.stdout
    cfg = SweepConfig(["llama_3_2_1b"], backends=["eager"], threads=[1], seq_lens=[16, 32], new_tokens=[4],
                      config_overrides=SMALL_LLAMA)
    points = {p.point_id: p for p in cfg.points([1])}
    lines = (out / "results.jsonl").read_text().splitlines()
    records = [res.Result.from_dict(json.loads(line)) for line in lines]
    assert sorted(r.point_id for r in records) == sorted(points)
    for r in records:
        point = points[r.point_id]
        assert r.key()._replace(machine="*") == point.key                  # the same configuration, field by field
        gen = r.metrics["generation"]
        assert (gen["prompt_tokens"], gen["new_tokens"]) == (dict(point.shape)["seq_len"], 4)
        assert r.input_shape["config.hidden_size"] == 256 and gen["decode_tokens_per_s"] > 0
    again = run_cli(args)
    assert again.returncode == 0 and "0 point(s) run" in again.stdout and "2 already done" in again.stdout
    assert (out / "results.jsonl").read_text().splitlines() == lines
    # and the report of it draws decode tokens/s against the prompt length
    from aio_examples.reporting.report import build_report

    build_report([out], tmp_path / "report", include_contended=True)
    assert (tmp_path / "report" / "plots" / "llama_3_2_1b-decode-prompt.png").stat().st_size > 1000
