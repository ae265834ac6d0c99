"""DLRM (recommendation): the MLPerf sizes, a deterministic build, the dot interaction, click probabilities, the
8-bit row-wise tables of eager int8, and the shapes it refuses. Small tables (row_cap) keep each test fast."""

import dataclasses

import pytest
import torch

from aio_examples.backends import PrepareContext, get_backend
from aio_examples.core.errors import UsageError
from aio_examples.measurement.output_check import check_outputs
from aio_examples.measurement.runner import RunRequest
from aio_examples.models import get_model
from aio_examples.models.recommendation import CRITEO_1TB_ROWS, DLRM_V2_MULTI_HOT

SMALL_TABLES = 1000


@pytest.fixture(scope="module")
def small():
    spec = dataclasses.replace(get_model("dlrm"), row_cap=SMALL_TABLES)
    return spec, spec.build()


def test_the_zoo_entry_has_mlperf_widths_and_capped_criteo_tables():
    spec = get_model("dlrm")
    assert spec.task == "recommendation" and spec.task_unit == "samples" and spec.shape() == {}
    rows = [min(n, spec.row_cap) for n in CRITEO_1TB_ROWS]
    assert len(rows) == len(DLRM_V2_MULTI_HOT) == 26 and max(rows) == spec.row_cap < max(CRITEO_1TB_ROWS)
    assert spec.weight_bytes() > sum(rows) * 128 * 4            # the tables, and the MLPs beside them
    assert spec.weight_bytes() < 1 << 30                        # fits a small machine many times over


def test_random_weights_are_the_same_in_every_build(small):
    spec, module = small
    again = spec.build()
    assert all(torch.equal(a, b) for a, b in zip(module.state_dict().values(), again.state_dict().values()))
    assert list(module.state_dict())[:2] == ["bot_l.0.weight", "bot_l.0.bias"]    # the reference's names


def test_inputs_are_criteo_like_and_outputs_are_spread_click_probabilities(small):
    spec, module = small
    dense, indices, offsets = spec.example_inputs(8, {}, module)
    assert dense.shape == (8, 13) and dense.dtype == torch.float32 and dense.min() >= 0
    assert indices.dtype == offsets.dtype == torch.int64
    assert indices.shape == (8 * sum(DLRM_V2_MULTI_HOT),) and offsets.shape == (26, 8)
    assert torch.equal(dense, spec.example_inputs(8, {}, module)[0])                  # seeded
    assert not torch.equal(dense, spec.calibration_inputs(8, {}, module, 1)[0][0])
    with torch.no_grad():
        out = module(dense, indices, offsets)
    assert out.shape == (8, 1) and ((out > 0) & (out < 1)).all()
    assert float(torch.logit(out.double()).std()) > 0.3        # a signal, not the top MLP's bias alone


def test_the_top_mlp_reads_the_bottom_output_and_every_pairwise_dot_product_once(small):
    spec, module = small
    dense, indices, offsets = spec.example_inputs(2, {}, module)
    seen = {}
    handle = module.top_l[0].register_forward_hook(lambda layer, args, out: seen.update(x=args[0]))
    try:
        with torch.no_grad():
            module(dense, indices, offsets)
            bottom = module.bot_l(dense)
            vectors, start = [bottom], 0
            for table, (bag, hot) in enumerate(zip(module.emb_l, DLRM_V2_MULTI_HOT)):
                vectors.append(bag(indices[start:start + 2 * hot], offsets[table]))
                start += 2 * hot
    finally:
        handle.remove()
    assert module.top_l[0].in_features == 128 + 27 * 26 // 2 == seen["x"].shape[1]
    expected = [vectors[i] @ vectors[j].T for i in range(27) for j in range(i)]
    dots = torch.stack([e.diagonal() for e in expected], 1)
    assert torch.allclose(seen["x"][:, :128], bottom) and torch.allclose(seen["x"][:, 128:], dots, rtol=1e-4, atol=1e-4)


def test_eager_int8_quantizes_the_tables_row_wise_and_the_mlps_dynamically(small):
    spec, module = small
    inputs = spec.example_inputs(16, {}, module)
    backend = get_backend("eager")
    ctx = PrepareContext("dlrm", spec.task, spec.family, {}, 16, "test")
    prepared = backend.prepare(backend.working_copy(module, "int8"), inputs, "int8", 1, ctx)
    assert prepared.precision_mode == "int8-dynamic-linear+rowwise-embedding-bags"
    assert prepared.info["rowwise_int8_embedding_bags"] == 26 and prepared.info["quantized_modules"] == 8
    with torch.no_grad():
        check = check_outputs(spec.task, module(*inputs), prepared.fn(*inputs), "int8", judge_agreement=False)
    assert check.passed and 0 < check.metrics["max_abs_err"], check.reason


def test_probabilities_are_judged_by_their_absolute_error():
    probabilities = torch.rand(64, 1, generator=torch.Generator().manual_seed(0)) * 0.8 + 0.1
    signs = torch.randint(2, (64, 1), generator=torch.Generator().manual_seed(1)) * 2 - 1
    off = check_outputs("recommendation", probabilities, probabilities + 0.15 * signs, "int8", judge_agreement=False)
    assert not off.passed and off.metrics["cosine"] > 0.95 and "probabilities differ" in off.reason  # cosine alone: pass
    nudged = check_outputs("recommendation", probabilities, probabilities + 0.01, "int8", judge_agreement=False)
    assert nudged.passed and nudged.to_dict()["tolerance"]["abs_err_max"] == 0.1
    fp32 = check_outputs("recommendation", probabilities, probabilities + 0.01, "fp32", judge_agreement=False)
    assert not fp32.passed and "probabilities differ" in fp32.reason


def test_shape_flags_and_a_batch_past_memory_are_refused():
    spec = get_model("dlrm")
    with pytest.raises(UsageError, match=r"--seq-len does not apply to dlrm .*none \(its shape is the batch size\)"):
        spec.shape(seq_len=8)
    with pytest.raises(UsageError, match="batch size 1000000000 .* needs about"):
        RunRequest(spec, ["eager"], "fp32", 10**9)
