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

failed=()
for target in "${targets[@]}"; do
  name="${target%_fuzz}"
  corpus="$work/$name"
  cp -r "fuzz/corpus/$name" "$corpus"
  args=(-max_total_time="$seconds" -timeout=10 -rss_limit_mb=2048 -print_final_stats=1
        -artifact_prefix="$artifacts/$target-")
  if [[ -f "fuzz/$name.dict" ]]; then args+=(-dict="fuzz/$name.dict"); fi
  log="$work/$target.log"
  echo "fuzz: $target for ${seconds}s over $(ls "$corpus" | wc -l) seeds"
  if "$build_dir/fuzz/$target" "${args[@]}" "$corpus" >"$log" 2>&1; then
    runs="$(grep -o 'stat::number_of_executed_units: [0-9]*' "$log" | grep -o '[0-9]*$' || echo '?')"
    echo "fuzz: $target ok, $runs executions"
  else
    echo "fuzz: $target FOUND A PROBLEM (inputs kept in $artifacts):" >&2
    grep -v -E '^#[0-9]+.*(NEW|REDUCE|pulse)|NEW_FUNC' "$log" | tail -n 60 >&2
    failed+=("$target")
  fi
done

if ((${#failed[@]})); then
  echo "fuzz: findings in ${failed[*]}" >&2
  exit 1
fi
echo "fuzz: no findings"
