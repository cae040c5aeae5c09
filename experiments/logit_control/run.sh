#!/usr/bin/env bash
# Reproduces the attention-logit study (README.md in this folder): the nine arms and the second
# seeds of sweep.toml side by side (two at a time, one thread each), the keel compare report, the
# per-run heatmaps of the max logit per head, the table of README.md, and the tokens/s of each
# arm measured one at a time on two threads. About 70 minutes on 2 cores. Resumable (finished runs
# are skipped). Needs `make data` first.
#   bash experiments/logit_control/run.sh [KEEL_BINARY]
set -euo pipefail
cd "$(dirname "$0")/../.."
KEEL=${1:-build/release/keel}
OUT=runs/logit_control
"$KEEL" compare experiments/logit_control/sweep.toml
runs=()
for dir in "$OUT"/*/; do
  name=$(basename "$dir")
  [ "$name" = report ] && continue
  runs+=("$OUT/$name")
done
"$KEEL" plot "${runs[@]}" --out experiments/logit_control/figures --max-columns 250 --no-html
python3 experiments/logit_control/analyze.py "$OUT"
/usr/bin/python3 experiments/logit_control/speed.py "$KEEL"
