#!/usr/bin/env bash
# Two keel binaries side by side (a refactor's before and after): full training steps of each
# config, interleaved A, B, A, B, ... REPEATS times. Prints the CPU (as the new binary's
# `bench --json` describes it: model, vector extensions, logical CPUs), then per config the
# median tokens/s of each side with its range and the median of the pairs' ratios new/old with
# its range (a pair is one old and one new run back to back, the order alternating, so a slow
# minute of a shared machine moves both sides of a pair together). Run on an otherwise idle machine.
# Usage: bench/binary_ab.sh OLD_KEEL NEW_KEEL [REPEATS=5] [CONFIG...]
# AB_ARGS: more `keel bench` arguments for both sides, e.g. AB_ARGS="--precision bf16".
set -euo pipefail
old="$1"; new="$2"; repeats="${3:-5}"; shift $(( $# >= 3 ? 3 : $# ))
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
configs=("$@")
read -r -a extra <<< "${AB_ARGS:-}"
[[ ${#configs[@]} -gt 0 ]] || configs=("$root/bench/configs/qwen3_small.json" "$root/bench/configs/gpt2_small.json"
                                       "$root/bench/configs/mla_small.json" "$root/bench/configs/mixtral_small.json")
# One run: "tokens_per_s<TAB>cpu" from `keel bench --json` (older binaries have no "cpu").
run() {
  "$1" bench --config "$2" --batch 8 --seq 256 --steps 4 --warmup 1 --json "${extra[@]}" |
    python3 -c 'import json,sys; j=json.load(sys.stdin); print(j["tokens_per_s"], j.get("cpu", ""), sep="\t")'
}
printed_cpu=0
for cfg in "${configs[@]}"; do
  a=(); b=()
  for ((r = 0; r < repeats; ++r)); do
    # The order alternates from pair to pair, so neither side always runs first.
    if ((r % 2 == 0)); then
      a+=("$(run "$old" "$cfg" | cut -f1)")
      line="$(run "$new" "$cfg")"
    else
      line="$(run "$new" "$cfg")"
      a+=("$(run "$old" "$cfg" | cut -f1)")
    fi
    b+=("$(cut -f1 <<<"$line")")
    if ((printed_cpu == 0)); then
      cpu="$(cut -f2 <<<"$line")"
      [[ -n "$cpu" ]] || cpu="$(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs)"
      echo "cpu: $cpu; OMP_NUM_THREADS=${OMP_NUM_THREADS:-unset}, AB_ARGS=${AB_ARGS:-}"
      printed_cpu=1
    fi
  done
  python3 - "$cfg" "${a[*]}" "${b[*]}" <<'PY'
import statistics, sys, os
name, a, b = os.path.basename(sys.argv[1]), [float(x) for x in sys.argv[2].split()], [float(x) for x in sys.argv[3].split()]
ratios = [y / x for x, y in zip(a, b)]
print(f"{name:22s} old {statistics.median(a):9.0f} tok/s ({min(a):.0f}-{max(a):.0f})  "
      f"new {statistics.median(b):9.0f} tok/s ({min(b):.0f}-{max(b):.0f})  "
      f"new/old {statistics.median(ratios):.3f} ({min(ratios):.3f}..{max(ratios):.3f}, {len(ratios)} pairs)")
PY
done
