#!/usr/bin/env bash
# Reproduces the QK-Clip study (README.md in this folder): four Muon runs, three at a high learning
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
source experiments/sweep.sh

sweep_run a_baseline
sweep_run b_qk_clip --set optimizer.qk_clip_tau=50
sweep_run c_qk_norm --set 'model.set=[]'
sweep_run d_low_lr --set optimizer.lr=2e-3
sweep_wait

for name in a_baseline b_qk_clip c_qk_norm d_low_lr; do
  "$KEEL" plot "$OUT/$name" --out "$OUT/$name/plots"
done
"$KEEL" plot "$OUT/a_baseline" "$OUT/b_qk_clip" "$OUT/c_qk_norm" "$OUT/d_low_lr" --out experiments/qk_clip/figures --max-columns 250 --no-html
echo "figures: experiments/qk_clip/figures/"
