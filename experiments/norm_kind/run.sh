#!/usr/bin/env bash
# Runs the norm_kind study (README.md in this folder) with `keel compare`: the variants of sweep.toml
# side by side (parallel = 2, one thread each), resumably, then the report into report/.
# Needs a built keel (`make build`) and the Brown corpus (`make data`). Extra arguments go to
# keel compare.   bash experiments/norm_kind/run.sh   (KEEL=path/to/keel to use another binary)
set -euo pipefail
cd "$(dirname "$0")/../.."
KEEL=${KEEL:-build/release/keel}
[[ -x "$KEEL" ]] || { echo "run.sh: no keel binary at $KEEL (make build)" >&2; exit 2; }
[[ -f cache/brown/data/meta.json ]] || { echo "run.sh: no prepared Brown corpus in cache/brown (make data)" >&2; exit 2; }
exec "$KEEL" compare experiments/norm_kind/sweep.toml "$@"
