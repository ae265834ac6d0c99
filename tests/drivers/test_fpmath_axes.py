"""fp32's fast-math mode and torch's runtime variables as axes: the configurations of a run, the points of a sweep
and their keys, the refusals, and a real sweep point whose process reads them back into its record."""

import json

import pytest
from conftest import run_cli

from aio_examples.core import records as res
from aio_examples.core.errors import UsageError
from aio_examples.drivers import sweep
from aio_examples.drivers.launcher import configs_of
from aio_examples.drivers.sweep import Point, SweepConfig, launch_of
from aio_examples.drivers.worker import fpmath_setting, parse_run_argv, record_failure
from aio_examples.machine.fpmath import accepted, cpu_flags
from aio_examples.machine.topology import read_topology
from aio_examples.models import get_model


def test_a_run_measures_fp32_in_each_mode_beside_strict_eager_fp32_and_other_precisions_once():
    spec = get_model("resnet_18")
    configs = configs_of(spec, ["eager", "openvino"], ["fp32", "int8"], 1, spec.shape(input_size=32), reference=True,
                         fpmath_modes=["bf16"])
    assert [c.label for c in configs] == ["eager/fp32", "eager/fp32 fpmath bf16", "openvino/fp32 fpmath bf16",
                                          "eager/int8", "openvino/int8"]
    assert [c.is_reference for c in configs] == [True, False, False, False, False]
    with pytest.raises(UsageError, match="torch's fast math is the process's"):
        fpmath_setting("strict,bf16", ["fp32"], inline=True)
    if "bf16" in accepted(cpu_flags()):
        assert fpmath_setting("strict,bf16", ["fp32"], inline=False) == [("fp32", "strict"), ("fp32", "bf16")]
    else:
        with pytest.raises(UsageError, match="bf16 needs native bf16 arithmetic, which this CPU lacks"):
            fpmath_setting("strict,bf16", ["fp32"], inline=False)


def test_the_sweep_axes_expand_into_points_of_their_own_keyed_and_identified_apart():
    cfg = SweepConfig(["resnet_18"], backends=["eager"], precisions=["fp32", "int8"], threads=[1],
                      fpmath_modes=["strict", "bf16"], lru_cache_capacity=[1, 64], thp_mem_alloc=[1])
    points = cfg.points([1])
    assert [(p.precision, p.fpmath, p.env) for p in points] == [
        (precision, mode, (("LRU_CACHE_CAPACITY", capacity), ("THP_MEM_ALLOC_ENABLE", 1)))
        for precision, mode in (("fp32", "strict"), ("fp32", "bf16"), ("int8", "strict")) for capacity in (1, 64)]
    assert len({p.point_id for p in points}) == len({p.key for p in points}) == 6
    assert points[2].key.fpmath == "bf16" and points[2].key.env_axes == "LRU_CACHE_CAPACITY=1,THP_MEM_ALLOC_ENABLE=1"
    assert "fpmath bf16 LRU_CACHE_CAPACITY=1 THP_MEM_ALLOC_ENABLE=1" in points[2].label
    # a point without them keeps the id it had before they existed (sweeps resume across the change)
    plain = Point("resnet_18", "eager", "fp32", 1, 1)
    assert plain.point_id == sweep._digest({k: v for k, v in plain.key._asdict().items() if k not in res.KEY_DEFAULTS})
    assert "fpmath" not in plain.legacy_point_id and plain.legacy_point_id == Point("resnet_18", "eager", "fp32", 1,
                                                                                     1).legacy_point_id


@pytest.mark.parametrize("fields, said", [
    ({"precisions": ["int8"], "fpmath_modes": ["bf16"]}, "applies to fp32 models"),
    ({"fpmath_modes": ["bf16", "bf16"]}, "lists bf16 more than once"),
    ({"fpmath_modes": ["fast"]}, "'fast' is unknown; accepted: strict, bf16, f16"),
    ({"lru_cache_capacity": [0]}, r"lru_cache_capacity value 0 is invalid; accepted: whole numbers >= 1 \(torch"),
    ({"thp_mem_alloc": [2]}, "thp_mem_alloc value 2 is invalid; accepted: 0 or 1"),
    ({"thp_mem_alloc": []}, r"thp_mem_alloc \[\] is invalid"),
])
def test_bad_axis_values_are_refused_in_one_line(fields, said):
    with pytest.raises(UsageError, match=said):
        SweepConfig(["resnet_18"], backends=["eager"], threads=[1], **fields)


def test_a_sweep_file_takes_the_axes_and_the_point_process_gets_them(tmp_path):
    config = tmp_path / "sweep.toml"
    config.write_text('models = ["resnet_18"]\nbackends = ["eager"]\nthreads = [1]\nfpmath_modes = ["bf16"]\n'
                      "lru_cache_capacity = [16]\nthp_mem_alloc = [1]\n")
    cfg = SweepConfig.from_toml(config, {"output": str(tmp_path / "out")})
    [point] = cfg.points([1])
    launch = launch_of(point, cfg, tmp_path, read_topology())
    assert launch.env["LRU_CACHE_CAPACITY"] == "16" and launch.env["THP_MEM_ALLOC_ENABLE"] == "1"
    assert parse_run_argv(launch.argv)[1].fpmath_mode == "bf16"
    spec = point.spec
    failed = record_failure(tmp_path, spec, "eager", "fp32", 1, 1, spec.shape(), "timeout", "hung",
                            point_id=point.point_id, fpmath=point.fpmath, settings=point.env)
    assert failed.key(machine="*")._replace(machine="*") == point.key        # its record is keyed as the point


# The slow tier: a sweep of its own; the fpmath axes' parsing and the small sweep stay in the default tier
@pytest.mark.slow
def test_a_sweep_point_reads_the_mode_and_the_variables_back_in_its_own_process(tmp_path):
    out = tmp_path / "sweep"
    proc = run_cli(["-m", "aio_examples", "sweep", "resnet_18", "--input-size", "32", "--backends", "eager",
                    "--threads", "1", "--timeout", "0.5", "--quiet", "--fpmath-modes", "bf16",
                    "--lru-cache-capacity", "16", "--thp-mem-alloc", "1", "--output", str(out)])
    if "bf16" not in accepted(cpu_flags()):        # an AVX2 CPU: refused in one line before any point runs
        assert proc.returncode == 2 and "accepted here: strict" in proc.stderr.strip().splitlines()[-1]
        assert not (out / "results.jsonl").exists()
        return
    assert proc.returncode == 0, proc.stderr[-2000:]
    [line] = (out / "results.jsonl").read_text().splitlines()
    r = res.Result.from_dict(json.loads(line))
    assert r.status == "ok", r.reason
    assert r.env["env_axes"] == {"LRU_CACHE_CAPACITY": "16", "THP_MEM_ALLOC_ENABLE": "1"}       # as the child saw them
    assert r.env["env_vars"]["LRU_CACHE_CAPACITY"] == "16" and r.env["env_vars"]["THP_MEM_ALLOC_ENABLE"] == "1"
    assert r.fpmath["mode"] == "bf16" and r.fpmath["read_back"]["torch.backends.mkldnn.conv.fp32_precision"] == "bf16"
    assert r.key().fpmath == "bf16" and r.key().env_axes == "LRU_CACHE_CAPACITY=16,THP_MEM_ALLOC_ENABLE=1"
    assert r.check["tolerance"]["precision"] == "bf16"
