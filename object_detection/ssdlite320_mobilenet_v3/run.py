"""Benchmark ssdlite320_mobilenet_v3 (object-detection). Try: python3 run.py --help"""

from aio_examples.cli import run_model

raise SystemExit(run_model("ssdlite320_mobilenet_v3"))
