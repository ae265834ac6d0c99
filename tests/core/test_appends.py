"""Appends are all or nothing, on a real full filesystem; a line a crash tore is skipped, not fatal."""

import json
import os
import subprocess
import sys

import pytest
from conftest import ROOT, run_cli

from aio_examples.core import records as res


@pytest.fixture
def small_fs(tmp_path):
    """A 64 KiB tmpfs mounted for the test (root with mount rights only: skipped, saying why, elsewhere)."""
    mount = tmp_path / "small"
    mount.mkdir()
    proc = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", str(mount)], capture_output=True,
                          text=True, check=False)
    if proc.returncode != 0:
        pytest.skip(f"cannot mount a small tmpfs here: {proc.stderr.strip() or proc.returncode}")
    try:
        yield mount
    finally:
        subprocess.run(["umount", "-l", str(mount)], check=False)


def fill(folder, leave: int) -> None:
    """Fill the filesystem of `folder` until about `leave` bytes are free."""
    st = os.statvfs(folder)
    free = st.f_bavail * st.f_frsize
    with open(folder / "filler", "wb") as fh:
        fh.write(b"x" * max(0, free - leave))


def record(samples: int, model="m") -> res.Result:
    return res.Result(model=model, task="t", backend="eager", precision="fp32", batch_size=1, threads=1,
                      input_shape={}, samples_ms=[1.2345678] * samples)


def test_a_record_the_disk_cannot_take_whole_leaves_no_half_line_and_is_kept_elsewhere(small_fs, tmp_path,
                                                                                         monkeypatch):
    monkeypatch.setenv("AIO_CACHE_DIR", str(tmp_path / "cache"))
    out = small_fs / "out"
    out.mkdir()
    res.append(out, record(10, model="first"))
    before = (out / "results.jsonl").read_bytes()
    fill(small_fs, leave=8192)
    big = record(5000, model="too-big")           # about 50 KB: part of it would fit
    with pytest.raises(res.RecordNotSaved, match="too-big eager/fp32 was not appended") as caught:
        res.append(out, big)
    assert (out / "results.jsonl").read_bytes() == before           # the part that fitted was taken back
    kept = next((tmp_path / "cache" / "unsaved").glob("*too-big*.json"))
    assert str(kept) in str(caught.value) and res.Result.from_dict(json.loads(kept.read_text())).to_dict() == \
        big.to_dict()
    res.append(out, record(10, model="after"))     # the next record is whole, not glued onto a half line
    assert [r.model for r in res.read(out)] == ["first", "after"]


# The slow tier: a whole command on a full file system; the appends' own tests stay in the default tier
@pytest.mark.slow
def test_a_run_on_a_full_disk_says_its_records_were_not_appended_and_exits_non_zero(small_fs, tmp_path):
    out = small_fs / "out"
    out.mkdir()
    fill(small_fs, leave=4096)
    proc = run_cli(["-m", "aio_examples", "run", "squeezenet", "--backend", "eager", "--input-size", "32",
                    "-t", "1", "--timeout", "1", "--output", str(out)], env={"AIO_CACHE_DIR": str(tmp_path / "c")})
    assert proc.returncode == 1, proc.stdout[-1500:]
    assert "was not appended" in proc.stderr and "records appended" not in proc.stdout
    assert not (out / "results.jsonl").exists() or (out / "results.jsonl").read_bytes() == b""
    [kept] = (tmp_path / "c" / "unsaved").glob("*squeezenet-eager-fp32.json")
    assert res.Result.from_dict(json.loads(kept.read_text())).status == "ok"


def test_a_torn_last_line_is_skipped_with_a_warning_and_a_torn_middle_line_is_refused(tmp_path):
    good = record(3).to_json() + "\n"
    (tmp_path / "results.jsonl").write_text(good + good + good[:40])
    code = ("import sys; from aio_examples.core.records import read; "
            f"print(len(read({str(tmp_path)!r})))")
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=False)
    assert proc.stdout.strip() == "2" and "results.jsonl:3" in proc.stderr and "cut short" in proc.stderr
    report = run_cli(["-m", "aio_examples", "report", str(tmp_path), "--output", str(tmp_path / "report")])
    assert report.returncode == 0 and report.stdout.startswith("2 records"), report.stderr[-1500:]
    (tmp_path / "results.jsonl").write_text(good + good[:40] + "\n" + good)
    with pytest.raises(res.UsageError, match="results.jsonl:2 is not a JSON record"):
        res.read(tmp_path)


def test_an_output_whose_results_file_is_a_folder_is_refused_before_anything_is_measured(tmp_path):
    (tmp_path / "results.jsonl").mkdir()
    proc = run_cli(["-m", "aio_examples", "run", "squeezenet", "--backend", "eager", "--output", str(tmp_path)])
    assert proc.returncode == 2 and "holds a results.jsonl that is not a writable file" in proc.stderr
    assert "preparing" not in proc.stderr


def test_a_report_onto_a_full_disk_says_so_in_one_line(small_fs, tmp_path):
    runs = tmp_path / "runs"
    runs.mkdir()
    for backend in ("eager", "aio"):
        res.append(runs, res.Result(model="m", task="t", backend=backend, precision="fp32", batch_size=1, threads=1,
                                    input_shape={}, latency_ms={"median": 2.0}, samples_ms=[2.0] * 5))
    out = small_fs / "report"
    out.mkdir()
    fill(small_fs, leave=0)
    proc = run_cli(["-m", "aio_examples", "report", str(runs), "--output", str(out)])
    assert proc.returncode == 2, proc.stderr[-1500:]
    [line] = proc.stderr.strip().splitlines()
    assert "the report could not be written (No space left on device)" in line
