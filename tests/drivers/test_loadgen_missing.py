"""Without LoadGen (aarch64 builds it from source, which may fail) the serving scenarios say so before starting."""

import sys

import pytest

from aio_examples.core.errors import SetupError
from aio_examples.drivers.loadgen import Session


def test_a_session_without_loadgen_says_how_to_install_it_before_any_instance_starts(monkeypatch, tmp_path):
    monkeypatch.setitem(sys.modules, "mlperf_loadgen", None)      # what Python does for a module it cannot import
    with pytest.raises(SetupError, match=r"need MLPerf LoadGen, which cannot be imported .*"
                                         r"pip install -c constraints.txt mlcommons-loadgen"):
        Session("squeezenet", "eager", "fp32", 1, 1, 1, tmp_path)
    assert list(tmp_path.iterdir()) == []
