# Shared by the studies' run.sh scripts (source it after setting KEEL, OUT and BASE): runs
# variants of one base run config side by side, one thread each (on 2 cores that beats one run at
# a time on two threads: no synchronization between threads), resumably. A finished run is
# skipped, an interrupted one resumes from its last checkpoint. Logs: $OUT/<name>.log.
set -euo pipefail
[[ -x "$KEEL" ]] || { echo "run.sh: no keel binary at $KEEL (make build)" >&2; exit 2; }
[[ -d cache/brown/data ]] || { echo "run.sh: no prepared Brown corpus in cache/brown (make data)" >&2; exit 2; }
SWEEP_PIDS=()
SWEEP_START=$(date +%s)

sweep_run_one() {  # name, extra --set arguments...
  local name=$1; shift
  local dir=$OUT/$name
  if [[ -f $dir/DONE ]]; then echo "== $name: done already"; return; fi
  if ls "$dir"/checkpoints/step_*/COMMIT >/dev/null 2>&1; then
    echo "== $name: resuming"
    OMP_NUM_THREADS=1 "$KEEL" train --resume "$dir" > "$OUT/$name.log" 2>&1
  else
    echo "== $name"
    rm -rf "$dir"
    mkdir -p "$OUT"
    OMP_NUM_THREADS=1 "$KEEL" train --config "$BASE" --set run.out="$dir" "$@" > "$OUT/$name.log" 2>&1
  fi
  touch "$dir/DONE"
  echo "== $name: $(tail -n 3 "$OUT/$name.log" | head -n 1)"
}

# Starts one variant in the background.
sweep_run() {
  sweep_run_one "$@" &
  SWEEP_PIDS+=($!)
}

# Waits for every variant; fails if any did.
sweep_wait() {
  local status=0 pid
  for pid in "${SWEEP_PIDS[@]}"; do wait "$pid" || status=1; done
  (( status == 0 )) || { echo "run.sh: a run failed; see $OUT/*.log" >&2; exit 1; }
  echo "training took $(( ($(date +%s) - SWEEP_START) / 60 )) min"
}
