"""aio and a candidate engine that crashes its process: a real SIGSEGV while ONNX Runtime's strategy exports the
model. The run is started again without it, the record says why it was left out, and it stays out on this CPU
with that engine's version (backends/crashes.py), without costing another crash."""

import os
import sys
import textwrap

import pytest
import torch

from aio_examples import benchmark
from aio_examples.backends import crashes

MODULE = textwrap.dedent('''
    import os
    import signal

    import torch


    class CrashInOnnxExport(torch.nn.Module):
        """Runs everywhere but under the ONNX exporter, which ONNX Runtime's strategy uses: there it segfaults."""

        def __init__(self):
            super().__init__()
            self.linear = torch.nn.Linear(16, 16)

        def forward(self, x):
            if torch.onnx.is_in_onnx_export():
                os.kill(os.getpid(), signal.SIGSEGV)
            return self.linear(x).relu()
''')


@pytest.mark.slow       # tunes aio twice: the second tier keeps the default one under 15 minutes
def test_a_candidate_that_crashes_is_left_out_and_remembered(tmp_path, monkeypatch):
    (tmp_path / "onnx_crash.py").write_text(MODULE)
    monkeypatch.syspath_prepend(str(tmp_path))
    for name, value in {"AIO_CACHE_DIR": str(tmp_path / "cache"), "AIO_TUNE_KNOBS": "0", "AIO_TUNE_SPLIT": "0",
                        "AIO_TUNE_ROWS": "0"}.items():
        monkeypatch.setenv(name, value)
    import onnx_crash

    module = onnx_crash.CrashInOnnxExport().eval()
    try:
        first = benchmark(module, example_inputs=(torch.randn(4, 16),), backend="aio", threads=1, num_runs=10,
                          launcher="process",
                          output=tmp_path / "out")
        assert first.status == "ok" and first.strategy != "onnxruntime", first.reason
        why = first.backend_info["tuning"]["refused"]["onnxruntime"]
        assert "crashed a process with SIGSEGV while preparing CrashInOnnxExport at fp32" in why
        assert crashes.engine_version("onnxruntime") in why
        assert crashes.known("onnxruntime", "CrashInOnnxExport", "fp32") == why
        assert crashes.known("onnxruntime", "CrashInOnnxExport", "bf16") is None     # that graph at that precision
        assert crashes.known("openvino", "CrashInOnnxExport", "fp32") is None
        assert not os.environ.get(crashes.JOURNAL_ENV)
        # a second run (its decision cached, or tuned again where the rounds were busy) does not crash
        again = benchmark(module, example_inputs=(torch.randn(4, 16),), backend="aio", threads=1, num_runs=10,
                          launcher="process")
        assert again.status == "ok" and again.crash is None and again.strategy != "onnxruntime"
    finally:
        sys.modules.pop("onnx_crash", None)
