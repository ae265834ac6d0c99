#!/usr/bin/env bash
# Runs the model-zoo sweep and writes the report. Not built yet: the sweep issue
# ("Sweeps, core binding with numactl, multi-instance throughput, run_all.sh") fills it in.
# Until then, measure one model at a time:  cd classification/resnet_50_v1 && python3 run.py -p fp32
echo "run_all.sh is not implemented yet (see the sweeps issue); use a model's run.py" >&2
exit 3
