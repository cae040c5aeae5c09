#!/usr/bin/env python3
"""What trains in a memory budget (24 GiB by default) at each activation-recomputation setting.

Measures keel's peak RSS for one training step (AdamW, fp32 or bf16) of Qwen3-0.6B's real shape
(configs/hf/qwen3-0.6b.json: 28 layers, hidden 1,024, vocab 151,936) at batch 1 and two
sequence lengths, for run.recompute = none, attention and blocks. Peak memory is linear in the
tokens of a step (attention is blockwise: nothing grows with T²), so two points give the fixed
part (weights, gradients, AdamW's moments, buffers) and the bytes per token; from them:

- the longest sequence of Qwen3-0.6B that fits the budget at batch 1, and
- the widest 28-layer Qwen3-style model (head_dim 128, FFN 3 x hidden, GQA 2:1, Qwen3's vocab)
  that fits at batch 1 x 2,048 tokens: its fixed part scales with its parameter count (`keel
  inspect`), its bytes per token with its width.

Both are extrapolations from measured points; the script says which points it measured.

    /usr/bin/python3 bench/memory_limits.py [--keel build/release/keel] [--budget-gib 24]
        [--seqs 256,1024] [--precision fp32|bf16] [--bf16-activations packed|fp32|all]
        [--recompute none,attention,blocks] [--repeat 1] [--json]

Peak RSS moves by up to about 23 MB between runs of one binary (oneDNN's scratch, the heap's
state), which over 768 tokens is 31 KiB a token of slope (62 if the two points move opposite
ways): --repeat N measures each point N times, interleaved, and takes the median; a longer span
(--seqs 256,2048) divides the jitter too.
"""
import argparse
import json
import os
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from train_step_vs_pytorch import median  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CONFIG = os.path.join(ROOT, "configs/hf/qwen3-0.6b.json")
MIB = 1024 * 1024


def measure(keel, recompute, seq, precision, storage, threads):
    env = dict(os.environ, OMP_NUM_THREADS=str(threads))
    args = [keel, "bench", "--config", CONFIG, "--batch", "1", "--seq", str(seq), "--steps", "1", "--warmup", "1",
            "--recompute", recompute, "--precision", precision, "--json"]
    if precision == "bf16":
        args += ["--bf16-activations", storage]
    return json.loads(subprocess.run(args, env=env, check=True, capture_output=True, text=True).stdout)


def params(keel, hidden):
    sets = [f"hidden_size={hidden}", f"intermediate_size={3 * hidden}", f"num_attention_heads={hidden // 64}",
            f"num_key_value_heads={hidden // 128}"]
    args = [keel, "inspect", "--json", CONFIG] + [a for s in sets for a in ("--set", s)]
    out = json.loads(subprocess.run(args, check=True, capture_output=True, text=True).stdout)
    return out["params"]["total"]


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--keel", default=os.path.join(ROOT, "build/release/keel"))
    ap.add_argument("--budget-gib", type=float, default=24.0)
    ap.add_argument("--seqs", default="256,1024")
    ap.add_argument("--precision", default="fp32", choices=["fp32", "bf16"])
    ap.add_argument("--bf16-activations", default="all", choices=["packed", "fp32", "all"],
                    help="with --precision bf16: how the saved activations are held (run.bf16_activations)")
    ap.add_argument("--recompute", default="none,attention,blocks", help="the settings to measure, comma-separated")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--repeat", type=int, default=1, help="runs of each point, interleaved; the median is used")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    if args.repeat < 1:
        raise SystemExit("memory_limits.py: --repeat must be at least 1")
    t0, t1 = (int(s) for s in args.seqs.split(","))
    budget = args.budget_gib * 1024 * MIB
    base_params = params(args.keel, 1024)
    for recompute in args.recompute.split(","):
        runs = {t0: [], t1: []}
        for _ in range(args.repeat):
            for t in (t0, t1):
                runs[t].append(measure(args.keel, recompute, t, args.precision, args.bf16_activations, args.threads))
        a, b = runs[t0][0], runs[t1][0]  # cpu and storage; tokens_per_s of the first runs
        peak0, peak1 = (median([r["peak_rss_mb"] for r in runs[t]]) for t in (t0, t1))
        per_token = (peak1 - peak0) * MIB / (t1 - t0)
        fixed = peak0 * MIB - per_token * t0
        longest = int((budget - fixed) / per_token)
        # Widest 28-layer model at 1 x 2,048: fixed part scales with parameters, per token with width.
        widest = 1024
        for hidden in range(1024, 8192 + 1, 128):
            need = fixed * params(args.keel, hidden) / base_params + per_token * hidden / 1024 * 2048
            if need > budget:
                break
            widest = hidden
        row = {"cpu": a.get("cpu"), "recompute": recompute, "precision": args.precision, "measured_seqs": [t0, t1],
               "bf16_activations": a.get("bf16_activations_stored"),  # what the steps stored
               "peak_rss_mb": [round(peak0), round(peak1)],
               "runs_mb": [[round(r["peak_rss_mb"], 1) for r in runs[t]] for t in (t0, t1)],
               "tokens_per_s": [round(a["tokens_per_s"], 1), round(b["tokens_per_s"], 1)],
               "fixed_mb": round(fixed / MIB), "kib_per_token": round(per_token / 1024, 1),
               "longest_seq_qwen3_0_6b": longest, "widest_hidden_at_2048": widest,
               "widest_params_b": round(params(args.keel, widest) / 1e9, 2)}
        if args.json:
            print(json.dumps(row), flush=True)
        else:
            if recompute == args.recompute.split(",")[0]:
                print(f"CPU: {row['cpu']}; {args.threads} threads", flush=True)
            print(f"{recompute:9s} peak {row['peak_rss_mb']} MB at T={t0},{t1}; fixed {row['fixed_mb']} MB, "
                  f"{row['kib_per_token']} KiB/token -> Qwen3-0.6B up to T={longest:,} at B=1; widest 28-layer "
                  f"model at 1x2048: hidden {widest} ({row['widest_params_b']} B params)", flush=True)


if __name__ == "__main__":
    main()
