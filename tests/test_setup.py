"""setup.sh on a fresh machine: where torch comes from, and every requirement resolved for aarch64.

torch's step (`setup.sh --torch-only`) runs for real in a new virtual environment with pip's own configuration
hidden (PIP_CONFIG_FILE=/dev/null, no PIP_* variables), so the only sources of torch are those a test builds: a
PEP 503 index folder given as TORCH_INDEX_URL, and a wheels folder standing for pip's configured sources. The
default tier installs small wheels named torch and torchvision that say which source they came from; the slow
tier installs the real torch wheel from an index folder, and resolves requirements.txt for manylinux_2_28_aarch64
against PyPI. What the whole script asks pip for on each architecture is checked with an interpreter that records
the calls (as tests/test_container.py checks start_notebook.sh).
"""

import base64
import hashlib
import importlib.metadata
import json
import os
import re
import shutil
import socket
import subprocess
import sys
import urllib.error
import urllib.request
import zipfile
from pathlib import Path

import pytest
from conftest import ROOT

SETUP = ROOT / "setup.sh"
PYPI = "https://pypi.org/simple"


def pin(name: str) -> str:
    """The version constraints.txt pins `name` to."""
    return re.search(rf"^{name}==(\S+)$", (ROOT / "constraints.txt").read_text(), re.MULTILINE).group(1)


def make_wheel(folder: Path, name: str, version: str, source: str = "", requires=()) -> Path:
    """A pure-Python wheel whose module says where it was put (`name.SOURCE`), with these Requires-Dist."""
    dist = f"{name}-{version}"
    files = {f"{name}/__init__.py": f"SOURCE = {source!r}\n",
             f"{dist}.dist-info/METADATA": f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n"
                                           + "".join(f"Requires-Dist: {r}\n" for r in requires),
             f"{dist}.dist-info/WHEEL": "Wheel-Version: 1.0\nGenerator: tests\nRoot-Is-Purelib: true\nTag: py3-none-any\n"}
    record = [f"{path},sha256={base64.urlsafe_b64encode(hashlib.sha256(text.encode()).digest()).rstrip(b'=').decode()},"
              f"{len(text.encode())}" for path, text in files.items()] + [f"{dist}.dist-info/RECORD,,"]
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{dist}-py3-none-any.whl"
    with zipfile.ZipFile(path, "w") as whl:
        for name_in, text in files.items():
            whl.writestr(name_in, text)
        whl.writestr(f"{dist}.dist-info/RECORD", "\n".join(record) + "\n")
    return path


def simple_index(root: Path, wheels) -> str:
    """A PEP 503 index folder serving these wheel files (linked, not copied); its file:// URL."""
    for wheel in wheels:
        project = root / re.sub(r"[-_.]+", "-", wheel.name.split("-")[0]).lower()
        project.mkdir(parents=True, exist_ok=True)
        (project / wheel.name).symlink_to(wheel)
        with open(project / "index.html", "a") as page:
            page.write(f'<a href="{urllib.request.pathname2url(wheel.name)}">{wheel.name}</a>\n')
    root.mkdir(parents=True, exist_ok=True)
    return root.as_uri()


def stand_ins(folder: Path, source: str) -> list[Path]:
    """torch and torchvision at constraints.txt's pins, saying `source`."""
    return [make_wheel(folder, "torch", pin("torch"), source), make_wheel(folder, "torchvision", pin("torchvision"), source)]


@pytest.fixture(scope="module")
def template_venv(tmp_path_factory) -> Path:
    """One new virtual environment (with pip), copied for each test: creating one takes seconds."""
    path = tmp_path_factory.mktemp("venv") / "template"
    subprocess.run([sys.executable, "-m", "venv", str(path)], check=True, capture_output=True, timeout=300)
    return path


@pytest.fixture
def venv(template_venv, tmp_path) -> Path:
    path = tmp_path / "venv"
    shutil.copytree(template_venv, path, symlinks=True)
    return path


def run_setup(venv: Path, torch_index_url: str, tmp_path: Path, *, index_url: str | None = None,
              find_links: Path | None = None, args=("--torch-only",), timeout=300) -> subprocess.CompletedProcess:
    """setup.sh with `venv`'s Python, pip's configuration hidden; the configured sources are `index_url` (default:
    an empty index) and `find_links`. pip's log goes to tmp_path/pip.log."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("PIP_")}
    if index_url is None:
        index_url = simple_index(tmp_path / "empty-index", [])
    env.update(PIP_CONFIG_FILE=os.devnull, PIP_DISABLE_PIP_VERSION_CHECK="1", PIP_INDEX_URL=index_url,
               PIP_LOG=str(tmp_path / "pip.log"), PYTHON=str(venv / "bin" / "python"), TORCH_INDEX_URL=torch_index_url)
    if find_links is not None:
        env["PIP_FIND_LINKS"] = str(find_links)
    return subprocess.run(["bash", str(SETUP), *args], env=env, capture_output=True, text=True, timeout=timeout,
                          check=False, cwd=tmp_path)


def installed(venv: Path, code: str) -> str:
    return subprocess.run([str(venv / "bin" / "python"), "-c", code], capture_output=True, text=True, check=True,
                          timeout=120).stdout.strip()


def test_torch_comes_from_the_index_torch_index_url_names(venv, tmp_path):
    index = simple_index(tmp_path / "torch-index", stand_ins(tmp_path / "wheels", "the torch index"))
    out = run_setup(venv, index, tmp_path)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "does not answer" not in out.stdout
    assert installed(venv, "import torch, torchvision; print(torch.SOURCE, '|', torchvision.SOURCE)") == \
        "the torch index | the torch index"
    assert installed(venv, "import importlib.metadata as m; print(m.version('torch'))") == pin("torch")


def test_an_index_that_does_not_answer_costs_one_line_and_the_configured_sources_serve(venv, tmp_path):
    # A server that takes connections and never answers: pip would spend its timeout and retries on each request.
    with socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen(16)
        url = f"http://127.0.0.1:{silent.getsockname()[1]}/whl/cpu"
        stand_ins(tmp_path / "configured", "a configured wheels folder")
        out = run_setup(venv, url, tmp_path, find_links=tmp_path / "configured")
    assert out.returncode == 0, out.stdout + out.stderr
    assert [line for line in out.stdout.splitlines() if url in line] == \
        [f"setup.sh: {url} does not answer; torch comes from pip's configured indexes and wheel folders"]
    assert url not in (tmp_path / "pip.log").read_text()      # never handed to pip
    assert installed(venv, "import torch; print(torch.SOURCE)") == "a configured wheels folder"


def test_without_torch_anywhere_setup_says_where_its_cpu_build_is_published(venv, tmp_path):
    out = run_setup(venv, "", tmp_path)
    assert out.returncode == 1
    assert out.stderr.splitlines()[-1] == (
        f"setup.sh: torch=={pin('torch')} is published on PyTorch's CPU index only: set TORCH_INDEX_URL to it or "
        "to a mirror of it, or put the wheel in a folder pip reads (find-links)")


@pytest.mark.parametrize("args, message", [
    (["--fast"], "setup.sh: unknown option '--fast'; accepted: --dev, --torch-only"),
    (["--dev", "--torch-only"], "setup.sh: one option at most; accepted: --dev, --torch-only"),
])
def test_setup_refuses_bad_options_before_installing_anything(args, message):
    out = subprocess.run(["bash", str(SETUP), *args], capture_output=True, text=True, timeout=30, check=False,
                         env={**os.environ, "PYTHON": "/no/such/python"})
    assert (out.returncode, out.stderr.strip()) == (2, message)


# --- what setup.sh does on each architecture, with an interpreter that only records what it is asked ---

FAKE_PYTHON = r"""#!/bin/bash
# Records each pip call (and a requirements file's lines) in $LOG; pip fails for the names in $FAIL. setup.sh's
# own checks of the interpreter run on $REAL_PYTHON; llama_cpp imports.
[ "$1" = -c ] && [ "$2" != "import llama_cpp" ] && exec "$REAL_PYTHON" "$@"
case "$1 $2" in
    "-m pip")
        shift 2
        echo "pip $*" >> "$LOG"
        for arg; do [ "$prev" = -r ] && sed 's/^/    /' "$arg" >> "$LOG"; prev=$arg; done
        for name in $FAIL; do [ "${@: -1}" = "$name" ] && exit 1; done
        exit 0 ;;
    "-m aio_examples") exit 0 ;;
    "- "*) cat >/dev/null; exit 1 ;;      # the torch index's check: no answer
esac
exit 0
"""


def run_flow(tmp_path: Path, machine: str, fail: str = "") -> tuple[subprocess.CompletedProcess, list[str]]:
    """setup.sh with a recording PYTHON, `uname -m` saying `machine`, and apt-get a no-op; (result, log lines)."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name, text in (("python", FAKE_PYTHON), ("uname", f"#!/bin/sh\necho {machine}\n"),
                       ("apt-get", "#!/bin/sh\nexit 0\n")):
        (bin_dir / name).write_text(text)
        (bin_dir / name).chmod(0o755)
    log = tmp_path / "calls.log"
    out = subprocess.run(["bash", str(SETUP)], capture_output=True, text=True, timeout=60, check=False,
                         env={**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", "PYTHON": str(bin_dir / "python"),
                              "LOG": str(log), "FAIL": fail, "REAL_PYTHON": sys.executable})
    return out, log.read_text().splitlines()


def pip_calls(log: list[str]) -> list[tuple[str, list[str]]]:
    """(pip's arguments, the requirements of the file it was given with -r) of each recorded call."""
    calls = []
    for line in log:
        if line.startswith("pip "):
            calls.append((line.removeprefix("pip "), []))
        elif line.split("#")[0].strip():
            calls[-1][1].append(line.split("#")[0].strip())
    return calls


def test_on_aarch64_the_optional_lines_go_on_their_own_and_a_failing_one_costs_only_its_feature(tmp_path):
    out, log = run_flow(tmp_path, "aarch64", fail="openvino mlcommons-loadgen")
    assert out.returncode == 0, out.stderr
    lines = requirement_lines(ROOT / "requirements.txt")
    optional = [(r, note) for r, note in lines if note]
    calls = pip_calls(log)
    assert [args for args, _ in calls] == [
        "install -q -c constraints.txt torch torchvision",
        next(args for args, _ in calls if " -r " in args),
        *[f"install -q -c constraints.txt {r}" for r, _ in optional],
        "install -q --no-deps -e .", "check"]
    assert next(reqs for args, reqs in calls if " -r " in args) == [r for r, note in lines if not note]
    for requirement, note in optional:
        why, loss = note.split("; without it: ")
        assert f"setup.sh: {requirement} on its own (aarch64: {why})" in out.stdout.splitlines()
        lost = f"setup.sh: {requirement} is not installed (above); without it: {loss}"
        assert (lost in out.stderr.splitlines()) == (requirement in ("openvino", "mlcommons-loadgen"))


def test_on_x86_64_every_requirement_goes_in_one_step(tmp_path):
    out, log = run_flow(tmp_path, "x86_64")
    assert out.returncode == 0, out.stderr
    calls = pip_calls(log)
    assert [args for args, _ in calls] == ["install -q -c constraints.txt torch torchvision",
                                           "install -q -r requirements.txt -c constraints.txt",
                                           "install -q --no-deps -e .", "check"]
    assert calls[1][1] == [r for r, _ in requirement_lines(ROOT / "requirements.txt")]
    assert "on its own" not in out.stdout


def test_setup_refuses_an_interpreter_that_does_not_run():
    out = subprocess.run(["bash", str(SETUP)], capture_output=True, text=True, timeout=30, check=False,
                         env={**os.environ, "PYTHON": "/no/such/python"})
    assert (out.returncode, out.stderr.strip()) == (
        2, "setup.sh: PYTHON '/no/such/python' does not run; accepted: a Python 3.11 or newer (default python3)")


def test_a_systems_own_python_is_refused_with_the_way_to_a_virtual_environment():
    system = Path("/usr/bin/python3")
    check = ("import os, sys, sysconfig; sys.exit(sys.version_info < (3, 11) or not os.path.isfile("
             "os.path.join(sysconfig.get_path('stdlib'), 'EXTERNALLY-MANAGED')))")
    if not system.exists() or subprocess.run([str(system), "-c", check], check=False).returncode != 0:
        pytest.skip(f"{system} is not a Python 3.11+ that its distribution manages (PEP 668)")
    env = {k: v for k, v in os.environ.items() if k != "PIP_BREAK_SYSTEM_PACKAGES"}
    out = subprocess.run(["bash", str(SETUP)], capture_output=True, text=True, timeout=30, check=False,
                         env={**env, "PYTHON": str(system)})
    assert out.returncode == 1
    assert out.stderr.strip().startswith(f"setup.sh: {system} is the system's Python, which pip does not install "
                                         f"into (PEP 668); run setup.sh in a virtual environment: {system} -m venv")


# --- the real torch wheel (slow: it unpacks about a GB) ---

def local_torch_wheel() -> Path | None:
    """This machine's torch wheel at the pinned version, from pip's find-links folders."""
    folders = os.environ.get("PIP_FIND_LINKS", "").split()
    config = subprocess.run([sys.executable, "-m", "pip", "config", "list"], capture_output=True, text=True,
                            check=False).stdout
    folders += [f for line in config.splitlines() if ".find-links=" in line
                for f in line.split("=", 1)[1].strip("'\"").split()]
    tag = f"cp{sys.version_info.major}{sys.version_info.minor}"
    for folder in folders:
        for wheel in Path(folder.removeprefix("file://")).glob(f"torch-{pin('torch')}-{tag}-{tag}-*.whl"):
            if os.uname().machine in wheel.name:
                return wheel
    return None


def answers(url: str) -> bool:
    try:
        urllib.request.urlopen(url, timeout=10).close()
    except urllib.error.HTTPError:
        pass
    except OSError:
        return False
    return True


@pytest.mark.slow
def test_the_real_torch_wheel_comes_from_torch_index_url(venv, tmp_path):
    wheel = local_torch_wheel()
    if wheel is None:
        pytest.skip(f"no torch {pin('torch')} wheel for this machine in pip's find-links folders to build an index of")
    if not answers(f"{PYPI}/pip/"):
        pytest.skip(f"{PYPI} does not answer: torch's dependencies and torchvision come from there")
    index = simple_index(tmp_path / "torch-index", [wheel])
    # The configured source is PyPI only, which has no +cpu torch: torch can only come from the index.
    out = run_setup(venv, index, tmp_path, index_url=PYPI, timeout=1200)
    assert out.returncode == 0, out.stdout + out.stderr
    assert installed(venv, "import torch; print(torch.__version__)") == pin("torch")
    sources = re.findall(r"Added torch(?:==\S+)? from (\S+)", (tmp_path / "pip.log").read_text())
    assert sources == [f"{index}/torch/{urllib.request.pathname2url(wheel.name)}"]


# --- every requirement resolved for aarch64 (slow: resolves the whole stack against PyPI) ---

# The oldest glibc torch's aarch64 wheel takes, and the tags pip accepts there.
AARCH64_GLIBC = 28


def aarch64_platforms(glibc: int) -> list[str]:
    return ["manylinux2014_aarch64"] + [f"manylinux_2_{minor}_aarch64" for minor in range(17, glibc + 1)]


def requirement_lines(path: Path) -> list[tuple[str, str]]:
    """(requirement, note after `# aarch64 optional:` or '') of each line of a requirements file."""
    lines = []
    for line in path.read_text().splitlines():
        requirement, _, comment = line.partition("#")
        if requirement.strip():
            note = comment.partition("aarch64 optional:")[2].strip()
            lines.append((requirement.strip(), note))
    return lines


def resolve(requirements: list[str], glibc: int, tmp_path: Path, deps=True) -> subprocess.CompletedProcess:
    """pip's resolution of `requirements` for CPython 3.11 on aarch64 with this glibc, wheels only, against PyPI,
    with constraints.txt; torch is a stand-in wheel with torch's dependencies (it comes from the torch index)."""
    stand_in = tmp_path / "torch-stand-in"
    if not stand_in.is_dir():
        make_wheel(stand_in, "torch", pin("torch"), requires=importlib.metadata.requires("torch") or [])
    env = {k: v for k, v in os.environ.items() if not k.startswith("PIP_")}
    env.update(PIP_CONFIG_FILE=os.devnull, PIP_DISABLE_PIP_VERSION_CHECK="1")
    platforms = [arg for p in aarch64_platforms(glibc) for arg in ("--platform", p)]
    return subprocess.run(
        [sys.executable, "-m", "pip", "install", "--dry-run", "--ignore-installed", "--quiet", "--target",
         str(tmp_path / "target"), "--index-url", PYPI, "--find-links", str(stand_in), "--python-version", "3.11",
         "--implementation", "cp", "--only-binary=:all:", *platforms, "-c", str(ROOT / "constraints.txt"),
         *([] if deps else ["--no-deps"]), *requirements],
        env=env, capture_output=True, text=True, timeout=1200, check=False)


def last_error(out: subprocess.CompletedProcess) -> str:
    return next((line for line in reversed(out.stderr.splitlines()) if line.startswith("ERROR")), out.stderr[-300:])


@pytest.mark.slow
def test_every_requirement_resolves_for_manylinux_2_28_aarch64_or_says_why_not(tmp_path):
    if not answers(f"{PYPI}/pip/"):
        pytest.skip(f"{PYPI} does not answer")
    lines = requirement_lines(ROOT / "requirements.txt") + requirement_lines(ROOT / "requirements-dev.txt")
    # torch and torchvision: setup.sh's torch step, from the torch index; the optional lines: their own step
    torch_step = {"torch", "torchvision"}
    rest = [r for r, note in lines if not note and re.split(r"[<>=!~\[ ;]", r)[0] not in torch_step]
    optional = [(r, note) for r, note in lines if note]
    assert rest and optional

    out = resolve(rest, AARCH64_GLIBC, tmp_path)
    if out.returncode != 0:       # which ones: each on its own
        failures = {r: last_error(o) for r in rest if (o := resolve([r], AARCH64_GLIBC, tmp_path)).returncode != 0}
        pytest.fail(f"no manylinux_2_{AARCH64_GLIBC}_aarch64 resolution for {sorted(failures) or 'the set'} "
                    f"(mark them `# aarch64 optional:` in requirements.txt if setup.sh should go on without them):\n"
                    + "\n".join(f"  {r}: {e}" for r, e in failures.items()) + ("" if failures else last_error(out)))

    stale = []
    for requirement, note in optional:
        at_28 = resolve([requirement], AARCH64_GLIBC, tmp_path, deps=False)
        if at_28.returncode == 0:
            stale.append(f"{requirement} has a manylinux_2_{AARCH64_GLIBC}_aarch64 wheel now: its note is stale")
        glibc = re.search(r"manylinux_2_(\d+)", note)
        if glibc:            # a wheel at the glibc the note names
            newer = resolve([requirement], int(glibc.group(1)), tmp_path, deps=False)
            if newer.returncode != 0:
                stale.append(f"{requirement}: no wheel at manylinux_2_{glibc.group(1)} as its note says: "
                             f"{last_error(newer)}")
        else:                # a source build: PyPI has the pinned release's source distribution
            assert "built from source" in note, f"{requirement}: the note names neither a glibc nor a source build"
            page = urllib.request.Request(f"{PYPI}/{requirement}/", headers={"Accept": "application/vnd.pypi.simple.v1+json"})
            with urllib.request.urlopen(page, timeout=60) as r:       # PEP 691: the index page as JSON
                files = [f["filename"] for f in json.load(r)["files"]]
            if not any(re.search(rf"-{re.escape(pin(requirement))}\.(tar\.gz|zip)$", f) for f in files):
                stale.append(f"{requirement} {pin(requirement)} has no source distribution on PyPI to build")
    assert not stale, "\n".join(stale)


def test_requirement_notes_are_what_setup_sh_reads():
    """setup.sh's own sed command and this test's parser find the same optional lines, each with why and a loss."""
    script = re.search(r"sed -n '([^']*aarch64 optional[^']*)' requirements.txt", SETUP.read_text()).group(1)
    sed = subprocess.run(["sed", "-n", script, str(ROOT / "requirements.txt")], capture_output=True, text=True,
                         check=True).stdout
    parsed = [(r, note) for r, note in requirement_lines(ROOT / "requirements.txt") if note]
    assert [line.split(" ", 1) for line in sed.splitlines()] == [[r, n] for r, n in parsed]
    for requirement, note in parsed:
        why, sep, loss = note.partition("; without it: ")
        assert why and sep and loss, f"{requirement}: the note needs 'WHY; without it: WHAT' ({note!r})"
