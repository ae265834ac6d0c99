"""Benchmark whisper_tiny (speech-recognition). Try: python3 run.py --help"""

from aio_examples.cli import run_model

raise SystemExit(run_model("whisper_tiny"))
