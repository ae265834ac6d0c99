"""Benchmark llama_3_2_1b (text-generation). Try: python3 run.py --help"""

from aio_examples.cli import run_model

raise SystemExit(run_model("llama_3_2_1b"))
