#!/usr/bin/env bash
# Build the image from Dockerfile with podman and run it for real: resnet_50_v1 at fp32 bound to CPUs
# with --cpuset-cpus, start_notebook.sh answering with its token on a published port, and
# docker-compose.yml's notebook and bench services through podman's Docker API (when docker-compose is there).
#   bash scripts/container_smoke.sh                   reuses the base image and podman's layer cache
#   bash scripts/container_smoke.sh --cpus 0          CPUs of the containers (default: the last CPU)
#   bash scripts/container_smoke.sh --wheels DIR      wheels for the build (default: pip's find-links folder
#                                                     holding a torch +cpu wheel, if any)
#   bash scripts/container_smoke.sh --certs DIR       CA certificates for the build (default:
#                                                     /usr/local/share/ca-certificates when it holds *.crt)
#   bash scripts/container_smoke.sh --rebuild-base    make the base image again
# The base (python:3.11-slim-bookworm) is pulled; when no registry answers, a stand-in is made with
# debootstrap (Debian bookworm, Python 3.11 with venv and headers, apt and dpkg set up like the official
# image's base) and imported under the official name, labelled org.aio-examples.base=debootstrap.
# podman reads its settings from $AIO_CONTAINER_DIR/containers.conf (default
# ~/.cache/aio-examples/container), written here; the machine's own configuration is not touched.
# Exit status: 0 passed, 1 a check failed, 2 bad usage, 77 skipped (no usable container engine or base).
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
start=$(date +%s)

usage() { sed -n '2,17p' "$0" | sed 's/^# \{0,1\}//'; }
die() { echo "container_smoke.sh: $*" >&2; exit 2; }
fail() { echo "container_smoke.sh: FAILED: $*" >&2; exit 1; }
skip() { echo "container_smoke.sh: skipped: $*" >&2; exit 77; }
step() { echo "== $* ($(( $(date +%s) - start )) s)"; }

BASE=docker.io/library/python:3.11-slim-bookworm
IMAGE=localhost/aio-examples:smoke
cpus=""
wheels=""
certs=""
rebuild_base=0
while [ $# -gt 0 ]; do
    case $1 in
        --cpus|--wheels|--certs) [ $# -ge 2 ] || die "$1 needs a value" ;;&
        --cpus) cpus=$2; shift ;;
        --wheels) wheels=$2; shift ;;
        --certs) certs=$2; shift ;;
        --rebuild-base) rebuild_base=1 ;;
        -h|--help) usage; exit 0 ;;
        *) die "unknown option '$1'; accepted: --cpus LIST, --wheels DIR, --certs DIR, --rebuild-base" ;;
    esac
    shift
done
[ -z "$wheels" ] || [ -d "$wheels" ] || die "--wheels '$wheels' is not a folder; accepted: a folder of .whl files"
[ -z "$certs" ] || [ -d "$certs" ] || die "--certs '$certs' is not a folder; accepted: a folder of *.crt files"
if [ -z "$cpus" ]; then
    cpus=$(python3 -c "import os; print(max(os.sched_getaffinity(0)))")
fi
[[ $cpus =~ ^[0-9]+(-[0-9]+)?(,[0-9]+(-[0-9]+)?)*$ ]] || die "--cpus '$cpus' is invalid; accepted: a CPU list like 0, 0-3 or 0,2"

# --- the engine: podman with runc, configured by a file of our own ---
apt_install() {
    [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null || return 1
    echo "installing $* (apt-get)"
    local log rc=0
    log=$(mktemp)
    { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "$@"; } >"$log" 2>&1 || rc=$?
    [ $rc = 0 ] || tail -5 "$log" >&2
    rm -f "$log"
    return $rc
}
# catatonit is the init podman runs for docker-compose.yml's `init: true`; Debian only recommends it with
# podman, so an install without recommends (or an older one) lacks it and the compose service cannot start.
if ! command -v podman >/dev/null || ! command -v runc >/dev/null || [ ! -x /usr/libexec/podman/catatonit ]; then
    step "podman, runc and catatonit"
    apt_install podman runc catatonit \
        || skip "podman, runc and catatonit are not installed and cannot be (needs root and apt-get)"
fi
dir=${AIO_CONTAINER_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/aio-examples/container}
mkdir -p "$dir"
cat > "$dir/containers.conf" <<'EOF'
[containers]
default_ulimits = ["nofile=20000:20000", "nproc=20000:20000"]

[engine]
runtime = "runc"
EOF
export CONTAINERS_CONF=$dir/containers.conf
podman info >/dev/null 2>"$dir/podman-info.err" || skip "podman does not work here: $(tail -1 "$dir/podman-info.err")"

work=$(mktemp -d)
notebook=aio-smoke-notebook-$$
service=""
compose=()
cleanup() {
    podman rm -f "$notebook" >/dev/null 2>&1 || true
    [ ${#compose[@]} -eq 0 ] || "${compose[@]}" down --timeout 5 >/dev/null 2>&1 || true
    [ -z "$service" ] || kill "$service" 2>/dev/null || true
    rm -rf "$work"
}
trap cleanup EXIT

# --- the base image: pulled, else a debootstrap stand-in under the same name ---
if [ $rebuild_base = 1 ] || ! podman image exists "$BASE"; then
    step "base image $BASE"
    if [ $rebuild_base = 0 ] && timeout 600 podman pull -q "$BASE" >"$work/pull.log" 2>&1; then
        echo "pulled $BASE"
    else
        [ $rebuild_base = 1 ] || echo "no registry answers ($(tail -1 "$work/pull.log")); making a stand-in with debootstrap"
        [ "$(id -u)" = 0 ] || skip "no base image: $BASE cannot be pulled, and debootstrap needs root"
        command -v debootstrap >/dev/null || apt_install debootstrap \
            || skip "no base image: $BASE cannot be pulled, and debootstrap is missing and cannot be installed"
        mirror=${AIO_DEBIAN_MIRROR:-http://deb.debian.org/debian}
        rootfs=$work/rootfs
        debootstrap --variant=minbase --include=python3,python3-venv,python3-dev,ca-certificates \
            bookworm "$rootfs" "$mirror" >"$work/debootstrap.log" 2>&1 \
            || fail "debootstrap from $mirror: $(tail -1 "$work/debootstrap.log")"
        # What debian:bookworm-slim (the official image's base) leaves out of every package installed later.
        cat > "$rootfs/etc/dpkg/dpkg.cfg.d/docker" <<'EOF'
path-exclude /usr/share/doc/*
path-include /usr/share/doc/*/copyright
path-exclude /usr/share/man/*
path-exclude /usr/share/groff/*
path-exclude /usr/share/info/*
path-exclude /usr/share/lintian/*
path-exclude /usr/share/locale/*
EOF
        # ... and the downloaded packages and apt's binary caches, which it keeps out of every layer.
        cat > "$rootfs/etc/apt/apt.conf.d/docker-clean" <<'EOF'
DPkg::Post-Invoke { "rm -f /var/cache/apt/archives/*.deb /var/cache/apt/archives/partial/*.deb /var/cache/apt/*.bin || true"; };
Dir::Cache::pkgcache "";
Dir::Cache::srcpkgcache "";
EOF
        echo "deb $mirror bookworm main" > "$rootfs/etc/apt/sources.list"
        rm -rf "$rootfs"/var/cache/apt/archives/*.deb "$rootfs"/var/cache/apt/*.bin "$rootfs"/var/lib/apt/lists/* \
            "$rootfs"/usr/share/man/* "$rootfs"/usr/share/locale/*
        find "$rootfs/usr/share/doc" -mindepth 2 ! -name copyright -delete 2>/dev/null || true
        tar -C "$rootfs" -c . | podman import -q \
            --change 'ENV LANG=C.UTF-8' --change 'CMD ["python3"]' \
            --change 'LABEL org.aio-examples.base=debootstrap' - "$BASE" >/dev/null
        echo "made $BASE (stand-in: Debian bookworm, $(podman run --rm "$BASE" python3 -V))"
    fi
else
    echo "base image $BASE present ($(podman image inspect --format '{{index .Labels "org.aio-examples.base"}}' "$BASE" \
        | sed 's/^debootstrap$/a debootstrap stand-in/; s/^$/as pulled/'))"
fi

podman run --rm --network none "$BASE" true >/dev/null 2>"$work/run-base.err" \
    || skip "podman cannot run a container here: $(tail -1 "$work/run-base.err")"

# --- the build: the Dockerfile as users build it, wheels and certificates through its build options ---
if [ -z "$wheels" ]; then
    for d in $(python3 -m pip config list 2>/dev/null | sed -n "s/^[a-z:.]*find-links='\(.*\)'$/\1/p"); do
        d=${d#file://}
        if compgen -G "$d/torch-*+cpu-*.whl" >/dev/null; then wheels=$d; break; fi
    done
fi
if [ -z "$certs" ] && compgen -G "/usr/local/share/ca-certificates/*.crt" >/dev/null; then
    certs=/usr/local/share/ca-certificates
fi
build=(podman build --layers -t "$IMAGE" -f Dockerfile)
if [ -n "$wheels" ]; then
    build+=(--build-context "wheels=$wheels")
    # A torch wheel at hand: no need for PyTorch's index (which may be unreachable).
    compgen -G "$wheels/torch-*.whl" >/dev/null && build+=(--build-arg TORCH_INDEX_URL=)
fi
[ -z "$certs" ] || build+=(--build-context "certs=$certs")
step "building $IMAGE (wheels: ${wheels:-none}, certificates: ${certs:-none})"
echo "${build[*]} ."
previous=$(podman image inspect --format '{{.Id}}' "$IMAGE" 2>/dev/null || true)
"${build[@]}" . >"$work/build.log" 2>&1 || { tail -30 "$work/build.log" >&2; fail "podman build (log above)"; }
# The image this build replaced, now untagged: removed, so reruns do not pile up images (its layers that
# are the cache of this build stay).
if [ -n "$previous" ] && [ "$previous" != "$(podman image inspect --format '{{.Id}}' "$IMAGE")" ]; then
    podman rmi "$previous" >/dev/null 2>&1 || true
fi
grep -E '^(torch|transformers) ' "$work/build.log" || true

# --- resnet_50_v1 as the README says, on the CPUs given, the record kept on the host ---
step "resnet_50_v1 -p fp32 --timeout 5 in the container, --cpuset-cpus $cpus"
mkdir -m 0777 "$work/out"
podman run --rm --timeout 1200 --cpuset-cpus "$cpus" --cap-add SYS_NICE -v "$work/out:/out" "$IMAGE" \
    bash -c 'cd classification/resnet_50_v1 && python3 run.py -p fp32 --timeout 5 --output /out' \
    2>&1 | tee "$work/run.log" || fail "run.py in the container (exit ${PIPESTATUS[0]})"
python3 - "$work/out/results.jsonl" "$cpus" <<'EOF' || fail "the record of the container run (above)"
import json, sys
path, cpus = sys.argv[1], sys.argv[2]
want = sorted({c for part in cpus.split(",") for c in
               (range(int(part.split("-")[0]), int(part.split("-")[-1]) + 1))})
rec = [json.loads(line) for line in open(path)][-1]
tuning = rec.get("backend_info", {}).get("tuning", {})
problems = []
if rec["status"] != "ok":
    problems.append(f"status {rec['status']}: {rec.get('reason')}")
if rec["binding"]["affinity"] != want:
    problems.append(f"ran on CPUs {rec['binding']['affinity']}, not the cpuset {want}")
if rec["threads"] != len(want):
    problems.append(f"{rec['threads']} threads on {len(want)} CPUs")
missing = {"compiled", "onnxruntime", "openvino"} - set(tuning.get("medians_ms", {}))
if missing:
    problems.append(f"aio could not try {sorted(missing)}: {tuning.get('refused')}")
for p in problems:
    print("  " + p, file=sys.stderr)
lat = rec.get("latency_ms") or {}
print(f"record: {rec['model']} {rec['backend']} ({rec.get('strategy')}) {rec['precision']} threads {rec['threads']} "
      f"on CPUs {rec['binding']['affinity']}: median {lat.get('median', 0):.2f} ms, status {rec['status']}, "
      f"torchvision {rec['env'].get('torchvision_ops')}")
sys.exit(1 if problems else 0)
EOF

# --- start_notebook.sh as the image runs it: all interfaces, the token from the environment ---
free_port() { python3 -c "import socket; s = socket.socket(); s.bind(('127.0.0.1', 0)); print(s.getsockname()[1])"; }
# Waits for the server in container $3 on 127.0.0.1:$1, then checks that only token $2 gets in.
check_notebook() {
    python3 - "$@" <<'EOF' || { podman logs "$3" 2>&1 | tail -20 >&2; return 1; }
import subprocess, sys, time, urllib.error, urllib.request
port, token, name = sys.argv[1:]
base = f"http://127.0.0.1:{port}"

def status(url):
    try:
        return urllib.request.urlopen(url, timeout=10).status
    except urllib.error.HTTPError as exc:
        return exc.code
    except (urllib.error.URLError, ConnectionError, TimeoutError):
        return 0

deadline = time.monotonic() + 180
while status(f"{base}/api/status?token={token}") != 200:
    running = subprocess.run(["podman", "inspect", "-f", "{{.State.Running}}", name],
                             capture_output=True, text=True).stdout.strip()
    if running != "true" or time.monotonic() > deadline:
        sys.exit(f"  no answer on {base} ({'exited' if running != 'true' else 'gave up after 180 s'})")
    time.sleep(1)
bad = False
for what, url, want in (("with the token", f"{base}/api/status?token={token}", 200),
                        ("without a token", f"{base}/api/status", 403),
                        ("with a wrong token", f"{base}/api/status?token=wrong", 403)):
    got = status(url)
    print(f"  {name} {what}: HTTP {got} (expected {want})")
    bad |= got != want
sys.exit(1 if bad else 0)
EOF
}

step "start_notebook.sh in the container, published on 127.0.0.1"
port=$(free_port)
token=$(python3 -c "import secrets; print(secrets.token_hex(16))")
podman run -d --name "$notebook" -p "127.0.0.1:$port:8080" -e JUPYTER_TOKEN="$token" "$IMAGE" \
    bash start_notebook.sh >/dev/null
check_notebook "$port" "$token" "$notebook" || fail "the notebook server (log above)"
logs=$(podman logs "$notebook" 2>&1)
grep -q "lab?token=$token" <<<"$logs" || fail "start_notebook.sh did not print the URL with the token"
if grep -q -- "--allow-root" <<<"$logs"; then fail "the notebook ran as root; the image's user is aio"; fi
echo "  printed its URL with the token, ran as $(podman exec "$notebook" id -un)"
podman rm -f "$notebook" >/dev/null

# --- docker-compose.yml, driven by docker-compose through podman's Docker API ---
if ! command -v docker-compose >/dev/null && ! apt_install docker-compose; then
    echo "== docker-compose.yml not run: docker-compose is missing and cannot be installed"
else
    step "docker-compose.yml: the notebook and bench services through podman's Docker API"
    mkdir -m 0777 "$work/compose" "$work/compose/results"
    podman system service --time=0 "unix://$work/podman.sock" >"$work/service.log" 2>&1 &
    service=$!
    for _ in $(seq 50); do [ -S "$work/podman.sock" ] && break; sleep 0.2; done
    project=aio-smoke-$$
    compose=(docker-compose -f "$ROOT/docker-compose.yml" --project-directory "$work/compose" -p "$project")
    port=$(free_port)
    export DOCKER_HOST=unix://$work/podman.sock AIO_IMAGE=$IMAGE AIO_CPUSET=$cpus JUPYTER_TOKEN=$token \
        AIO_NOTEBOOK_PORT=$port
    "${compose[@]}" up -d --no-build notebook >"$work/compose.log" 2>&1 \
        || { cat "$work/compose.log" >&2; fail "docker-compose up notebook (log above)"; }
    check_notebook "$port" "$token" "${project}_notebook_1" || fail "the compose notebook service (log above)"
    # A one-point sweep: bound with numactl (cores and memory) inside the cpuset, written to ./results.
    "${compose[@]}" run --rm bench python3 -m aio_examples sweep resnet_18 --backends eager --precisions fp32 \
        --batch-sizes 1 --threads 1 --timeout 2 --quiet --output results/compose-smoke >"$work/bench.log" 2>&1 \
        || { tail -20 "$work/bench.log" >&2; fail "docker-compose run bench (log above)"; }
    python3 - "$work/compose/results/compose-smoke/results.jsonl" "$cpus" <<'EOF' || fail "the bench service's record"
import json, sys
path, cpus = sys.argv[1:]
rec = [json.loads(line) for line in open(path)][-1]
b = rec["binding"]
print(f"  bench service: {rec['model']} {rec['backend']} status {rec['status']}, binding {b['method']} "
      f"cores {b['cores']} membind {b['membind']}, record in ./results on the host")
first = int(cpus.split(",")[0].split("-")[0])
sys.exit(0 if rec["status"] == "ok" and b["method"] == "numactl" and b["cores"] == [first]
         and b["membind"] is not None and not rec["warnings"] else 1)
EOF
fi

# --- figures ---
size=$(podman image inspect --format '{{.Size}}' "$IMAGE")
echo
echo "container smoke passed in $(( $(date +%s) - start )) s"
echo "  image $IMAGE: $(podman images --format '{{.Size}}' "$IMAGE") ($size bytes)"
grep -E '^resnet_50_v1 +aio' "$work/run.log" | sed 's/^/  /' || true
