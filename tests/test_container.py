"""The container files, statically: hadolint, `docker-compose config`, what the image and services promise.

The real build and run is scripts/container_smoke.sh (its own CI tier); here only what needs no engine.
"""

import os
import re
import shutil
import subprocess

import pytest
import yaml
from conftest import ROOT

DOCKERFILE = ROOT / "Dockerfile"
SMOKE = ROOT / "scripts" / "container_smoke.sh"


def instructions(text: str) -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) of a Dockerfile, continuation lines joined, comments dropped."""
    joined = re.sub(r"\\\n", " ", "\n".join(line for line in text.splitlines() if not line.lstrip().startswith("#")))
    return [(line.split(None, 1)[0].upper(), line.split(None, 1)[1] if " " in line.strip() else "")
            for line in joined.splitlines() if line.strip()]


def final_stage(text: str) -> list[tuple[str, str]]:
    ins = instructions(text)
    last_from = max(i for i, (name, _) in enumerate(ins) if name == "FROM")
    return ins[last_from:]


# --- hadolint ---

needs_hadolint = pytest.mark.skipif(shutil.which("hadolint") is None,
                                    reason="hadolint is missing (pip install -r requirements-dev.txt)")


def hadolint(path) -> subprocess.CompletedProcess:
    return subprocess.run(["hadolint", "--no-color", "--config", str(ROOT / ".hadolint.yaml"), str(path)],
                          capture_output=True, text=True, check=False)


@needs_hadolint
def test_hadolint_passes_the_dockerfile_with_only_the_documented_ignores():
    out = hadolint(DOCKERFILE)
    assert out.returncode == 0, out.stdout + out.stderr
    config = yaml.safe_load((ROOT / ".hadolint.yaml").read_text())
    assert config["failure-threshold"] == "info"
    lines = (ROOT / ".hadolint.yaml").read_text().splitlines()
    for rule in config["ignored"]:
        at = next(i for i, line in enumerate(lines) if line.strip() == f"- {rule}")
        assert lines[at - 1].lstrip().startswith("#"), f"{rule} is ignored without a reason above it"


@needs_hadolint
def test_hadolint_still_reports_what_the_ignore_list_does_not_cover(tmp_path):
    # A pip cache left in a layer and a root final user: the settings must not hide these.
    bad = DOCKERFILE.read_text().replace("pip install --no-cache-dir -r", "pip install -r") + "USER root\n"
    (tmp_path / "Dockerfile").write_text(bad)
    out = hadolint(tmp_path / "Dockerfile")
    assert out.returncode != 0
    assert "DL3042" in out.stdout and "DL3002" in out.stdout, out.stdout


# --- docker-compose ---

needs_compose = pytest.mark.skipif(shutil.which("docker-compose") is None,
                                   reason="docker-compose is missing (Debian: apt-get install docker-compose)")
COMPOSE_VARS = ("AIO_IMAGE", "AIO_CPUSET", "AIO_PRIVILEGED", "AIO_USER", "AIO_NOTEBOOK_ADDR", "AIO_NOTEBOOK_PORT",
                "JUPYTER_TOKEN")


def run_compose_config(**env) -> subprocess.CompletedProcess:
    """`docker-compose config` with only these of the file's variables set."""
    clean = {k: v for k, v in os.environ.items() if k not in COMPOSE_VARS}
    return subprocess.run(["docker-compose", "-f", str(ROOT / "docker-compose.yml"), "config"], cwd=ROOT,
                          env={**clean, **env}, capture_output=True, text=True, check=False)


def compose_config(**env) -> dict:
    out = run_compose_config(**env)
    assert out.returncode == 0, out.stderr
    return yaml.safe_load(out.stdout)["services"]


@needs_compose
def test_compose_defaults_notebook_on_8080_with_token_and_bench_writing_to_results():
    services = compose_config(JUPYTER_TOKEN="s3cret")
    assert set(services) == {"notebook", "bench"}
    nb, bench = services["notebook"], services["bench"]
    assert nb["command"][:2] == ["bash", "start_notebook.sh"]
    assert nb["command"][nb["command"].index("--ip") + 1] == "0.0.0.0"
    assert nb["environment"]["JUPYTER_TOKEN"] == "s3cret"
    assert nb["ports"] == ["127.0.0.1:8080:8080/tcp"]
    assert bench["command"] == ["bash", "run_all.sh"]
    for svc in (nb, bench):
        assert svc["image"] == "aio-examples:latest"
        assert svc["cap_add"] == ["SYS_NICE"]
        assert svc["privileged"] is False
        assert svc["cpuset"] == ""          # every CPU
        assert svc["user"] == "1000"
        mounts = [v.split(":") for v in svc["volumes"]]
        assert [m[1] for m in mounts if m[0] == str(ROOT / "results")] == ["/workspace/aio-examples/results"]


@needs_compose
def test_compose_takes_cpuset_privileged_user_and_port_from_the_environment():
    services = compose_config(AIO_CPUSET="0-1", AIO_PRIVILEGED="true", AIO_USER="0", AIO_NOTEBOOK_PORT="9999",
                              AIO_NOTEBOOK_ADDR="0.0.0.0", AIO_IMAGE="registry.example/aio:1")
    for svc in services.values():
        assert (svc["cpuset"], svc["privileged"], svc["user"], svc["image"]) == ("0-1", True, "0",
                                                                               "registry.example/aio:1")
    assert services["notebook"]["ports"] == ["0.0.0.0:9999:8080/tcp"]
    assert services["notebook"]["environment"]["JUPYTER_TOKEN"] == ""    # start_notebook.sh generates one


@needs_compose
def test_compose_refuses_a_privileged_value_that_is_not_a_boolean():
    out = run_compose_config(AIO_PRIVILEGED="maybe")
    assert out.returncode != 0 and "privileged" in out.stderr


# --- what the Dockerfile promises ---

def test_dockerfile_base_is_the_one_the_smoke_script_makes_or_pulls():
    base = final_stage(DOCKERFILE.read_text())[0][1]
    smoke_base = re.search(r"^BASE=(\S+)$", SMOKE.read_text(), re.MULTILINE).group(1)
    assert base == smoke_base == "docker.io/library/python:3.11-slim-bookworm"


def test_dockerfile_installs_dependencies_before_the_code_and_pins_nothing_itself():
    text = DOCKERFILE.read_text()
    stage = final_stage(text)
    names = [name for name, _ in stage]
    deps_copy = names.index("COPY")
    assert stage[deps_copy][1].split()[-3:] == ["requirements.txt", "constraints.txt", "./"]
    pip_run = next(i for i, (name, args) in enumerate(stage) if name == "RUN" and "-r" in args and "pip install" in args)
    code_copy = next(i for i, (name, args) in enumerate(stage) if name == "COPY" and args.split()[-2:] == [".", "."])
    assert deps_copy < pip_run < code_copy
    # Versions come from constraints.txt, so the image cannot drift from `setup.sh`.
    torch_pin = re.search(r"^torch==(\S+)$", (ROOT / "constraints.txt").read_text(), re.MULTILINE).group(1)
    assert torch_pin.split("+")[0] not in text


def test_dockerfile_runs_as_a_numeric_non_root_user_and_serves_8080_on_every_interface():
    stage = final_stage(DOCKERFILE.read_text())
    users = [args for name, args in stage if name == "USER"]
    assert users and users[-1].split(":")[0] == "1000"
    assert ("EXPOSE", "8080") in stage
    assert ("WORKDIR", "/workspace/aio-examples") in stage
    env = " ".join(args for name, args in stage if name == "ENV")
    assert "AIO_NOTEBOOK_IP=0.0.0.0" in env
    # podman's default image format ignores SHELL: the RUN lines must not need it.
    assert "SHELL" not in [name for name, _ in stage]


def test_dockerignore_keeps_history_results_and_caches_out_of_the_image():
    patterns = {line.strip() for line in (ROOT / ".dockerignore").read_text().splitlines()
                if line.strip() and not line.startswith("#")}
    assert {".git", "**/results", "**/__pycache__", "*.egg-info"} <= patterns


# --- start_notebook.sh's address, as the image sets it ---

@pytest.fixture
def fake_python(tmp_path):
    """A PYTHON for start_notebook.sh that prints the server command instead of starting JupyterLab."""
    fake = tmp_path / "python"
    fake.write_text('#!/bin/sh\n[ "$1" = -m ] && echo "SERVER $*"\nexit 0\n')
    fake.chmod(0o755)
    return fake


@pytest.mark.parametrize("env, args, ip", [
    ({}, [], "127.0.0.1"),
    ({"AIO_NOTEBOOK_IP": "0.0.0.0"}, [], "0.0.0.0"),
    ({"AIO_NOTEBOOK_IP": "0.0.0.0"}, ["--ip", "127.0.0.1"], "127.0.0.1"),
])
def test_start_notebook_address_is_ip_flag_then_environment_then_loopback(fake_python, env, args, ip):
    clean = {k: v for k, v in os.environ.items() if k not in ("AIO_NOTEBOOK_IP", "JUPYTER_TOKEN")}
    out = subprocess.run(["bash", str(ROOT / "start_notebook.sh"), "--token", "t0ken", "--threads", "1", *args],
                         env={**clean, **env, "PYTHON": str(fake_python)}, capture_output=True, text=True,
                         check=False)
    assert out.returncode == 0, out.stderr
    server = next(line for line in out.stdout.splitlines() if line.startswith("SERVER"))
    assert f"--ip={ip}" in server.split()


# --- the smoke script refuses bad arguments before touching any engine ---

@pytest.mark.parametrize("args, message", [
    (["--cpus", "0-x"], "--cpus '0-x' is invalid; accepted: a CPU list"),
    (["--wheels", "/no/such/folder"], "--wheels '/no/such/folder' is not a folder"),
    (["--certs", "/no/such/folder"], "--certs '/no/such/folder' is not a folder"),
    (["--fast"], "unknown option '--fast'; accepted:"),
])
def test_container_smoke_refuses_bad_arguments(args, message):
    out = subprocess.run(["bash", str(SMOKE), *args], capture_output=True, text=True, check=False, timeout=30)
    assert out.returncode == 2
    assert message in out.stderr
