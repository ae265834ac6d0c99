"""Benchmark vit_b_16 (image-classification). Try: python3 run.py --help"""

from aio_examples.cli import run_model

raise SystemExit(run_model("vit_b_16"))
