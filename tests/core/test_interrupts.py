"""Ctrl-C and SIGTERM always stop a run, keep what was measured, and say so; real signals, real processes."""

import json
import signal
import subprocess
import sys
import time

import pytest
from conftest import ROOT

RUN = [sys.executable, "-m", "aio_examples", "run", "squeezenet", "--backend", "eager", "--input-size", "32", "-t",
       "1", "--timeout", "600", "--json"]


def start_and_wait_for_measuring(args):
    proc = subprocess.Popen(args, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    lines = []
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        line = proc.stderr.readline()
        lines.append(line)
        if "measuring" in line or not line:
            break
    time.sleep(2)                            # some passes measured
    return proc, lines


# The slow tier: a second signal through a whole command; run.py's Ctrl-C test (tests/cli/test_cli.py) keeps "an
# interrupt keeps what was measured" in the default tier
@pytest.mark.slow
def test_sigterm_while_measuring_keeps_the_measurement_and_exits_143(tmp_path):
    proc, _ = start_and_wait_for_measuring([*RUN, "--output", str(tmp_path)])
    proc.send_signal(signal.SIGTERM)
    _, stderr = proc.communicate(timeout=120)
    assert proc.returncode == 143, stderr[-1500:]
    assert "terminated (SIGTERM); records already written are kept" in stderr
    [record] = [json.loads(line) for line in (tmp_path / "results.jsonl").read_text().splitlines()]
    assert record["stop_reason"] == "interrupted" and len(record["samples_ms"]) > 10
    assert any("interrupted after" in w for w in record["warnings"])


@pytest.mark.slow       # the same as tests/cli/test_cli.py's Ctrl-C through run.py, through the CLI
def test_ctrl_c_while_measuring_keeps_the_measurement_and_exits_130(tmp_path):
    proc, _ = start_and_wait_for_measuring([*RUN, "--output", str(tmp_path)])
    proc.send_signal(signal.SIGINT)
    _, stderr = proc.communicate(timeout=120)
    assert proc.returncode == 130 and "interrupted; records already written are kept" in stderr
    [record] = [json.loads(line) for line in (tmp_path / "results.jsonl").read_text().splitlines()]
    assert record["stop_reason"] == "interrupted"


SWALLOWED = """
import os, signal, sys, time
import torch
from aio_examples import benchmark

class Swallows(torch.nn.Module):
    calls = 0

    def forward(self, x):
        Swallows.calls += 1
        if Swallows.calls == 2:          # the first call while the backend prepares (tracing)
            try:
                os.kill(os.getpid(), signal.SIGINT)
                time.sleep(1)
            except KeyboardInterrupt:    # what a library that catches everything does
                pass
        return x * 2

try:
    benchmark(Swallows(), example_inputs=(torch.ones(8),), backend="torchscript", timeout=30, output=sys.argv[1])
    print("went on")
except KeyboardInterrupt:
    print("stopped")
"""


# The slow tier: a whole command interrupted while preparing; run.py's Ctrl-C test (tests/cli/test_cli.py) stays in
# the default tier
@pytest.mark.slow
def test_a_ctrl_c_a_library_swallows_while_preparing_still_stops_the_run(tmp_path):
    started = time.monotonic()
    proc = subprocess.run([sys.executable, "-c", SWALLOWED, str(tmp_path)], cwd=ROOT, capture_output=True,
                          text=True, timeout=300, check=False)
    assert proc.stdout.strip() == "stopped", proc.stderr[-1500:]
    assert time.monotonic() - started < 30                # not after a whole measurement
    assert not (tmp_path / "results.jsonl").exists()      # nothing was measured, nothing claims it was


DEFERRED = """
import os, signal, time
from aio_examples.core import interrupts
with interrupts.stop_on_signals():
    with interrupts.deferred():
        os.kill(os.getpid(), signal.SIGINT)          # delivered at the next bytecode: only remembered
        time.sleep(0.05)
        try:
            interrupts.check()
            print("check did not answer it")
        except KeyboardInterrupt:
            print("answered by check")
        try:
            os.kill(os.getpid(), signal.SIGTERM)     # a second signal does not wait for the next check
            time.sleep(2)
            print("only remembered")
        except interrupts.Terminated:
            print("raised at once")
    print("outer handler back" if signal.getsignal(signal.SIGINT) is interrupts._handler else "handler lost")
"""


def test_a_deferred_ctrl_c_waits_for_the_loops_check_and_a_second_one_stops_at_once():
    # its own process: a signal sent to pytest's would reach whichever of its libraries' threads the kernel picks
    proc = subprocess.run([sys.executable, "-c", DEFERRED], cwd=ROOT, capture_output=True, text=True, timeout=120,
                          check=False)
    assert proc.stdout.split("\n")[:3] == ["answered by check", "raised at once", "outer handler back"], \
        proc.stdout + proc.stderr[-1500:]
