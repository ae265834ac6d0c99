#!/usr/bin/env bash
# Run the zoo sweep sized for this machine, then write its report (report.html, summary.csv/md, plots).
#   bash run_all.sh                 quick profile (sweeps/quick.toml): about 10 minutes on 2 cores
#   bash run_all.sh --full          every model x backend x precision x thread count (sweeps/full.toml)
#   bash run_all.sh --output DIR    where to write (default results/run_all-<profile>-<date>; reruns resume)
set -euo pipefail
cd "$(dirname "$0")"
PY=${PYTHON:-python3}
profile=quick
out=""
while [ $# -gt 0 ]; do
    case $1 in
        --quick) profile=quick ;;
        --full) profile=full ;;
        --output) [ $# -ge 2 ] || { echo "run_all.sh: --output needs a folder" >&2; exit 2; }; out=$2; shift ;;
        -h|--help) sed -n '2,5p' "$0"; exit 0 ;;
        *) echo "run_all.sh: unknown option '$1'; accepted: --quick, --full, --output DIR" >&2; exit 2 ;;
    esac
    shift
done
out=${out:-results/run_all-$profile-$(date +%Y%m%d)}
start=$(date +%s)
"$PY" -m aio_examples sweep --config "sweeps/$profile.toml" --output "$out"
"$PY" -m aio_examples report "$out" --output "$out/report"
echo "run_all.sh ($profile): $(( $(date +%s) - start )) s"
echo "  results: $out/results.jsonl"
echo "  report:  $out/report/report.html (summary.md, summary.csv, plots/)"
