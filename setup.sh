#!/usr/bin/env bash
# Set up aio-examples on this machine: the CPU build of torch first (so no CUDA wheel is ever
# pulled), then the rest of the stack, then the package itself, then a check of the install.
#   bash setup.sh          # runtime
#   bash setup.sh --dev    # + test tools
set -euo pipefail
cd "$(dirname "$0")"
PY=${PYTHON:-python3}

# System packages: a C compiler and binutils adapt torchvision's CUDA wheel to CPU torch
# (aio_examples/compat); g++ builds inductor's C++ kernels (the inductor backend and aio's compiled
# strategy); numactl binds sweep points to cores; tcmalloc and jemalloc are the
# allocator sweep axis (optional).
missing=()
command -v cc >/dev/null || missing+=(gcc)
command -v g++ >/dev/null || missing+=(g++)
command -v nm >/dev/null || missing+=(binutils)
command -v numactl >/dev/null || missing+=(numactl)
ls /usr/lib/*/libtcmalloc.so.4 >/dev/null 2>&1 || missing+=(libgoogle-perftools4)
ls /usr/lib/*/libjemalloc.so.2 >/dev/null 2>&1 || missing+=(libjemalloc2)
if [ ${#missing[@]} -gt 0 ]; then
    if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
        apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null
    else
        echo "setup.sh: please install ${missing[*]} (g++ for inductor; gcc and binutils unless torchvision's" \
             "CPU build is installed; without numactl sweeps bind with sched_setaffinity)" >&2
    fi
fi

"$PY" -m pip install -q -c constraints.txt "torch==2.13.0+cpu"
"$PY" -m pip install -q -r requirements.txt -c constraints.txt
"$PY" -m pip install -q --no-deps -e .
if [ "${1:-}" = "--dev" ]; then
    "$PY" -m pip install -q -r requirements-dev.txt -c constraints.txt
    # The notebook server test drives a real browser: Debian's chromium (Playwright downloads none).
    if ! command -v chromium >/dev/null && [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
        apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null || \
            echo "setup.sh: chromium could not be installed; the browser test will be skipped" >&2
    fi
    # The container tests validate docker-compose.yml with `docker-compose config` (Debian's docker-compose).
    if ! command -v docker-compose >/dev/null && [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
        apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq docker-compose >/dev/null || \
            echo "setup.sh: docker-compose could not be installed; the compose tests will be skipped" >&2
    fi
fi
"$PY" -m pip check
"$PY" -m aio_examples setup
