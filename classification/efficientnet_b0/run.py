"""Benchmark efficientnet_b0 (image-classification). Try: python3 run.py --help"""

from aio_examples.cli import run_model

raise SystemExit(run_model("efficientnet_b0"))
