#!/usr/bin/python3
"""Tokens/s cost of each arm of the attention-logit study, measured on a quiet machine.

    /usr/bin/python3 experiments/logit_control/speed.py [KEEL] [--steps 40] [--rounds 3] [--threads 2]

Trains every first-seed arm of sweep.toml for a few steps with the same data, one after another,
in rounds (A B C ... A B C ...), so a slow patch of a shared machine touches every arm alike;
reports the median over rounds of each run's median tokens/s (the first 5 steps dropped) and its
ratio to the unprotected baseline. The sweep itself runs its arms side by side on one thread
each, so its tokens/s are not comparable between arms; these are. Prints the CPU it ran on.
"""
import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import tomllib

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))


def cpu_model():
    with open("/proc/cpuinfo") as f:
        for line in f:
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    return "unknown CPU"


def isa():
    with open("/proc/cpuinfo") as f:
        flags = next((l for l in f if l.startswith("flags")), "").split()
    return "AVX-512" if "avx512f" in flags else ("AVX2" if "avx2" in flags else "SSE")


def run_arm(keel, sets, steps, threads, out):
    shutil.rmtree(out, ignore_errors=True)
    cmd = [keel, "train", "--config", os.path.join(HERE, "base.toml"), "--set", f"run.steps={steps}",
           "--set", "eval.every=0", "--set", "checkpoint.every=0", "--set", f"run.out={out}"]
    for s in sets:
        cmd += ["--set", s]
    env = dict(os.environ, OMP_NUM_THREADS=str(threads))
    subprocess.run(cmd, cwd=ROOT, env=env, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    with open(os.path.join(out, "metrics.jsonl")) as f:
        rows = [json.loads(l) for l in f if l.strip()]
    return statistics.median(r["tokens_per_s"] for r in rows[5:])


def main():
    p = argparse.ArgumentParser()
    p.add_argument("keel", nargs="?", default=os.path.join(ROOT, "build/release/keel"))
    p.add_argument("--steps", type=int, default=40)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--threads", type=int, default=2)
    args = p.parse_args()
    with open(os.path.join(HERE, "sweep.toml"), "rb") as f:
        sweep = tomllib.load(f)
    arms = [(v["name"], v.get("set", [])) for v in sweep["variant"] if "seed" not in v["name"]]
    tmp = tempfile.mkdtemp(prefix="keel_logit_speed_")
    results = {name: [] for name, _ in arms}
    try:
        for r in range(args.rounds):
            for name, sets in arms:
                results[name].append(run_arm(args.keel, sets, args.steps, args.threads, os.path.join(tmp, name)))
                print(f"round {r + 1}: {name} {results[name][-1]:.0f} tokens/s", file=sys.stderr)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    base = statistics.median(results[arms[0][0]])
    print(f"CPU: {cpu_model()} ({isa()}), {args.threads} threads, {args.steps} steps x {args.rounds} rounds")
    print("| arm | tokens/s (median of rounds) | min-max | vs a_none |")
    print("|---|---|---|---|")
    for name, _ in arms:
        v = results[name]
        print(f"| {name} | {statistics.median(v):.0f} | {min(v):.0f}-{max(v):.0f} | {statistics.median(v) / base:.3f} |")


if __name__ == "__main__":
    main()
