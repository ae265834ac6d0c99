"""Benchmark unet_sd (image-generation). Try: python3 run.py --help"""

from aio_examples.cli import run_model

raise SystemExit(run_model("unet_sd"))
