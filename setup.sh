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
# allocator sweep axis (optional); OpenCV (Ultralytics' YOLO imports it) loads libGL and GLib.
missing=()
command -v cc >/dev/null || missing+=(gcc)
command -v g++ >/dev/null || missing+=(g++)
command -v nm >/dev/null || missing+=(binutils)
command -v numactl >/dev/null || missing+=(numactl)
ls /usr/lib/*/libtcmalloc.so.4 >/dev/null 2>&1 || missing+=(libgoogle-perftools4)
ls /usr/lib/*/libjemalloc.so.2 >/dev/null 2>&1 || missing+=(libjemalloc2)
ls /usr/lib/*/libGL.so.1 >/dev/null 2>&1 || missing+=(libgl1)
ls /usr/lib/*/libglib-2.0.so.0 >/dev/null 2>&1 || missing+=(libglib2.0-0)
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
# llama.cpp's Python binding is a source package: CMake builds llama.cpp for this CPU (a few minutes on two
# cores, once: pip's wheel cache keeps the result). Without a compiler the llama_cpp backend says
# `unsupported` with the reason and everything else works.
if ! "$PY" -c "import llama_cpp" 2>/dev/null; then
    echo "setup.sh: building llama-cpp-python (llama.cpp with CMake; a few minutes on 2 cores, cached afterwards)"
    "$PY" -m pip install -q -c constraints.txt llama-cpp-python || \
        echo "setup.sh: llama-cpp-python did not build; the llama_cpp backend will be unsupported" >&2
fi
if [ "${1:-}" = "--dev" ]; then
    "$PY" -m pip install -q -r requirements-dev.txt -c constraints.txt
    # Debian packages of the dev tests: chromium (the notebook server test drives a real browser; Playwright
    # downloads none) and docker-compose (the container tests run `docker-compose config`).
    dev_missing=()
    command -v chromium >/dev/null || dev_missing+=(chromium)
    command -v docker-compose >/dev/null || dev_missing+=(docker-compose)
    if [ ${#dev_missing[@]} -gt 0 ] && [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
        apt-get update -qq || true
        for pkg in "${dev_missing[@]}"; do
            DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "$pkg" >/dev/null || \
                echo "setup.sh: $pkg could not be installed; the tests that need it will be skipped" >&2
        done
    fi
fi
"$PY" -m pip check
"$PY" -m aio_examples setup
