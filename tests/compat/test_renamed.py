"""Release 0.1's module paths still import for one release, warning with the new path."""

import importlib
import json
import subprocess
import sys

import pytest

from aio_examples.compat.renamed import RENAMED

# Every old path imported once, in one fresh interpreter (none of them imported before): what each warned.
FRESH_IMPORTS = """
import importlib, json, sys, warnings
said = {}
for old in sys.argv[1:]:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", DeprecationWarning)
        importlib.import_module("aio_examples." + old)
    said[old] = [str(w.message) for w in caught if issubclass(w.category, DeprecationWarning)]
print(json.dumps(said))
"""


@pytest.fixture(scope="module")
def warned():
    proc = subprocess.run([sys.executable, "-c", FRESH_IMPORTS, *sorted(RENAMED)], capture_output=True, text=True,
                          timeout=300, check=False)
    assert proc.returncode == 0, proc.stderr[-1500:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("old", sorted(RENAMED))
def test_an_old_path_gives_the_new_module_and_says_where_it_went(old, warned):
    assert any(f"aio_examples.{old} moved to aio_examples.{RENAMED[old][0]}" in w for w in warned[old]), warned[old]


def test_a_moved_module_is_the_same_module_and_a_split_one_offers_the_names_of_its_parts():
    with pytest.warns(DeprecationWarning):
        old_report = importlib.import_module("aio_examples.report")
    from aio_examples.reporting import report

    assert old_report is report
    with pytest.warns(DeprecationWarning):
        from aio_examples import compare as old_compare
    from aio_examples.analysis.compare import compare
    from aio_examples.analysis.history import load_run
    from aio_examples.analysis.runs import Run
    from aio_examples.reporting.regression import render

    assert (old_compare.compare, old_compare.Run, old_compare.render, old_compare.load_run) == (
        compare, Run, render, load_run)
