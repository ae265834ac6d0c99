#!/usr/bin/env bash
# Run the zoo sweep sized for this machine, then write its report (report.html, summary.csv/md, plots).
#   bash run_all.sh                 quick profile (sweeps/quick.toml): 40 points, one model of each kind
#   bash run_all.sh --full          every model x backend x precision x thread count (sweeps/full.toml)
#   bash run_all.sh --config FILE   any sweep file (see sweeps/)
#   bash run_all.sh --output DIR    where to write (default results/run_all-<profile>-<date>; reruns resume)
#   bash run_all.sh --nightly       the nightly sweep (sweeps/nightly.toml: the quick zoo, each point in two
#                                   processes taking turns) as a new run (results/nightly-<date-time>), stored in the history
#                                   (results/history.sqlite, or AIO_HISTORY), compared with the latest earlier
#                                   run on this machine (or --baseline REF), regression report written;
#                                   exit 1 on a regression. --threshold 5% sets the smallest change that matters.
set -euo pipefail
cd "$(dirname "$0")"
PY=${PYTHON:-python3}
profile=quick
config=""
out=""
nightly=0
baseline=""
threshold=""
while [ $# -gt 0 ]; do
    case $1 in
        --quick) profile=quick ;;
        --full) profile=full ;;
        --config) [ $# -ge 2 ] || { echo "run_all.sh: --config needs a sweep file" >&2; exit 2; }
                  [ -f "$2" ] || { echo "run_all.sh: --config '$2' is not a file; accepted: a sweep TOML file (see sweeps/)" >&2; exit 2; }
                  config=$2; profile=$(basename "$2" .toml); shift ;;
        --output) [ $# -ge 2 ] || { echo "run_all.sh: --output needs a folder" >&2; exit 2; }; out=$2; shift ;;
        --nightly) nightly=1 ;;
        --baseline|--threshold) [ $# -ge 2 ] || { echo "run_all.sh: $1 needs a value" >&2; exit 2; } ;;&
        --baseline) baseline=$2; shift ;;
        --threshold) threshold=$2; shift ;;
        -h|--help) sed -n '2,11p' "$0"; exit 0 ;;
        *) echo "run_all.sh: unknown option '$1'; accepted: --quick, --full, --config FILE, --output DIR, --nightly," \
                "--baseline REF, --threshold PCT" >&2; exit 2 ;;
    esac
    shift
done
nightly_args=()
[ -n "$baseline" ] && nightly_args+=(--baseline "$baseline")
[ -n "$threshold" ] && nightly_args+=(--threshold "$threshold")
if [ ${#nightly_args[@]} -gt 0 ] && [ $nightly = 0 ]; then
    echo "run_all.sh: --baseline and --threshold need --nightly" >&2; exit 2
fi
if [ $nightly = 1 ]; then
    [ -z "$config" ] && [ "$profile" = quick ] && profile=nightly
    out=${out:-results/nightly-$(date +%Y%m%d-%H%M%S)}
    # Check the threshold and the baseline before the measuring, not after it.
    "$PY" - "${threshold:-5%}" "$baseline" <<'PYCHECK' || exit 2
import sys
from aio_examples.analysis.compare import parse_threshold
from aio_examples.analysis.history import load_run
from aio_examples.core.errors import UsageError
try:
    parse_threshold(sys.argv[1])
    if sys.argv[2]:
        load_run(sys.argv[2])
except UsageError as exc:
    sys.exit(f"run_all.sh: --baseline {exc}" if "threshold" not in str(exc) else f"run_all.sh: {exc}")
PYCHECK
fi
out=${out:-results/run_all-$profile-$(date +%Y%m%d)}
start=$(date +%s)
"$PY" -m aio_examples sweep --config "${config:-sweeps/$profile.toml}" --output "$out"
"$PY" -m aio_examples report "$out" --output "$out/report"
echo "run_all.sh ($profile): $(( $(date +%s) - start )) s"
echo "  results: $out/results.jsonl"
echo "  report:  $out/report/report.html (summary.md, summary.csv, plots/)"
if [ $nightly = 1 ]; then
    set +e
    "$PY" -m aio_examples nightly "$out" "${nightly_args[@]}"
    rc=$?
    set -e
    # 0: no regression, 1: a regression; either way the report was written. Anything else wrote none.
    if [ $rc -le 1 ] && [ -f "$out/regression/regression.md" ]; then
        echo "  regression report: $out/regression/regression.md (.html, .json)"
    fi
    exit $rc
fi
