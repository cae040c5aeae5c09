#!/usr/bin/env bash
# Builds the libFuzzer targets (CMake preset `fuzz`, clang) and runs each for SECONDS
# (default 60) over a temporary copy of its seed corpus in fuzz/corpus/, so the repository
# is never modified. Exits non-zero on any finding: crash, sanitizer report (UBSan halts on
# the first), leak, timeout of one input (10 s) or memory over 2 GiB.
# Usage: scripts/fuzz.sh [SECONDS]
# Env: KEEL_FUZZ_BUILD_DIR (default build/fuzz), KEEL_FUZZ_ARTIFACTS (default
#      <build dir>/artifacts): where crashing inputs are kept for reproduction.
set -euo pipefail

seconds="${1:-60}"
if ! [[ "$seconds" =~ ^[0-9]+$ ]] || ((seconds < 1)); then
  echo "usage: $0 [SECONDS]" >&2
  exit 2
fi

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
build_dir="${KEEL_FUZZ_BUILD_DIR:-$root/build/fuzz}"
artifacts="${KEEL_FUZZ_ARTIFACTS:-$build_dir/artifacts}"
targets=(config_fuzz safetensors_fuzz shard_fuzz tokenizer_fuzz run_config_fuzz metrics_fuzz weights_index_fuzz)

cd "$root"
cmake --preset fuzz -B "$build_dir" >/dev/null
cmake --build "$build_dir" --target "${targets[@]}"

work="$(mktemp -d "${TMPDIR:-/tmp}/keel-fuzz.XXXXXX")"
trap 'rm -rf "$work"' EXIT
mkdir -p "$artifacts"

# The fuzz preset builds UBSan in recover mode; halting makes every report a finding.
export UBSAN_OPTIONS="halt_on_error=1:print_stacktrace=1${UBSAN_OPTIONS:+:$UBSAN_OPTIONS}"
export ASAN_OPTIONS="detect_leaks=1${ASAN_OPTIONS:+:$ASAN_OPTIONS}"

# Each libFuzzer process uses one core, so the targets run JOBS at a time (default: the cores,
# at most 2), each for its full SECONDS; results are reported in target order.
jobs="${KEEL_FUZZ_JOBS:-$(nproc)}"
((jobs >= 1)) || jobs=1
((jobs <= 2)) || jobs=2

start_target() {  # target: runs it in the background, its exit status in $work/$target.status
  local target="$1" name="${1%_fuzz}"
  local corpus="$work/$name"
  cp -r "fuzz/corpus/$name" "$corpus"
  local args=(-max_total_time="$seconds" -timeout=10 -rss_limit_mb=2048 -print_final_stats=1
              -artifact_prefix="$artifacts/$target-")
  if [[ -f "fuzz/$name.dict" ]]; then args+=(-dict="fuzz/$name.dict"); fi
  echo "fuzz: $target for ${seconds}s over $(ls "$corpus" | wc -l) seeds"
  ( status=0
    "$build_dir/fuzz/$target" "${args[@]}" "$corpus" >"$work/$target.log" 2>&1 || status=$?
    echo "$status" >"$work/$target.status" ) &
}

report_target() {
  local target="$1" log="$work/$1.log"
  if [[ "$(cat "$work/$target.status")" == 0 ]]; then
    runs="$(grep -o 'stat::number_of_executed_units: [0-9]*' "$log" | grep -o '[0-9]*$' || echo '?')"
    echo "fuzz: $target ok, $runs executions"
  else
    echo "fuzz: $target FOUND A PROBLEM (inputs kept in $artifacts):" >&2
    grep -v -E '^#[0-9]+.*(NEW|REDUCE|pulse)|NEW_FUNC' "$log" | tail -n 60 >&2
    failed+=("$target")
  fi
}

failed=()
for ((i = 0; i < ${#targets[@]}; i += jobs)); do
  batch=("${targets[@]:i:jobs}")
  for target in "${batch[@]}"; do start_target "$target"; done
  wait
  for target in "${batch[@]}"; do report_target "$target"; done
done

if ((${#failed[@]})); then
  echo "fuzz: findings in ${failed[*]}" >&2
  exit 1
fi
echo "fuzz: no findings"
