"""Benchmark yolo_v8s (object-detection). Try: python3 run.py --help"""

from aio_examples.cli import run_model

raise SystemExit(run_model("yolo_v8s"))
