"""The Python API that notebooks use."""

import json

import pandas as pd
import pytest
import torch
from torch import nn

from aio_examples import benchmark
from aio_examples.core.errors import UsageError


class TinyNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.body = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 8))

    def forward(self, x):
        return self.body(x)


def test_benchmark_a_users_module(tmp_path):
    net = TinyNet().eval()
    before = {k: v.clone() for k, v in net.state_dict().items()}
    r = benchmark(net, example_inputs=(torch.randn(4, 32),), threads=1, num_runs=20, output=tmp_path)
    assert r.status == "ok" and r.model == "TinyNet" and r.task == "custom"
    assert r.batch_size == 4 and r.input_shape["input0"] == [4, 32]
    assert r.latency_ms["n"] == 20
    assert r.throughput["unit"] == "samples/s"
    assert r.weights == "user-module"
    d = r.to_dict()
    assert json.loads(json.dumps(d))["model"] == "TinyNet"
    row = r.to_series()
    assert row["latency_ms.median"] == pytest.approx(r.median_ms)
    assert isinstance(r.to_frame(), pd.DataFrame)
    assert pd.read_json(tmp_path / "results.jsonl", lines=True)["model"].tolist() == ["TinyNet"]
    # the user's module is not changed by being benchmarked
    assert all(torch.equal(before[k], v) for k, v in net.state_dict().items())


def test_benchmark_a_zoo_model_in_bf16():
    r = benchmark("resnet_18", precision="bf16", backend="eager", input_size=64, threads=1, num_runs=3)
    assert r.status == "ok" and r.precision == "bf16" and r.precision_mode == "cast"
    assert r.threads == 1 and r.binding["threads_in_effect"] == 1


def test_a_backend_that_cannot_take_the_model_is_a_result_not_a_crash():
    class Dynamic(nn.Module):
        def forward(self, x):
            return x * 2 if x.sum() > 0 else x   # data-dependent: tracing works but ...
    class Untraceable(nn.Module):
        def forward(self, x):
            return {"a": [x, object()]}          # ... this output cannot be traced at all
    r = benchmark(Untraceable(), example_inputs=(torch.ones(2, 2),), backend="torchscript", threads=1, num_runs=2)
    assert r.status in ("failed", "unsupported") and r.reason


TINY_GPT2 = ["n_layer=1", "n_embd=64", "n_head=2"]


def test_gpt2_generation_reports_tokens_and_time_to_first_token():
    r = benchmark("gpt2", config=TINY_GPT2, seq_len=8, new_tokens=4, threads=1, num_runs=3)
    assert r.status == "ok"
    assert r.throughput["unit"] == "tokens/s"
    assert r.metrics["ttft_ms"]["n"] == 3
    assert 0 < r.metrics["ttft_ms"]["median"] < r.latency_ms["median"]


def test_gpt2_on_torchscript_is_unsupported_with_a_reason():
    r = benchmark("gpt2", backend="torchscript", config=TINY_GPT2, seq_len=8, new_tokens=2, threads=1, num_runs=1)
    assert r.status == "unsupported" and "KV cache" in r.reason


def test_api_validates_like_the_cli():
    with pytest.raises(UsageError, match="batch size 0"):
        benchmark("resnet_18", batch_size=0, threads=1)
    with pytest.raises(UsageError, match="precision 'int3'"):
        benchmark("resnet_18", precision="int3", threads=1)


def test_config_overrides_make_a_smaller_model_and_are_recorded():
    r = benchmark("bert_base", config=["num_hidden_layers=1", "hidden_size=64", "intermediate_size=128",
                                       "num_attention_heads=2"], seq_len=8, threads=1, num_runs=2)
    assert r.status == "ok" and r.input_shape["config.num_hidden_layers"] == 1
    assert r.input_shape["config.hidden_size"] == 64
    with pytest.raises(UsageError, match="no 'layers'"):
        benchmark("bert_base", config=["layers=1"], threads=1, num_runs=1)
    with pytest.raises(UsageError, match="built module"):
        benchmark(TinyNet(), example_inputs=(torch.randn(1, 32),), config=["num_hidden_layers=1"], threads=1)


def test_a_model_file_by_path_with_its_input_shape(tmp_path):
    """An ONNX file with a symbolic batch: the shape given, the file's digest recorded, the torch backends refused."""
    net = TinyNet().eval()
    torch.onnx.export(net, (torch.randn(1, 32),), tmp_path / "tiny.onnx", input_names=["x"],
                      dynamic_axes={"x": {0: "n"}}, dynamo=False, opset_version=17)
    r = benchmark(str(tmp_path / "tiny.onnx"), backend="onnxruntime", input_shape="3x32", threads=1, num_runs=2)
    assert r.status == "ok" and r.model == "tiny" and r.batch_size == 3 and "sha256" in r.weights_path
    assert benchmark(str(tmp_path / "tiny.onnx"), input_shape="3x32", threads=1).status == "unsupported"   # eager


def test_benchmark_of_several_backends_is_one_interleaved_run():
    # a comma list as the CLI takes it, or a list
    results = benchmark("resnet_18", backend="eager,torchscript", precision=["fp32", "bf16"], input_size=64,
                        threads=1, num_runs=5)
    assert [(r.backend, r.precision) for r in results] == [("eager", "fp32"), ("torchscript", "fp32"),
                                                           ("eager", "bf16"), ("torchscript", "bf16")]
    assert len({r.run_id for r in results}) == 1 and results[0].speedup_vs_eager_fp32 == 1.0
    for r in results:
        assert r.status == "ok", r.reason
        assert r.scenario["rounds"]["with"] == ["eager/fp32", "torchscript/fp32", "eager/bf16", "torchscript/bf16"]
        assert r.speedup_vs_eager_fp32 == pytest.approx(results[0].median_ms / r.median_ms)


# The fresh interpreter in the slow tier: the same steps, paid with a whole interpreter's imports
@pytest.mark.parametrize("forked", ["1", pytest.param("0", marks=pytest.mark.slow)], ids=["forked", "fresh interpreter"])
def test_a_torchvision_model_the_user_built_is_measured_in_its_own_process(monkeypatch, forked):
    # the configuration's process makes torchvision load on this torch before it unpickles the user's module,
    # as the caller had; forked from the fork server or started as a fresh interpreter (AIO_FORKSERVER=0)
    from aio_examples.compat.torchvision_shim import ensure_torchvision

    monkeypatch.setenv("AIO_FORKSERVER", forked)
    net = ensure_torchvision().models.resnet18().eval()
    r = benchmark(net, example_inputs=(torch.randn(1, 3, 64, 64),), backend="eager", threads=1, num_runs=3)
    assert r.status == "ok", r.reason
    assert r.model == "ResNet" and r.check["passed"]


def test_a_transformers_model_the_user_built_is_measured_in_its_own_process():
    from transformers import BertConfig, BertModel

    net = BertModel(BertConfig(vocab_size=128, hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
                               intermediate_size=64)).eval()
    r = benchmark(net, example_inputs=(torch.randint(0, 128, (1, 16)),), backend="eager,torchscript", threads=1,
                  num_runs=3)
    assert [(x.backend, x.status) for x in r] == [("eager", "ok"), ("torchscript", "ok")], [x.reason for x in r]
    assert r[0].model == "BertModel" and r[0].check["passed"]


def test_benchmark_refuses_a_bad_comma_list_as_the_cli_does():
    with pytest.raises(UsageError, match="'eager,,inductor' has an empty item"):
        benchmark(TinyNet(), example_inputs=(torch.randn(1, 32),), backend="eager,,inductor", threads=1)
    with pytest.raises(UsageError, match="fp33"):
        benchmark(TinyNet(), example_inputs=(torch.randn(1, 32),), precision="fp32,fp33", threads=1)
