#!/usr/bin/env python3
"""Training throughput under load: keel and PyTorch side by side, idle and under the loads a shared
2-core machine sees, each reported as a share of its own idle tokens/s (docs/performance.md,
"Under load").

Loads:
  idle    nothing else runs.
  busy    one steady busy process (a spinning loop) for the whole measurement.
  stream  a stream of short processes, one after another, each a ~50 ms CPU-bound child that
          takes a core and exits: what a build or a test run looks like to the scheduler.

For each load the two trainers run interleaved and repeated (keel, PyTorch, keel, PyTorch, ...),
each a fresh process timing --steps steps after --warmup; shares are medians over the repeats.
The fair share of a 2-thread trainer against one extra runnable task on 2 cores is 50% or more.

    /usr/bin/python3 bench/under_load.py [--keel build/release/keel] [--config bench/configs/qwen3_small.json]
        [--loads idle,busy,stream] [--repeat 3] [--isa as-is|native|avx2] [--json]
"""
import argparse
import json
import os
import signal
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "bench"))
import train_step_vs_pytorch as tsv  # noqa: E402

BUSY = "while True: pass"
# One child at a time, each spinning for ~50 ms of CPU, started as soon as the previous ends.
STREAM = ("import subprocess, sys\n"
          "while True:\n"
          "    subprocess.run(['/bin/sh', '-c', 'i=0; while [ $i -lt 40000 ]; do i=$((i+1)); done'])\n")


def start_load(kind):
    if kind == "idle":
        return None
    code = BUSY if kind == "busy" else STREAM
    return subprocess.Popen([sys.executable, "-c", code], start_new_session=True)


def stop_load(proc):
    if proc is None:
        return
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()


def measure(args, load, peer, blas, alloc):
    ks, ts = [], []
    proc = start_load(load)
    try:
        time.sleep(0.5 if proc else 0)
        for _ in range(args.repeat):
            ks.append(tsv.run_keel(args.keel, args.config, args.batch, args.seq, args.steps, args.warmup,
                                   args.threads, "adamw", extra=args.keel_args)["tokens_per_s"])
            ts.append(tsv.run_torch(args.config, args.batch, args.seq, args.steps, args.warmup, args.threads,
                                    "adamw", "fp32", peer, blas, alloc)["tokens_per_s"])
    finally:
        stop_load(proc)
    return tsv.median(ks), tsv.median(ts), ks, ts


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    tsv.add_keel_arguments(ap)
    ap.add_argument("--config", default="bench/configs/qwen3_small.json")
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--seq", type=int, default=256)
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--loads", default="idle,busy,stream")
    ap.add_argument("--peer", default="plain_foreach", help="PyTorch candidate (bench/torch_peers.py)")
    ap.add_argument("--blas", default="openmp", choices=["openmp", "pthread"])
    ap.add_argument("--alloc", default="jemalloc_kept" if "jemalloc_kept" in tsv.allocators_here() else "glibc_kept",
                    choices=list(tsv.ALLOCATORS), help="allocator under PyTorch (train_step_vs_pytorch.ALLOCATORS)")
    ap.add_argument("--keel-args", default="", help="extra arguments for keel bench, space-separated")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    tsv.resolve_keel(args)
    args.keel_args = args.keel_args.split()
    loads = args.loads.split(",")
    if "idle" not in loads:
        loads.insert(0, "idle")
    if not args.json:
        print(f"CPU: {tsv.cpu_description()}; {args.threads} threads each side; {args.config} "
              f"B={args.batch} T={args.seq}", flush=True)
    results = {}
    for load in loads:
        k, t, ks, ts = measure(args, load, args.peer, args.blas, args.alloc)
        results[load] = {"keel_tokens_per_s": round(k, 1), "torch_tokens_per_s": round(t, 1),
                         "keel_runs": [round(x, 1) for x in ks], "torch_runs": [round(x, 1) for x in ts]}
        idle = results["idle"]
        results[load]["keel_share_of_idle"] = round(k / idle["keel_tokens_per_s"], 3)
        results[load]["torch_share_of_idle"] = round(t / idle["torch_tokens_per_s"], 3)
        if not args.json:
            r = results[load]
            print(f"{load:7s} keel {k:8.0f} tok/s ({100 * r['keel_share_of_idle']:5.1f}% of idle)   "
                  f"torch[{args.peer}/{args.blas}/{args.alloc}] {t:8.0f} tok/s ({100 * r['torch_share_of_idle']:5.1f}% of idle)",
                  flush=True)
    if args.json:
        print(json.dumps({"cpu": tsv.cpu_description(), "config": args.config, "threads": args.threads,
                          "batch": args.batch, "seq": args.seq, "peer": args.peer, "blas": args.blas, "alloc": args.alloc,
                          "loads": results}))


if __name__ == "__main__":
    main()
