#!/usr/bin/env bash
# Two keel binaries side by side (a refactor's before and after): full training steps of each
# config, interleaved A, B, A, B, ... REPEATS times, and the median tokens/s of each with the
# ratio B/A. Run on an otherwise idle machine and name the CPU with the figures.
# Usage: bench/binary_ab.sh OLD_KEEL NEW_KEEL [REPEATS=5] [CONFIG...]
# AB_ARGS: more `keel bench` arguments for both sides, e.g. AB_ARGS="--precision bf16".
set -euo pipefail
old="$1"; new="$2"; repeats="${3:-5}"; shift $(( $# >= 3 ? 3 : $# ))
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
configs=("$@")
read -r -a extra <<< "${AB_ARGS:-}"
[[ ${#configs[@]} -gt 0 ]] || configs=("$root/bench/configs/qwen3_small.json" "$root/bench/configs/gpt2_small.json"
                                       "$root/bench/configs/mla_small.json" "$root/bench/configs/mixtral_small.json")
echo "cpu: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs), OMP_NUM_THREADS=${OMP_NUM_THREADS:-unset}, AB_ARGS=${AB_ARGS:-}"
for cfg in "${configs[@]}"; do
  a=(); b=()
  for ((r = 0; r < repeats; ++r)); do
    a+=("$("$old" bench --config "$cfg" --batch 8 --seq 256 --steps 4 --warmup 1 --json "${extra[@]}" | python3 -c 'import json,sys; print(json.load(sys.stdin)["tokens_per_s"])')")
    b+=("$("$new" bench --config "$cfg" --batch 8 --seq 256 --steps 4 --warmup 1 --json "${extra[@]}" | python3 -c 'import json,sys; print(json.load(sys.stdin)["tokens_per_s"])')")
  done
  python3 - "$cfg" "${a[*]}" "${b[*]}" <<'PY'
import statistics, sys, os
name, a, b = os.path.basename(sys.argv[1]), [float(x) for x in sys.argv[2].split()], [float(x) for x in sys.argv[3].split()]
ma, mb = statistics.median(a), statistics.median(b)
print(f"{name:22s} old {ma:9.0f} tok/s  new {mb:9.0f} tok/s  new/old {mb / ma:.3f}  (old {min(a):.0f}-{max(a):.0f}, new {min(b):.0f}-{max(b):.0f})")
PY
done
