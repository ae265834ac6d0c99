#!/usr/bin/env bash
# Set up aio-examples on this machine: the CPU build of torch first (so no CUDA wheel is ever
# pulled), then the rest of the stack, then the package itself, then a check of the install.
#   bash setup.sh          # runtime
#   bash setup.sh --dev    # + test tools
set -euo pipefail
cd "$(dirname "$0")"
PY=${PYTHON:-python3}

# A C compiler and binutils adapt torchvision's CUDA wheel to CPU torch (aio_examples/compat).
if ! command -v cc >/dev/null || ! command -v nm >/dev/null; then
    if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
        apt-get update -qq && apt-get install -y -qq gcc binutils >/dev/null
    else
        echo "setup.sh: gcc and binutils are needed (or torchvision's CPU build)" >&2
    fi
fi

"$PY" -m pip install -q -c constraints.txt "torch==2.13.0+cpu"
"$PY" -m pip install -q -r requirements.txt -c constraints.txt
"$PY" -m pip install -q --no-deps -e .
if [ "${1:-}" = "--dev" ]; then
    "$PY" -m pip install -q -r requirements-dev.txt -c constraints.txt
fi
"$PY" -m pip check
"$PY" -m aio_examples setup
