"""Hostile and careless input: a few hundred bad values for every flag and sweep-file key, each refused with one
line on stderr and exit 2, before anything is measured, and nothing written where it was not asked to be.

The cases run in one real process (tests/cli/fuzz_worker.py calls the CLI's `main` for each, with a fresh
environment), so a few hundred of them take seconds, not a Python start each.
"""

import json
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import ROOT

INTS = ["", " ", "0", "-1", "1.5", "abc", "nan", "inf", "1e999", "1,2", "0x10"]
HUGE = "9" * 40
SECONDS = ["", " ", "0", "-1", "abc", "nan", "inf", "-inf", "1e999", "1,2", "NaN"]
NAMES = ["", " ", ",", "a,,b", "fp32,fp32", "FP99", "../x", "x" * 3000, "fp32;rm -rf /", "ü"]
BACKENDS = ["", ",", "eager,,onnxruntime", "eager,eager", "nope", "../x", "eager;ls", "x" * 3000]


def run_cases(tmp_path: Path) -> list[str]:
    """argv lists of bad input (the files they name are made here)."""
    work = tmp_path / "work"
    work.mkdir()
    text, folder = work / "weights.txt", work / "a-folder"
    text.write_text("not a state dict\n")
    folder.mkdir()
    (folder / "config.json").write_text("{not json")
    out = str(work / "out")
    base = ["run", "squeezenet", "--output", out]
    cases = [[*base, "-b", v] for v in [*INTS, HUGE]]
    cases += [[*base, "--num-runs", v] for v in INTS]
    cases += [[*base, "--input-size", v] for v in [*INTS, "100000", HUGE]]
    cases += [["run", "bert_base", "--output", out, "--seq-len", v] for v in [*INTS, "100000"]]
    cases += [["run", "gpt2", "--output", out, "--new-tokens", v] for v in [*INTS, HUGE]]
    cases += [[*base, "--timeout", v] for v in SECONDS]
    cases += [[*base, "-t", v] for v in ["", "0", "-1", "abc", "1.5", "99999"]]
    cases += [[*base, "-p", v] for v in NAMES]
    cases += [[*base, "--backend", v] for v in BACKENDS]
    cases += [[*base, "--weights", v] for v in ["", str(work / "missing.pt"), str(folder), str(text)]]
    cases += [["run", "bert_base", "--output", out, "--model-dir", v] for v in ["", str(work / "none"), str(text),
                                                                                 str(folder)]]
    cases += [["run", "squeezenet", "--output", v] for v in ["", " ", str(text)]]
    cases += [["run", v, "--output", out] for v in ["", "nope", "../../etc/passwd", "squeezenet;ls"]]
    cases += [["run", "squeezenet", "--output", out, "--input-size", "32", "--seq-len", "8"]]
    cases += [["run", "squeezenet", "--output", out, "--bogus"]]
    sweep = ["sweep", "squeezenet", "--output", out]
    cases += [[*sweep, "--backends", v] for v in BACKENDS]
    cases += [[*sweep, "--precisions", v] for v in NAMES]
    cases += [[*sweep, flag, v] for flag in ("--batch-sizes", "--threads") for v in ["", ",", "1,,2", "0", "-1", "a",
                                                                                    "1,1", "1.5"]]
    cases += [[*sweep, "--allocators", v] for v in ["", "nope", "default,default", "tcmalloc,,jemalloc"]]
    cases += [[*sweep, flag, v] for flag in ("--timeout", "--point-timeout") for v in SECONDS]
    cases += [[*sweep, flag, v] for flag in ("--repeats", "--interleave") for v in [*INTS, HUGE]]
    cases += [["matrix", "--output", out, flag, v] for flag in ("--models", "--backends", "--precisions")
              for v in ["", ",", "a,,b", "nope", "eager,eager"]]
    cases += [["matrix", "--render-only", "--output", str(work / "no-matrix")]]
    cases += [["throughput", "squeezenet", "--output", out, flag, v] for flag in ("--instances",
              "--threads-per-instance", "-b", "--timeout") for v in ["0", "-1", "x", "nan", ""]]
    cases += [["report", v, "--output", out] for v in ["", str(work / "missing"), str(text)]]
    cases += [["compare", str(text), str(text), *extra] for extra in ([], ["--threshold", "x"], ["--threshold", "200%"],
              ["--confidence", "2"], ["--ignore", "bogus"], ["--ignore", "a,,b"], ["--format", "pdf"],
              ["--output", str(work / "no-such-folder" / "c.md")])]
    cases += [["history", "show", "x", "--history", str(work / "none.sqlite")]]
    cases += [["history", "add", str(text), "--history", str(work / "h.sqlite")]]
    cases += [["peak", "--precisions", v] for v in ["", "int4", "fp32,,bf16"]]
    cases += [["nightly", str(work / "missing"), "--history", str(work / "h2.sqlite")]]
    return [[str(a) for a in c] for c in cases]


SWEEP_KEYS = {
    "models": ['"squeezenet"', "[]", '[""]', "[1]", '["nope"]', '["squeezenet", "squeezenet"]', "{}"],
    "backends": ['"eager"', "[]", '[""]', '["nope"]', '["eager", "eager"]', "3"],
    "precisions": ['"fp32"', "[]", '["fp99"]', '["fp32", "fp32"]'],
    "batch_sizes": ["[]", "[0]", '["1"]', "[1.5]", "[true]", '"1"', "[1, 1]"],
    "threads": ["[]", "[0]", '"x"', "[-2]", "[1, 1]"],
    "allocators": ["[]", '["x"]', '"default"'],
    "shape": ["{input_size = 0}", "{x = 1}", '"x"', '{input_size = "a"}'],
    "timeout": ["0", "-1", '"x"', "inf", "nan", "true"],
    "point_timeout": ["0", "-1", '"x"', "inf", "nan"],
    "output": ["42", '""', "[]"],
    "repeats": ["0", '"2"', "true", "1.5"],
    "probe": ['"yes"', "1"],
    "interleave": ["0", '"2"', "-1"],
    "nonsense_key": ["1"],
}


def sweep_cases(tmp_path: Path) -> list[list[str]]:
    folder = tmp_path / "sweeps"
    folder.mkdir()
    cases = []
    for key, values in SWEEP_KEYS.items():
        for i, value in enumerate(values):
            path = folder / f"{key}-{i}.toml"
            body = {"models": '["squeezenet"]', "output": f'"{tmp_path / "work" / "out"}"', key: value}
            path.write_text("".join(f"{k} = {v}\n" for k, v in body.items()))
            cases.append(["sweep", "--config", str(path)])
    binary = folder / "binary.toml"
    binary.write_bytes(b"\x00\xff\xfe garbage")
    cases.append(["sweep", "--config", str(binary)])
    return cases


@pytest.fixture(scope="module")
def outcomes(tmp_path_factory):
    tmp_path = tmp_path_factory.mktemp("hostile")
    cases = run_cases(tmp_path) + sweep_cases(tmp_path)
    before = subprocess.run(["git", "status", "--porcelain", "--untracked-files=all"], cwd=ROOT, capture_output=True,
                            text=True, check=False).stdout
    proc = subprocess.run([sys.executable, str(Path(__file__).with_name("fuzz_worker.py"))],
                          input=json.dumps(cases), cwd=tmp_path / "work", capture_output=True, text=True, timeout=900,
                          env={"PATH": "/usr/bin:/bin", "HOME": str(tmp_path), "AIO_CACHE_DIR": str(tmp_path / "c")},
                          check=False)
    assert proc.returncode == 0, proc.stderr[-3000:]
    after = subprocess.run(["git", "status", "--porcelain", "--untracked-files=all"], cwd=ROOT, capture_output=True,
                           text=True, check=False).stdout
    return cases, json.loads(proc.stdout), tmp_path, before, after


# The slow tier: a few hundred commands; each command's own bad-input tests stay in the default tier
@pytest.mark.slow
def test_a_few_hundred_bad_values_each_get_one_line_and_exit_2(outcomes):
    cases, results, _, _, _ = outcomes
    assert len(cases) >= 250
    wrong = [(case, r) for case, r in zip(cases, results, strict=True)
             if r["code"] != 2 or len(r["stderr"].strip().splitlines()) != 1
             or "Traceback" in r["stderr"] or "internal error" in r["stderr"] or ": error: " not in r["stderr"]]
    assert not wrong, "\n".join(f"{c} -> {r['code']}: {r['stderr'][-300:]!r}" for c, r in wrong[:15])


# The slow tier: the same few hundred commands (one fixture); the bad-input tests of loadgen, sweep and the model
# files also check that nothing was written
@pytest.mark.slow
def test_bad_input_writes_nothing_outside_the_output_and_no_partial_line(outcomes):
    _, _, tmp_path, before, after = outcomes
    assert before == after                                          # nothing in the source tree
    work = tmp_path / "work"
    assert {p.name for p in work.iterdir()} <= {"weights.txt", "a-folder", "out"}
    for results in tmp_path.rglob("results.jsonl"):                 # nothing was measured: no line at all
        assert results.read_text() == ""


def test_a_cache_folder_that_is_a_file_is_named_not_an_internal_error(tmp_path):
    from conftest import run_cli

    cache = tmp_path / "cache"
    cache.write_text("a file")
    proc = run_cli(["-m", "aio_examples", "run", "squeezenet", "--backend", "onnxruntime", "--input-size", "32",
                    "--timeout", "0.3", "--output", str(tmp_path / "out")], env={"AIO_CACHE_DIR": str(cache)})
    assert proc.returncode == 2, proc.stderr[-1500:]
    assert f"AIO_CACHE_DIR={str(cache)!r} is not a folder this user can write" in proc.stderr.strip().splitlines()[-1]


def test_a_history_label_is_one_line_of_text(tmp_path):
    from conftest import run_cli

    from aio_examples.core import records as res

    res.append(tmp_path, res.Result(model="m", task="t", backend="eager", precision="fp32", batch_size=1, threads=1,
                                    input_shape={}))
    db = tmp_path / "h.sqlite"
    proc = run_cli(["-m", "aio_examples", "history", "add", str(tmp_path), "--history", str(db), "--label",
                    "night\nhistory:99 forged"])
    assert proc.returncode == 2 and "--label" in proc.stderr and "one line of printable text" in proc.stderr
    listed = run_cli(["-m", "aio_examples", "history", "list", "--history", str(db)])
    assert "forged" not in listed.stdout


def test_binding_variables_a_plain_run_does_not_use_are_warned_of(tmp_path):
    from conftest import run_cli

    proc = run_cli(["-m", "aio_examples", "run", "squeezenet", "--backend", "eager", "--input-size", "32", "-t", "1",
                    "--timeout", "0.3", "--output", str(tmp_path)], env={"AIO_NUMA_CPUS": "0", "AIO_CPU_BIND": "1"})
    assert proc.returncode == 0, proc.stderr[-1500:]
    warned = [line for line in proc.stderr.splitlines() if line.startswith("aio-examples: warning:")]
    assert len(warned) == 2 and "AIO_NUMA_CPUS='0' is for sweeps" in warned[0] and "AIO_CPU_BIND" in warned[1]


@pytest.mark.parametrize("token", [" ", "", "a b", "x\ty", "<script>"])
def test_the_notebook_refuses_a_token_that_would_not_guard_it(token):
    proc = subprocess.run(["bash", str(ROOT / "start_notebook.sh"), "--token", token, "--port", "18999"], cwd=ROOT,
                          capture_output=True, text=True, timeout=120, check=False)
    assert proc.returncode == 2 and "--token (or JUPYTER_TOKEN)" in proc.stderr, proc.stderr[-800:]
