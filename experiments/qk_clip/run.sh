#!/usr/bin/env bash
# Reproduces the QK-Clip study (README.md in this folder): three Muon runs at a high learning
# rate on the Brown corpus, identical data order and initial weights, then the figures.
#   (a) a_baseline: neither QK-Norm nor QK-Clip
#   (b) b_qk_clip:  QK-Clip with tau = 50 (binds from about step 100)
#   (c) c_qk_norm:  Qwen3's QK-Norm, no clip
#   (d) d_low_lr:   as (a) at a tenth of the learning rate (2e-3), the reference for "high"
# The four runs go side by side, one thread each (on 2 cores that beats one run at a time on two
# threads: no synchronization between threads). About 20 minutes on 2 cores. Resumable: a
# finished run is skipped, an interrupted one resumes from its last checkpoint. Needs `make data`
# first (the Brown tokenizer and shards). Logs: OUT_DIR/<name>.log.
#   bash experiments/qk_clip/run.sh [KEEL_BINARY] [OUT_DIR]
set -euo pipefail
cd "$(dirname "$0")/../.."
KEEL=${1:-build/release/keel}
OUT=${2:-runs/qk_clip}
BASE=experiments/qk_clip/base.toml
[[ -x "$KEEL" ]] || { echo "run.sh: no keel binary at $KEEL (make build)" >&2; exit 2; }
[[ -d cache/brown/data ]] || { echo "run.sh: no prepared Brown corpus in cache/brown (make data)" >&2; exit 2; }

run() {  # name, extra --set arguments...
  local name=$1; shift
  local dir=$OUT/$name
  if [[ -f $dir/DONE ]]; then echo "== $name: done already"; return; fi
  if ls "$dir"/checkpoints/step_*/COMMIT >/dev/null 2>&1; then
    echo "== $name: resuming"
    OMP_NUM_THREADS=1 "$KEEL" train --resume "$dir" > "$OUT/$name.log" 2>&1
  else
    echo "== $name"
    rm -rf "$dir"
    mkdir -p "$OUT"
    OMP_NUM_THREADS=1 "$KEEL" train --config "$BASE" --set run.out="$dir" "$@" > "$OUT/$name.log" 2>&1
  fi
  touch "$dir/DONE"
  echo "== $name: $(tail -n 3 "$OUT/$name.log" | head -n 1)"
}

start=$(date +%s)
run a_baseline & a=$!
run b_qk_clip --set optimizer.qk_clip_tau=50 & b=$!
run c_qk_norm --set 'model.set=[]' & c=$!
run d_low_lr --set optimizer.lr=2e-3 & d=$!
status=0
for pid in $a $b $c $d; do wait "$pid" || status=1; done
(( status == 0 )) || { echo "run.sh: a run failed; see $OUT/*.log" >&2; exit 1; }
echo "training took $(( ($(date +%s) - start) / 60 )) min"

for name in a_baseline b_qk_clip c_qk_norm d_low_lr; do
  "$KEEL" plot "$OUT/$name" --out "$OUT/$name/plots"
done
"$KEEL" plot "$OUT/a_baseline" "$OUT/b_qk_clip" "$OUT/c_qk_norm" "$OUT/d_low_lr" --out experiments/qk_clip/figures --max-columns 250 --no-html
echo "figures: experiments/qk_clip/figures/"
