#!/usr/bin/env bash
# Reproduces the MLA study (README.md in this folder): a small DeepSeek-V3-style MLA model trained
# with Muon at a high learning rate on the Brown corpus, identical data order and initial weights:
#   (a) a_latent_norms:    MLA as DeepSeek-V3 builds it (q_a_layernorm, kv_a_layernorm)
#   (b) b_no_latent_norms: the same without the two latent RMSNorms (keel.mla_latent_norms=false)
#   (c) c_qk_clip:         (a) with QK-Clip, tau = 50, Kimi K2's MLA rule
# The runs go side by side, one thread each; about 15 minutes on 2 cores. Resumable. Needs
# `make data` first. Logs: OUT_DIR/<name>.log.
#   bash experiments/mla/run.sh [KEEL_BINARY] [OUT_DIR]
set -euo pipefail
cd "$(dirname "$0")/../.."
KEEL=${1:-build/release/keel}
OUT=${2:-runs/mla}
BASE=experiments/mla/base.toml
source experiments/sweep.sh

sweep_run a_latent_norms
sweep_run b_no_latent_norms --set 'model.set=["keel.mla_latent_norms=false"]'
sweep_run c_qk_clip --set optimizer.qk_clip_tau=50
sweep_wait

for name in a_latent_norms b_no_latent_norms c_qk_clip; do
  "$KEEL" plot "$OUT/$name" --out "$OUT/$name/plots"
done
"$KEEL" plot "$OUT/a_latent_norms" "$OUT/b_no_latent_norms" "$OUT/c_qk_clip" --out experiments/mla/figures --max-columns 250 --no-html
echo "figures: experiments/mla/figures/"
