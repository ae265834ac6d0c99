"""No library the harness drives reports usage: a real OpenVINO conversion and NNCF int8 with a fresh home."""

import subprocess
import sys

import pytest
from conftest import ROOT

pytest.importorskip("openvino")

CONVERT = """
import sys, torch
from aio_examples import benchmark

class Tiny(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = torch.nn.Conv2d(3, 4, 3)

    def forward(self, x):
        return self.conv(x).relu()

for precision in ("fp32", "int8"):
    r = benchmark(Tiny().eval(), example_inputs=(torch.randn(1, 3, 16, 16),), backend="openvino",
                  precision=precision, num_runs=3)
    print(precision, r.status, r.reason)
"""


# The slow tier: OpenVINO's conversion and NNCF's quantization in a fresh home, a whole command
@pytest.mark.slow
def test_openvino_conversion_and_nncf_leave_nothing_in_home_and_send_nothing(tmp_path):
    home = tmp_path / "home"
    home.mkdir()
    env = {"HOME": str(home), "PATH": "/usr/bin:/bin", "AIO_CACHE_DIR": str(tmp_path / "cache")}
    proc = subprocess.run([sys.executable, "-c", CONVERT], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=600, check=False)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "fp32 ok" in proc.stdout, proc.stdout
    assert not (home / "intel").exists(), sorted(map(str, (home / "intel").rglob("*")))
