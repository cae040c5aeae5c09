#!/usr/bin/env python3
"""GPT-2 124M training steps: keel against llm.c's CPU trainer, interleaved and repeated.

llm.c (train_gpt2.c of its public repository) is not part of keel and is never committed: pass a
checkout of it with --llmc. This script compiles bench/llmc_step.c (keel's timing driver, which
includes train_gpt2.c and times its forward, zero_grad, backward and AdamW update on a randomly
initialized model of GPT-2 124M's shape) into build/llmc_step with llm.c's own flags for a CPU
build (-Ofast -march=native -fopenmp), then runs the two trainers at the same B and T, keel,
llm.c, keel, llm.c, ..., each its own process with the same thread count, and reports each
side's median tokens/s and peak RSS, and the median of the pairs' ratios with its spread.

    /usr/bin/python3 bench/gpt2_vs_llmc.py --llmc ../llm.c [--batch 4] [--seq 1024] [--steps 1]
        [--warmup 1] [--repeat 2] [--threads 2] [--keel build/release/keel] [--json]

keel's side is `keel bench --config configs/hf/gpt2.json` (AdamW with gradient clipping, which
llm.c's trainer does not do). At B = 4, T = 1,024 one llm.c step takes minutes on two cores.
"""
import argparse
import json
import os
import statistics
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "bench"))
import train_step_vs_pytorch as tsv  # noqa: E402  (run_keel, cpu_description)


def build_llmc(llmc_dir, out):
    source = os.path.join(llmc_dir, "train_gpt2.c")
    if not os.path.isfile(source):
        sys.exit(f"gpt2_vs_llmc: {source}: no train_gpt2.c there; --llmc takes a checkout of llm.c")
    os.makedirs(os.path.dirname(out), exist_ok=True)
    cmd = ["gcc", "-Ofast", "-march=native", "-fopenmp", "-DOMP", "-I", llmc_dir, "-o", out,
           os.path.join(ROOT, "bench/llmc_step.c"), "-lm"]
    subprocess.run(cmd, check=True)
    return " ".join(cmd)


def run_llmc(binary, batch, seq, steps, warmup, threads):
    env = dict(os.environ, OMP_NUM_THREADS=str(threads))
    out = subprocess.run([binary, str(batch), str(seq), str(steps), str(warmup)], env=env, check=True,
                         capture_output=True, text=True).stdout
    return json.loads(out.strip().splitlines()[-1])  # llm.c prints its own lines before ours


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--llmc", required=True, help="a checkout of llm.c's public repository")
    ap.add_argument("--keel", default=os.path.join(ROOT, "build/release/keel"))
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--seq", type=int, default=1024)
    ap.add_argument("--steps", type=int, default=1, help="timed steps per run")
    ap.add_argument("--warmup", type=int, default=1, help="untimed steps per run")
    ap.add_argument("--repeat", type=int, default=2, help="interleaved keel/llm.c pairs")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    llmc_bin = os.path.join(ROOT, "build", "llmc_step")
    build_cmd = build_llmc(os.path.abspath(args.llmc), llmc_bin)
    cpu = tsv.cpu_description()
    if not args.json:
        print(f"CPU: {cpu}; {args.threads} threads each; B {args.batch} x T {args.seq}; llm.c built with: {build_cmd}",
              flush=True)
    pairs = []
    for r in range(args.repeat):
        k = tsv.run_keel(args.keel, "configs/hf/gpt2.json", args.batch, args.seq, args.steps, args.warmup,
                         args.threads, "adamw")
        c = run_llmc(llmc_bin, args.batch, args.seq, args.steps, args.warmup, args.threads)
        pairs.append((k, c))
        if not args.json:
            print(f"pair {r + 1}: keel {k['tokens_per_s']:.1f} tok/s, peak {k['peak_rss_mb']:.0f} MB; llm.c "
                  f"{c['tokens_per_s']:.2f} tok/s, peak {c['peak_rss_mb']:.0f} MB; ratio "
                  f"{k['tokens_per_s'] / c['tokens_per_s']:.2f}x", flush=True)
    ratios = [k["tokens_per_s"] / c["tokens_per_s"] for k, c in pairs]
    result = {"cpu": cpu, "threads": args.threads, "batch": args.batch, "seq": args.seq, "pairs": len(pairs),
              "keel_tokens_per_s": statistics.median(k["tokens_per_s"] for k, _ in pairs),
              "llmc_tokens_per_s": statistics.median(c["tokens_per_s"] for _, c in pairs),
              "keel_peak_rss_mb": max(k["peak_rss_mb"] for k, _ in pairs),
              "llmc_peak_rss_mb": max(c["peak_rss_mb"] for _, c in pairs),
              "ratio_median": statistics.median(ratios), "ratio_min": min(ratios), "ratio_max": max(ratios)}
    if args.json:
        print(json.dumps(result))
    else:
        print(f"keel / llm.c: {result['ratio_median']:.2f}x (pairs {result['ratio_min']:.2f}..{result['ratio_max']:.2f}); "
              f"tokens/s {result['keel_tokens_per_s']:.1f} against {result['llmc_tokens_per_s']:.2f}; peak RSS "
              f"{result['keel_peak_rss_mb']:.0f} MB against {result['llmc_peak_rss_mb']:.0f} MB")


if __name__ == "__main__":
    main()
