#!/usr/bin/env bash
# Build llama.cpp's llama-bench from the llama.cpp source the installed llama-cpp-python vendors: its sdist (from
# PyPI, the installed version), configured by the sdist's own CMake project as `pip install llama-cpp-python`
# configures it (Release, the project's defaults, plus $CMAKE_ARGS, which pip's build reads too), so its headers
# and ABI are those of the installed libllama and libggml. Only the tool and the two libraries it adds
# (llama-common, llama-bench-impl) are kept: benchmarks/agreement.py runs it on the installed package's own
# libllama and libggml (LD_LIBRARY_PATH), so llama-bench and the llama_cpp backend execute the same kernels.
# Cached under the harness's cache folder (`<cache>/llama-bench/llama-cpp-python-<version>/`), made once.
#   bash scripts/build_llama_bench.sh            print the folder (bin/llama-bench, lib/), building it if needed
#   bash scripts/build_llama_bench.sh --cached   print the folder only if already built (exit 1 otherwise)
# Exit status: 0 the folder is on stdout, 1 it cannot be built (why, on stderr), 2 bad usage.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}

die() { echo "build_llama_bench.sh: $*" >&2; exit 1; }
cached_only=0
case "${1:-}" in
    "") ;;
    --cached) cached_only=1 ;;
    -h|--help) sed -n '2,11p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "build_llama_bench.sh: unknown argument '$1'; accepted: --cached, --help" >&2; exit 2 ;;
esac

version=$("$PY" -c "import llama_cpp; print(llama_cpp.__version__)" 2>/dev/null) \
    || die "llama-cpp-python is not installed (pip install llama-cpp-python): there is no vendored llama.cpp to build"
dest=$("$PY" -c "from aio_examples.core.paths import cache_dir; print(cache_dir('llama-bench', 'llama-cpp-python-$version'))")
if [ -x "$dest/bin/llama-bench" ] && [ -f "$dest/build.json" ]; then
    echo "$dest"
    exit 0
fi
[ "$cached_only" = 1 ] && die "no llama-bench built for llama-cpp-python $version in $dest (run scripts/build_llama_bench.sh)"

for tool in cmake c++ cc; do
    command -v "$tool" >/dev/null || die "cannot build llama-bench: '$tool' is not on PATH (apt-get install cmake g++)"
done
work=$(mktemp -d "${TMPDIR:-/tmp}/llama-bench-build.XXXXXX")
trap 'rm -rf "$work"' EXIT

echo "build_llama_bench.sh: llama-cpp-python $version's sdist, building llama-bench (a few minutes on 2 cores, once)" >&2
"$PY" -m pip download -q "llama-cpp-python==$version" --no-deps --no-binary :all: -d "$work" >&2 \
    || die "cannot download the llama-cpp-python $version sdist from the package index (pip download failed)"
tar -xzf "$work"/llama_cpp_python-*.tar.gz -C "$work"
src=$(echo "$work"/llama_cpp_python-*/)
[ -f "$src/vendor/llama.cpp/tools/llama-bench/llama-bench.cpp" ] \
    || die "the llama-cpp-python $version sdist vendors no tools/llama-bench in its llama.cpp"

generator=()
command -v ninja >/dev/null && generator=(-G Ninja)
# The options pip's build passes (scikit-build-core: Release), the tools switched on (off when llama.cpp is a
# subproject), llava off (not needed here), then the user's own CMAKE_ARGS as pip's build would take them.
# shellcheck disable=SC2206
options=(-DCMAKE_BUILD_TYPE=Release -DLLAMA_BUILD_TOOLS=ON -DLLAVA_BUILD=OFF ${CMAKE_ARGS:-})
cmake -S "$src" -B "$work/build" "${generator[@]}" "${options[@]}" >"$work/configure.log" 2>&1 \
    || { tail -20 "$work/configure.log" >&2; die "CMake could not configure llama.cpp (log above)"; }
cmake --build "$work/build" --target llama-bench -j "$(nproc)" >"$work/build.log" 2>&1 \
    || { tail -20 "$work/build.log" >&2; die "llama-bench did not build (log above)"; }

staging="$dest.tmp.$$"
rm -rf "$staging" && mkdir -p "$staging/bin" "$staging/lib"
cp "$(find "$work/build" -name llama-bench -type f -perm -u+x | head -1)" "$staging/bin/"
find "$work/build" \( -name 'libllama-common.so*' -o -name 'libllama-bench-impl.so*' \) -exec cp -P {} "$staging/lib/" \;
# ggml's CPU options as configured (the CPU kernels llama.cpp compiles in)
grep -E '^GGML_(NATIVE|OPENMP|LLAMAFILE|CPU_REPACK|CPU_ALL_VARIANTS|BACKEND_DL|BLAS|AVX[A-Z0-9_]*|FMA|F16C|BMI2|AMX_[A-Z0-9]+):BOOL=' \
    "$work/build/CMakeCache.txt" | sed 's/:BOOL=/=/' > "$work/ggml.txt" || true
"$PY" - "$staging/build.json" "$version" "$work/ggml.txt" "${options[@]}" <<'EOF'
import json, sys
path, version, ggml, *options = sys.argv[1:]
json.dump({"llama_cpp_python": version, "cmake_options": options,
           "ggml_cpu_options": dict(line.split("=", 1) for line in open(ggml).read().split())}, open(path, "w"), indent=1)
EOF
rm -rf "$dest" && mv "$staging" "$dest"
echo "$dest"
