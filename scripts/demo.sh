#!/usr/bin/env bash
# The main job on embedded defaults: train a small Qwen3-style model (QK-Norm, SwiGLU, RMSNorm,
# pre-norm, GQA) on the Brown corpus for about ten minutes with a warmup-hold-cosine schedule,
# evaluate it, print a generated sample and where the metrics and checkpoint are.
# Expects `make data` to have run (the Makefile's demo target does it).
#   scripts/demo.sh [KEEL_BINARY] [extra --set overrides for the run...]
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
keel="${1:-build/release/keel}"
shift || true
run="runs/demo-$(date +%Y%m%d-%H%M%S)"

echo "== The model (keel inspect)"
"$keel" inspect --seq 256 configs/models/qwen3-small.json | sed -n '/Architecture/,/MTP modules/p;/Parameters/,/non-embedding/p'
echo
echo "== Training: configs/runs/qwen3-small-brown.toml -> $run"
"$keel" train --config configs/runs/qwen3-small-brown.toml --set "run.out=$run" "$@"
echo
echo "== A sample (temperature 0.8, top-k 40, seed 1)"
"$keel" generate --model "$run" --prompt "The committee said that" --max-new-tokens 60 --temperature 0.8 --top-k 40 --seed 1
echo
echo
echo "== Where things are"
echo "metrics:    $run/metrics.jsonl (one JSON object per step; evaluation lines carry val_loss)"
echo "checkpoint: $(ls -d "$run"/checkpoints/step_* | tail -1)"
echo "resume:     $keel train --resume $run --set run.steps=2400"
echo "export:     $keel export --run $run --out $run/hf"
