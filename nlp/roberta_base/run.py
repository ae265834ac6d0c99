"""Benchmark roberta_base (fill-mask). Try: python3 run.py --help"""

from aio_examples.cli import run_model

raise SystemExit(run_model("roberta_base"))
