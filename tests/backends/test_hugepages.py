"""Huge pages for what aio's engines allocate: only memory mapped while preparing, collapsed for real."""

import torch

from aio_examples import benchmark
from aio_examples.backends import hugepages
from aio_examples.measurement import timing

MIB = 1 << 20


def test_new_ranges_are_what_was_mapped_in_between_also_when_merged_into_a_neighbour():
    before = [(0x1000, 0x5000), (0x9000, 0xA000)]
    after = [(0x0, 0x6000), (0x8000, 0xA000), (0xC000, 0xD000)]
    assert hugepages.new_ranges(before, after) == [(0x0, 0x1000), (0x5000, 0x6000), (0x8000, 0x9000),
                                                   (0xC000, 0xD000)]
    assert hugepages.new_ranges(after, after) == []
    assert hugepages.new_ranges([], [(0x0, 0x1000)]) == [(0x0, 0x1000)]


def huge_kib(address: int) -> int:
    """AnonHugePages of the mapping holding `address`, in KiB."""
    inside = False
    with open("/proc/self/smaps") as f:
        lines = f.readlines()
    for line in lines:
        first = line.split()[0]
        if "-" in first and ":" not in first:
            lo, hi = (int(x, 16) for x in first.split("-"))
            inside = lo <= address < hi
        elif inside and first == "AnonHugePages:":
            return int(line.split()[1])
    raise AssertionError(f"{address:#x} is in no mapping")


def test_memory_mapped_in_the_block_is_collapsed_and_memory_mapped_before_is_left_alone():
    earlier = torch.ones(64 * MIB // 4)           # mapped before the block: another engine's
    record = {}
    with hugepages.backing(record):
        mine = torch.ones(64 * MIB // 4)
    reason = hugepages.unavailable_reason()
    if reason is not None:                        # a machine without them says so and changes nothing
        assert record["huge_pages"] == reason
        return
    done = record["huge_pages"]
    assert done["backed_mib"] + done["refused_mib"] >= 60, done
    if done["refused_mib"]:                       # a kernel before 6.1 has no MADV_COLLAPSE: it says why
        assert done["errno"], done
        return
    assert huge_kib(mine.data_ptr() + 32 * MIB) >= 2048
    assert torch.equal(mine, torch.ones_like(mine))       # the same data, in other pages
    with open(hugepages.THP_ENABLED) as f:
        madvise_only = "[madvise]" in f.read()
    if madvise_only:
        assert huge_kib(earlier.data_ptr() + 32 * MIB) == 0


def test_off_collapses_nothing_and_says_so():
    record = {}
    with hugepages.backing(record, enabled=False):
        mine = torch.ones(8 * MIB // 4)
    assert record["huge_pages"] == "off (AIO_HUGE_PAGES=0)"
    assert mine.sum() == mine.numel()


def test_aio_records_what_it_backed(monkeypatch):
    monkeypatch.setattr(timing, "TUNING_CONTENDED_CORES", float("inf"))
    model = torch.nn.Sequential(torch.nn.Linear(512, 512), torch.nn.ReLU(), torch.nn.Linear(512, 8)).eval()
    inputs = (torch.randn(2, 512),)
    r = benchmark(model, example_inputs=inputs, backend="aio", threads=1, num_runs=3)
    assert r.status == "ok", r.reason
    backed = r.backend_info["huge_pages"]
    assert backed == hugepages.unavailable_reason() or set(backed) >= {"backed_mib", "refused_mib"}, backed
    monkeypatch.setenv("AIO_HUGE_PAGES", "0")
    r = benchmark(model, example_inputs=inputs, backend="aio", threads=1, num_runs=3)
    assert r.status == "ok" and r.backend_info["huge_pages"] == "off (AIO_HUGE_PAGES=0)"
