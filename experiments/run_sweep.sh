#!/usr/bin/env bash
# Runs one study's sweep with `keel compare`: the variants of experiments/<study>/sweep.toml side by
# side (its `parallel` and `threads`), resumably, then the report into experiments/<study>/report/.
# Needs a built keel (`make build`) and the Brown corpus (`make data`). Extra arguments go to keel
# compare (e.g. --report-only, --only NAME).
#   bash experiments/run_sweep.sh <study> [keel compare flags]   (KEEL=path/to/keel for another binary,
#                                                                  SWEEP=other.toml in the study's folder)
set -euo pipefail
study=${1:?usage: run_sweep.sh <study> [keel compare flags]}
shift
cd "$(dirname "$0")/.."
KEEL=${KEEL:-build/release/keel}
[[ -x "$KEEL" ]] || { echo "run_sweep.sh: no keel binary at $KEEL (make build)" >&2; exit 2; }
[[ -f cache/brown/data/meta.json ]] || { echo "run_sweep.sh: no prepared Brown corpus in cache/brown (make data)" >&2; exit 2; }
sweep=experiments/$study/${SWEEP:-sweep.toml}
[[ -f "$sweep" ]] || { echo "run_sweep.sh: no $sweep" >&2; exit 2; }
exec "$KEEL" compare "$sweep" "$@"
