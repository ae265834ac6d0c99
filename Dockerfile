# syntax=docker/dockerfile:1
# aio-examples: CPU inference benchmarks with PyTorch, for linux/amd64 and linux/arm64.
#   docker build -t aio-examples .
#   docker buildx build --platform linux/amd64,linux/arm64 -t aio-examples .
# Behind a proxy or offline (docs/docker.md):
#   --build-arg PIP_INDEX_URL=URL     a PyPI mirror (default: pypi.org)
#   --build-arg TORCH_INDEX_URL=URL   where torch's CPU build comes from (default: PyTorch's CPU index, which
#                                     serves both architectures; empty: only PIP_INDEX_URL and the wheels folder)
#   --build-context wheels=DIR        a folder of wheels preferred to any index (e.g. torch-*+cpu-*.whl)
#   --build-context certs=DIR         CA certificates (*.crt) trusted while installing, not kept in the image

# Empty unless a --build-context of the same name replaces them.
FROM scratch AS wheels
FROM scratch AS certs

FROM docker.io/library/python:3.11-slim-bookworm
# RUN lines are POSIX sh with `set -eu`: podman's default (OCI) image format ignores SHELL.

# numactl binds sweep points to cores and memory. tcmalloc (google-perftools) and jemalloc are the sweeps'
# allocator axis through LD_PRELOAD, never preloaded by default (OpenVINO aborts under them). The compilers
# are needed at run time: inductor (the inductor backend and aio's compiled strategy) builds C++ kernels
# with g++ against Python's headers, and on amd64, where PyPI's torchvision is a CUDA build,
# aio_examples/compat compiles CPU stand-ins with gcc after reading its symbols with nm (binutils).
# OpenCV, which Ultralytics' YOLO imports, loads libGL and GLib.
RUN set -eu; \
    apt-get update; \
    apt-get install -y --no-install-recommends numactl libgoogle-perftools4 libjemalloc2 g++ binutils \
        libgl1 libglib2.0-0; \
    apt-get clean; \
    rm -rf /var/lib/apt/lists/*; \
    useradd --create-home --uid 1000 --shell /bin/bash aio; \
    install -d -o aio -g aio /opt/venv /workspace/aio-examples

# One virtual environment owned by the user, so `pip install` of extras works without root; it is the
# same on the official image and on any Debian-based stand-in for it. start_notebook.sh listens on every
# interface of the container (a published port reaches nothing bound to 127.0.0.1); its token guards it.
USER 1000:1000
ENV VIRTUAL_ENV=/opt/venv PATH=/opt/venv/bin:$PATH PYTHONUNBUFFERED=1 PIP_DISABLE_PIP_VERSION_CHECK=1 \
    AIO_NOTEBOOK_IP=0.0.0.0
RUN python3 -m venv /opt/venv

# Dependencies before the code, so a code change reuses this layer. torch's step first, as setup.sh does it:
# torch and torchvision at the constraints' +cpu pins, from the torch index (PyPI's torch is a CUDA build on
# both architectures, GBs of CUDA packages); then the rest without it. The base is a multi-architecture image
# and the torch index serves both, so each platform's build picks its own wheels; on arm64, where LoadGen has
# no wheel, pip builds it from source with the g++ above.
ARG PIP_INDEX_URL=https://pypi.org/simple
ARG TORCH_INDEX_URL=https://download.pytorch.org/whl/cpu
WORKDIR /workspace/aio-examples
COPY --chown=aio:aio requirements.txt constraints.txt ./
RUN --mount=type=bind,from=wheels,target=/tmp/wheels \
    --mount=type=bind,from=certs,target=/tmp/certs \
    set -eu; \
    tmp=$(mktemp -d); \
    export PIP_FIND_LINKS=/tmp/wheels PIP_CONSTRAINT=/workspace/aio-examples/constraints.txt; \
    if [ -n "$(find /tmp/certs -maxdepth 1 -name '*.crt')" ]; then \
        cat /etc/ssl/certs/ca-certificates.crt /tmp/certs/*.crt > "$tmp/ca.pem"; \
        export PIP_CERT="$tmp/ca.pem"; \
    fi; \
    grep -E '^torch(vision)?==' constraints.txt > "$tmp/torch.txt"; \
    pip install --no-cache-dir ${TORCH_INDEX_URL:+--extra-index-url "$TORCH_INDEX_URL"} -r "$tmp/torch.txt"; \
    pip install --no-cache-dir -r requirements.txt; \
    pip check; \
    rm -rf "$tmp"

# The code, installed in place (no network: setuptools comes with the venv); `setup` then checks the
# install and builds the torchvision stand-ins into the user's cache, so a broken image fails here.
COPY --chown=aio:aio . .
RUN pip install --no-cache-dir --no-deps --no-build-isolation --no-index -e . \
 && python3 -m aio_examples setup

EXPOSE 8080
CMD ["bash"]
