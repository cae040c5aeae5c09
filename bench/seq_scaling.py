#!/usr/bin/env python3
"""How keel's training step grows with sequence length and with width, against the FLOP count.

Sequence: the Qwen3-style small model (bench/configs/qwen3_small.json, context raised to 4,096)
at T = 256 ... 4,096 with the tokens per step fixed (B = tokens / T), so the matmul work per step
is constant and only attention's grows, linearly in T per token (causal: (T + 1) / 2 keys per
query). Width: the same 4-layer shape at hidden 256 ... 1,024 (head_dim 64, heads = hidden / 64,
kv heads = heads / 2, FFN 3 x hidden) at B x T = 8 x 256.

For each point: tokens/s, model FLOPs per token (`keel inspect --json --seq T`, causal), the
achieved model GFLOP/s, and the attention share of the step (`keel bench --json` stages).

    /usr/bin/python3 bench/seq_scaling.py [--keel build/release/keel] [--tokens 4096] [--json]
"""
import argparse
import json
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "bench"))
import train_step_vs_pytorch as tsv  # noqa: E402

BASE = os.path.join(ROOT, "bench/configs/qwen3_small.json")


def flops_per_token(keel, sets, seq):
    args = [keel, "inspect", "--json", "--seq", str(seq), BASE] + [a for s in sets for a in ("--set", s)]
    out = json.loads(subprocess.run(args, check=True, capture_output=True, text=True).stdout)
    return out["flops"]["per_token_training_causal"]


def bench(keel, sets, batch, seq, steps, threads):
    env = dict(os.environ, OMP_NUM_THREADS=str(threads), KEEL_THREADS="fixed")
    args = [keel, "bench", "--config", BASE, "--batch", str(batch), "--seq", str(seq), "--steps", str(steps),
            "--warmup", "1", "--json"] + [a for s in sets for a in ("--set", s)]
    return json.loads(subprocess.run(args, env=env, check=True, capture_output=True, text=True).stdout)


def point(args, label, sets, batch, seq):
    r = bench(args.keel, sets, batch, seq, args.steps, args.threads)
    f = flops_per_token(args.keel, sets, seq)
    st = r["stages_ms"]
    row = {"point": label, "batch": batch, "seq": seq, "tokens_per_s": round(r["tokens_per_s"], 1),
           "ms_per_step": round(r["ms_per_step"], 1), "mflop_per_token": round(f / 1e6, 2),
           "model_gflops_per_s": round(f * r["tokens_per_s"] / 1e9, 1),
           "attention_share": round(st["attention"] / r["ms_per_step"], 3),
           "gemm_share": round(st["gemm"] / r["ms_per_step"], 3), "peak_rss_mb": round(r["peak_rss_mb"], 1)}
    if args.json:
        print(json.dumps(row), flush=True)
    else:
        print(f"{label:14s} B={batch:3d} T={seq:5d}  {row['tokens_per_s']:8.0f} tok/s  {row['ms_per_step']:8.1f} ms/step  "
              f"{row['mflop_per_token']:7.1f} MFLOP/tok  {row['model_gflops_per_s']:6.1f} GFLOP/s  "
              f"attention {100 * row['attention_share']:4.1f}%  GEMM {100 * row['gemm_share']:4.1f}%  "
              f"peak {row['peak_rss_mb']:.0f} MB", flush=True)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--keel", default=os.path.join(ROOT, "build/release/keel"))
    ap.add_argument("--tokens", type=int, default=4096, help="tokens per step of the sequence sweep")
    ap.add_argument("--seqs", default="256,512,1024,2048,4096")
    ap.add_argument("--widths", default="256,512,768,1024")
    ap.add_argument("--steps", type=int, default=2)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    if not args.json:
        print(f"CPU: {tsv.cpu_description()}; {args.threads} threads", flush=True)
    for seq in [int(x) for x in args.seqs.split(",") if x]:
        point(args, "seq", ["max_position_embeddings=4096"], max(1, args.tokens // seq), seq)
    for width in [int(x) for x in args.widths.split(",") if x]:
        heads = width // 64
        sets = [f"hidden_size={width}", f"num_attention_heads={heads}", f"num_key_value_heads={max(1, heads // 2)}",
                f"intermediate_size={3 * width}"]
        point(args, f"width {width}", sets, 8, 256)


if __name__ == "__main__":
    main()
