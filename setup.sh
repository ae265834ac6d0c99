#!/usr/bin/env bash
# Set up aio-examples on this machine, x86_64 or aarch64 (docs/install.md): the CPU build of torch first (so no
# CUDA wheel is ever pulled), then the rest of the stack, then the package itself, then a check of the install.
#   bash setup.sh               # runtime
#   bash setup.sh --dev         # + test tools
#   bash setup.sh --torch-only  # only torch's step: the CPU builds of torch and torchvision
# Environment:
#   PYTHON           the interpreter to install into (default python3; best a virtual environment's)
#   TORCH_INDEX_URL  where torch's CPU build comes from: PyTorch's CPU index (the default,
#                    https://download.pytorch.org/whl/cpu) or a mirror of it; empty: only the indexes and wheel
#                    folders pip is configured with
set -euo pipefail
cd "$(dirname "$0")"
PY=${PYTHON:-python3}
TORCH_INDEX_URL=${TORCH_INDEX_URL-https://download.pytorch.org/whl/cpu}
mode=${1:-}
case $mode in
    ""|--dev|--torch-only) [ $# -le 1 ] || { echo "setup.sh: one option at most; accepted: --dev, --torch-only" >&2; exit 2; } ;;
    *) echo "setup.sh: unknown option '$mode'; accepted: --dev, --torch-only" >&2; exit 2 ;;
esac

# The interpreter, before anything is installed: Python 3.11 or newer, and not a system's own, which pip
# refuses to install into (PEP 668).
read -r version new managed < <("$PY" -c 'import os, sys, sysconfig
stdlib = sysconfig.get_path("stdlib")
print("%d.%d" % sys.version_info[:2], sys.version_info >= (3, 11),
      sys.prefix == sys.base_prefix and os.path.isfile(os.path.join(stdlib, "EXTERNALLY-MANAGED")))' 2>/dev/null) \
    || { echo "setup.sh: PYTHON '$PY' does not run; accepted: a Python 3.11 or newer (default python3)" >&2; exit 2; }
[ "$new" = True ] || { echo "setup.sh: $PY is Python $version; accepted: Python 3.11 or newer (PYTHON=...)" >&2; exit 2; }
if [ "$managed" = True ] && [ -z "${PIP_BREAK_SYSTEM_PACKAGES:-}" ]; then
    echo "setup.sh: $PY is the system's Python, which pip does not install into (PEP 668); run setup.sh in a" \
         "virtual environment: $PY -m venv ~/aio-venv && . ~/aio-venv/bin/activate && bash setup.sh" >&2
    exit 1
fi

# System packages: a C compiler and binutils adapt torchvision's CUDA wheel to CPU torch
# (aio_examples/compat); g++ and Python's headers build inductor's C++ kernels (the inductor backend and aio's
# compiled strategy) and, on aarch64, LoadGen; numactl binds sweep points to cores; tcmalloc and jemalloc are
# the allocator sweep axis (optional); OpenCV (Ultralytics' YOLO imports it) loads libGL and GLib.
if [ "$mode" != --torch-only ]; then
    missing=()
    command -v cc >/dev/null || missing+=(gcc)
    command -v g++ >/dev/null || missing+=(g++)
    command -v nm >/dev/null || missing+=(binutils)
    command -v numactl >/dev/null || missing+=(numactl)
    ls /usr/lib/*/libtcmalloc.so.4 >/dev/null 2>&1 || missing+=(libgoogle-perftools4)
    ls /usr/lib/*/libjemalloc.so.2 >/dev/null 2>&1 || missing+=(libjemalloc2)
    ls /usr/lib/*/libGL.so.1 >/dev/null 2>&1 || missing+=(libgl1)
    ls /usr/lib/*/libglib-2.0.so.0 >/dev/null 2>&1 || missing+=(libglib2.0-0)
    "$PY" -c 'import os, sys, sysconfig; sys.exit(not os.path.isfile(os.path.join(sysconfig.get_path("include"), "Python.h")))' \
        || missing+=("$("$PY" -c 'import sys; print("python%d.%d-dev" % sys.version_info[:2])')")
    if [ ${#missing[@]} -gt 0 ]; then
        if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
            apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null
        else
            echo "setup.sh: please install ${missing[*]} (g++ and Python's headers for inductor; gcc and binutils" \
                 "unless torchvision's CPU build is installed; without numactl sweeps bind with sched_setaffinity)" >&2
        fi
    fi
fi

# Whether URL $1 answers within 5 s. Any HTTP answer counts (pip judges what it finds there, with its own
# certificates); no answer does not: pip would spend its timeout and retries on every request to it.
answers() {
    timeout 10 "$PY" - "$1" <<'EOF' 2>/dev/null
import os, ssl, sys, urllib.error, urllib.parse, urllib.request
url = urllib.parse.urlsplit(sys.argv[1])
if url.scheme == "file":
    sys.exit(not os.path.isdir(urllib.request.url2pathname(url.path)))
try:
    urllib.request.urlopen(sys.argv[1], timeout=5).close()
except urllib.error.HTTPError:
    pass
except urllib.error.URLError as exc:
    sys.exit(not isinstance(exc.reason, ssl.SSLError))
except OSError:
    sys.exit(1)
EOF
}

# torch's step: torch and torchvision at constraints.txt's pins. torch's +cpu version is on PyTorch's CPU index
# only (PyPI takes no local versions, and its torch is a CUDA build on both architectures); where that index does
# not answer, pip's configured indexes and wheel folders may still hold it (a mirror, a wheels folder).
torch_index=()
if [ -n "$TORCH_INDEX_URL" ]; then
    if answers "$TORCH_INDEX_URL"; then
        torch_index=(--extra-index-url "$TORCH_INDEX_URL")
    else
        echo "setup.sh: $TORCH_INDEX_URL does not answer; torch comes from pip's configured indexes and wheel folders"
    fi
fi
if ! "$PY" -m pip install -q -c constraints.txt "${torch_index[@]}" torch torchvision; then
    echo "setup.sh: $(grep -m1 '^torch==' constraints.txt) is published on PyTorch's CPU index only: set" \
         "TORCH_INDEX_URL to it or to a mirror of it, or put the wheel in a folder pip reads (find-links)" >&2
    exit 1
fi
[ "$mode" != --torch-only ] || exit 0

# The rest. On aarch64 the lines of requirements.txt marked `# aarch64 optional:` may have no wheel for this
# machine: they are installed one at a time after the rest, so a missing one costs only what its note names.
if [ "$(uname -m)" = aarch64 ]; then
    rest=$(mktemp)
    grep -v '# aarch64 optional:' requirements.txt > "$rest"
    "$PY" -m pip install -q -r "$rest" -c constraints.txt
    rm -f "$rest"
    sed -n 's/^\([^ #]*\) *# aarch64 optional: \(.*\)$/\1 \2/p' requirements.txt | while read -r name note; do
        echo "setup.sh: $name on its own (aarch64: ${note%%; without it:*})"
        "$PY" -m pip install -q -c constraints.txt "$name" </dev/null \
            || echo "setup.sh: $name is not installed (above); without it: ${note##*; without it: }" >&2
    done
else
    "$PY" -m pip install -q -r requirements.txt -c constraints.txt
fi
"$PY" -m pip install -q --no-deps -e .
# llama.cpp's Python binding is a source package: CMake builds llama.cpp for this CPU (a few minutes on two
# cores, once: pip's wheel cache keeps the result). Without a compiler the llama_cpp backend says
# `unsupported` with the reason and everything else works.
if ! "$PY" -c "import llama_cpp" 2>/dev/null; then
    echo "setup.sh: building llama-cpp-python (llama.cpp with CMake; a few minutes on 2 cores, cached afterwards)"
    "$PY" -m pip install -q -c constraints.txt llama-cpp-python || \
        echo "setup.sh: llama-cpp-python did not build; the llama_cpp backend will be unsupported" >&2
fi
if [ "$mode" = --dev ]; then
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
