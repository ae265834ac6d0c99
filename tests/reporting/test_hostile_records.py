"""Records are data, not paths: a crafted model name never makes a file outside the folder asked for."""

from pathlib import Path

from conftest import run_cli

from aio_examples.core import records as res
from aio_examples.core.paths import safe_name

CRAFTED = "../../../../" + "x" * 3 + "/escape"


def crafted_run(folder: Path, model=CRAFTED):
    for threads in (1, 2):
        for backend, median in (("eager", 10.0), ("aio", 5.0)):
            res.append(folder, res.Result(
                model=model, task="image-classification", backend=backend, precision="fp32", batch_size=1,
                threads=threads, input_shape={"batch_size": 1, "input_size": 32}, samples_ms=[median] * 5,
                latency_ms={"median": median / threads}, throughput={"value": 100.0, "unit": "images/s"}))


def files_under(root: Path) -> set:
    return {p for p in root.rglob("*") if p.is_file()}


def test_a_report_of_records_with_a_crafted_model_name_writes_only_inside_its_output(tmp_path):
    runs, out = tmp_path / "a" / "b" / "c" / "d" / "runs", tmp_path / "a" / "b" / "c" / "d" / "report"
    runs.mkdir(parents=True)
    crafted_run(runs)
    before = files_under(tmp_path)
    proc = run_cli(["-m", "aio_examples", "report", str(runs), "--output", str(out)])
    assert proc.returncode == 0, proc.stderr[-1500:]
    made = files_under(tmp_path) - before
    assert made and all(out in p.parents for p in made), sorted(map(str, made - {p for p in made if out in p.parents}))
    assert (out / "plots" / f"{safe_name(CRAFTED)}-threads.png").is_file()
    assert "&lt;" not in CRAFTED and CRAFTED in (out / "report.html").read_text()     # shown as it is, as text


def test_history_show_of_a_crafted_name_plots_beside_the_history(tmp_path):
    db = tmp_path / "deep" / "h.sqlite"
    runs = tmp_path / "runs"
    runs.mkdir()
    crafted_run(runs, model="../..")
    assert run_cli(["-m", "aio_examples", "history", "add", str(runs), "--history", str(db)]).returncode == 0
    before = files_under(tmp_path)
    proc = run_cli(["-m", "aio_examples", "history", "show", "../..", "--history", str(db)])
    assert proc.returncode == 0, proc.stderr[-1500:]
    assert files_under(tmp_path) - before == {db.parent / f"history-{safe_name('../..')}.png"}


def test_safe_names_keep_ordinary_names_and_neutralise_the_rest():
    assert safe_name("resnet_50_v1") == "resnet_50_v1" and safe_name("bert-base.v2+int8") == "bert-base.v2+int8"
    assert "/" not in safe_name("../../etc/passwd") and not safe_name("..").startswith(".")
    assert safe_name("a\x00b\nc") == "a_b_c" and safe_name("") == "_"
