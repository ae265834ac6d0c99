"""Benchmark resnet_18 (image-classification). Try: python3 run.py --help"""

from aio_examples.cli import run_model

raise SystemExit(run_model("resnet_18"))
