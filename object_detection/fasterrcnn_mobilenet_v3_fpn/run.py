"""Benchmark fasterrcnn_mobilenet_v3_fpn (object-detection). Try: python3 run.py --help"""

from aio_examples.cli import run_model

raise SystemExit(run_model("fasterrcnn_mobilenet_v3_fpn"))
