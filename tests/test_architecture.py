"""The layers of docs/architecture.md hold: import-linter's contracts pass, break when a lower layer imports a
higher one, and the package has no import cycle."""

import shutil
import subprocess
import sys
import tomllib

import grimp
from conftest import ROOT


def lint_imports(cwd, config):
    code = "from importlinter.cli import lint_imports_command; lint_imports_command()"
    return subprocess.run([sys.executable, "-c", code, str(config), "--no-cache"], cwd=cwd, capture_output=True,
                          text=True, timeout=300, env={"PYTHONPATH": str(cwd), "PATH": "/usr/bin:/bin"}, check=False)


def test_the_import_contracts_are_kept():
    proc = lint_imports(ROOT, ROOT / "pyproject.toml")
    assert proc.returncode == 0, proc.stdout[-3000:]
    assert "broken" not in proc.stdout.split("Contracts:")[-1].replace("0 broken", "")


def test_a_lower_layer_importing_a_higher_one_breaks_the_contract(tmp_path):
    shutil.copytree(ROOT / "aio_examples", tmp_path / "aio_examples", ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(ROOT / "pyproject.toml", tmp_path / "pyproject.toml")
    paths = tmp_path / "aio_examples" / "core" / "paths.py"
    paths.write_text(paths.read_text() + "\n\ndef _report():\n    from ..reporting import report\n\n    return report\n")
    proc = lint_imports(tmp_path, tmp_path / "pyproject.toml")
    assert proc.returncode == 1, proc.stdout[-3000:]
    assert "aio_examples.core.paths -> aio_examples.reporting.report" in proc.stdout


def test_every_package_folder_is_a_layer_of_the_contract():
    layers = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]["contracts"][0]["layers"]
    folders = {f"aio_examples.{p.parent.name}" for p in (ROOT / "aio_examples").glob("*/__init__.py")}
    modules = {f"aio_examples.{p.stem}" for p in (ROOT / "aio_examples").glob("*.py") if not p.stem.startswith("_")}
    assert folders <= set(layers), f"folders outside the layers: {sorted(folders - set(layers))}"
    assert modules - set(layers) == set(), f"top-level modules outside the layers: {sorted(modules - set(layers))}"


def test_the_package_has_no_import_cycle():
    graph = grimp.build_graph("aio_examples")
    edges = {m: graph.find_modules_directly_imported_by(m) for m in graph.modules}
    index, low, stack, on_stack, cycles = {}, {}, [], set(), []

    def visit(m):            # Tarjan's strongly connected components: a component of two or more is a cycle
        index[m] = low[m] = len(index)
        stack.append(m)
        on_stack.add(m)
        for n in edges[m]:
            if n not in index:
                visit(n)
                low[m] = min(low[m], low[n])
            elif n in on_stack:
                low[m] = min(low[m], index[n])
        if low[m] == index[m]:
            component = []
            while True:
                n = stack.pop()
                on_stack.discard(n)
                component.append(n)
                if n == m:
                    break
            if len(component) > 1:
                cycles.append(sorted(component))

    sys.setrecursionlimit(10_000)
    for m in sorted(graph.modules):
        if m not in index:
            visit(m)
    assert cycles == []
