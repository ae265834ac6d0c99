#!/usr/bin/env bash
# Start JupyterLab on the example notebooks and the results dashboard.
#   bash start_notebook.sh                      127.0.0.1:8080, a generated token
#   bash start_notebook.sh --port 8888 --ip 0.0.0.0 --token SECRET
#   bash start_notebook.sh --cpus 0-1           bind the server and its kernels to these CPUs (numactl)
# The token is --token, else $JUPYTER_TOKEN, else generated; there is always one. The address is --ip, else
# $AIO_NOTEBOOK_IP (the container image sets 0.0.0.0), else 127.0.0.1; the port --port, else
# $AIO_NOTEBOOK_PORT, else 8080. AIO_NUM_THREADS and OMP_NUM_THREADS default to the physical cores
# available when unset (--threads N sets both).
set -euo pipefail
cd "$(dirname "$0")"
PY=${PYTHON:-python3}

usage() { sed -n '2,9p' "$0" | sed 's/^# \{0,1\}//'; }
die() { echo "start_notebook.sh: $*" >&2; exit 2; }

port=${AIO_NOTEBOOK_PORT:-8080}
ip=${AIO_NOTEBOOK_IP:-127.0.0.1}
token=${JUPYTER_TOKEN:-}
token_given=${JUPYTER_TOKEN+1}
cpus=""
threads=""
while [ $# -gt 0 ]; do
    case $1 in
        --port|--ip|--token|--cpus|--threads) [ $# -ge 2 ] || die "$1 needs a value" ;;&
        --port) port=$2; shift ;;
        --ip) ip=$2; shift ;;
        --token) token=$2; token_given=1; shift ;;
        --cpus) cpus=$2; shift ;;
        --threads) threads=$2; shift ;;
        -h|--help) usage; exit 0 ;;
        *) die "unknown option '$1'; accepted: --port N, --ip ADDRESS, --token TOKEN, --cpus LIST, --threads N" ;;
    esac
    shift
done
[[ $port =~ ^[0-9]+$ ]] && [ "$port" -ge 1 ] && [ "$port" -le 65535 ] || die "--port '$port' is invalid; accepted: 1-65535"
# A token given must guard the server: a blank one would leave it open, and it goes into the printed URL.
[ -z "$token_given" ] || [[ $token =~ ^[A-Za-z0-9._~-]+$ ]] || \
    die "--token (or JUPYTER_TOKEN) '$token' is invalid; accepted: letters, digits and ._~- (not blank)"
[ -z "$threads" ] || [[ $threads =~ ^[1-9][0-9]*$ ]] || die "--threads '$threads' is invalid; accepted: a whole number >= 1"
"$PY" -c "import jupyterlab" 2>/dev/null || die "JupyterLab is not installed; run: bash setup.sh"

if [ -n "$threads" ]; then
    export AIO_NUM_THREADS=$threads OMP_NUM_THREADS=$threads
elif [ -z "${AIO_NUM_THREADS:-}" ] && [ -z "${OMP_NUM_THREADS:-}" ]; then
    cores=$("$PY" -c "from aio_examples.machine.topology import read_topology; print(read_topology().physical_cores)")
    export AIO_NUM_THREADS=$cores OMP_NUM_THREADS=$cores
fi

prefix=()
if [ -n "$cpus" ]; then
    command -v numactl >/dev/null || die "--cpus needs numactl (bash setup.sh installs it)"
    numactl --physcpubind="$cpus" true 2>/dev/null || die "--cpus '$cpus' is refused by numactl; accepted: CPUs of $(numactl --show | sed -n 's/^physcpubind: //p')"
    prefix=(numactl --physcpubind="$cpus")
fi

extra=()
if [ "$(id -u)" = 0 ]; then
    echo "start_notebook.sh: running as root, so JupyterLab gets --allow-root" >&2
    extra+=(--allow-root)
fi

[ -n "$token" ] || token=$("$PY" -c "import secrets; print(secrets.token_hex(24))")
export JUPYTER_TOKEN=$token        # read by the server; not on its command line, where ps would show it

host=$ip
[ "$ip" = 0.0.0.0 ] && host=$(hostname)
cat <<EOF
JupyterLab for aio-examples (threads: AIO_NUM_THREADS=${AIO_NUM_THREADS:-} OMP_NUM_THREADS=${OMP_NUM_THREADS:-}${cpus:+, CPUs $cpus})
  open:   http://$host:$port/lab?token=$token
  remote: ssh -N -L $port:localhost:$port $(id -un)@$(hostname)   then open http://localhost:$port/lab?token=$token
EOF
exec "${prefix[@]}" "$PY" -m jupyter lab --no-browser --ip="$ip" --port="$port" --ServerApp.port_retries=0 \
    --ServerApp.root_dir="$PWD" --LabApp.default_url=/lab/tree/notebooks/dashboard.ipynb "${extra[@]}"
