"""Benchmark retinanet_resnet50_fpn (object-detection). Try: python3 run.py --help"""

from aio_examples.cli import run_model

raise SystemExit(run_model("retinanet_resnet50_fpn"))
