#!/usr/bin/env bash
# The main job on embedded defaults. Until training lands this explains the bundled real
# configs: one side-by-side table, then the headline counts of every family.
set -euo pipefail
KEEL=${1:-build/release/keel}
cd "$(dirname "$0")/.."
echo "== keel inspect: Qwen3-8B, Llama-3.1-8B and DeepSeek-V3 side by side"
"$KEEL" inspect configs/hf/qwen3-8b.json configs/hf/llama-3.1-8b.json configs/hf/deepseek-v3.json
echo
echo "== every bundled config: parameters (total / active), KV cache per token (bf16)"
SUMMARY='
import json, sys
for d in json.load(sys.stdin):
    p, m = d["params"], d["memory"]
    print("%-36s %-12s total %17s  active %16s  KV/token %8s B" % (
        d["file"], d["model_type"], format(p["total"], ","), format(p["active"], ","),
        format(m["kv_cache_bytes_per_token_bf16"], ",")))
'
"$KEEL" inspect --json configs/hf/*.json | python3 -c "$SUMMARY"
