#!/usr/bin/env python3
"""What bf16 saves of the activation memory: keel against PyTorch's autocast, same model, same steps.

Issue 17 asks that bf16 storage halve activation memory, measured as peak RSS. This script puts
keel's figure beside the peer's: for each side it measures the peak RSS of a training step (two
steps, so AdamW's moments exist at the second one's peak) at batch B0 and B1 of T tokens, and
takes the slope, the bytes one more token of a step costs at that T. Fixed T and varying B make
the slope exact for both sides (both grow linearly in B at fixed T), and the weights, gradients
and optimizer state are the fixed part and drop out. keel's slope does not depend on T (its
attention keeps nothing T × T); the PyTorch reference's eager attention keeps T × T probabilities
in every layer, so the peer's slope, and the ratios across the two sides, hold for the T given.

Settings measured, each in its own process, interleaved and repeated (median per point):
- keel fp32, and keel `--precision bf16` with `--bf16-activations packed` and `all` (the default since
  2026-12-07);
- PyTorch fp32, and PyTorch under torch.autocast("cpu", dtype=torch.bfloat16), as
  train_step_vs_pytorch.py's bf16 cases run it: the fixtures' reference model (HF's modeling code
  written for float64 checks; since 2026-12-06 the nanoGPT-style peers race under autocast too,
  for speed, but this memory measurement was made, and is kept, on the reference), glibc's malloc
  as it comes (a peer told to keep freed memory would only look bigger).

The model is Qwen3-0.6B (configs/hf/qwen3-0.6b.json: 28 layers, hidden 1,024, 16 heads of 128,
GQA 2:1, FFN 3,072, vocab 151,936), or its first --layers layers. Every step has at least 256
tokens: keel's loss works on chunks of 256 rows, so below that its logits buffer grows with the
step. Fewer layers make the per-token part that is not the layers' (PyTorch's full logits and
their gradient above all) a larger share, so the ratios move with --layers: compare at 28.

    /usr/bin/python3 bench/bf16_memory_vs_pytorch.py [--keel build/release/keel] [--layers 28]
        [--seq 256] [--batches 1,4] [--repeat 2] [--threads 2] [--sides keel,pytorch] [--json]
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from train_step_vs_pytorch import DEFAULT_KEEL, ROOT, cpu_description, median, run_keel, run_torch  # noqa: E402

CONFIG = os.path.join(ROOT, "configs/hf/qwen3-0.6b.json")
# (side, label, precision, keel's --bf16-activations)
SETTINGS = [("keel", "fp32", "fp32", None), ("keel", "bf16 packed", "bf16", "packed"),
            ("keel", "bf16 all", "bf16", "all"), ("pytorch", "fp32", "fp32", None),
            ("pytorch", "bf16 autocast", "bf16", None)]


def peak_mb(args, config, setting, batch):
    side, _, precision, storage = setting
    if side == "keel":
        extra = ("--bf16-activations", storage) if storage else ()
        row = run_keel(args.keel, config, batch, args.seq, 1, 1, args.threads, "adamw", precision, extra)
        return row["peak_rss_mb"]
    return run_torch(config, batch, args.seq, 1, 1, args.threads, "adamw", precision, "reference", "openmp",
                     "glibc")["peak_rss_mb"]


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--keel", default=DEFAULT_KEEL)
    ap.add_argument("--layers", type=int, default=28)
    ap.add_argument("--seq", type=int, default=256)
    ap.add_argument("--batches", default="1,4")
    ap.add_argument("--repeat", type=int, default=2)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--sides", default="keel,pytorch", help="which sides to measure, comma-separated")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    sides = set(args.sides.split(","))
    if not sides or not sides <= {"keel", "pytorch"}:
        raise SystemExit("bf16_memory_vs_pytorch.py: --sides takes keel, pytorch or both")
    if args.layers < 1 or args.repeat < 1 or args.seq < 1:
        raise SystemExit("bf16_memory_vs_pytorch.py: --layers, --repeat and --seq must be at least 1")
    b0, b1 = (int(b) for b in args.batches.split(","))
    if not 0 < b0 < b1:
        raise SystemExit("bf16_memory_vs_pytorch.py: --batches takes B0,B1 with 0 < B0 < B1")
    if b0 * args.seq < 256:
        raise SystemExit("bf16_memory_vs_pytorch.py: B0 x T must be at least 256 tokens (keel's loss chunk)")
    with open(CONFIG) as f:
        cfg = json.load(f)
    cfg["num_hidden_layers"] = args.layers
    cfg.pop("layer_types", None)  # one entry per layer; every layer of Qwen3-0.6B is full attention
    with tempfile.TemporaryDirectory() as tmp:
        config = os.path.join(tmp, f"qwen3-0.6b-{args.layers}-layers.json")
        with open(config, "w") as f:
            json.dump(cfg, f)
        settings = [s for s in SETTINGS if s[0] in sides]
        peaks = {(s[0], s[1], b): [] for s in settings for b in (b0, b1)}
        for _ in range(args.repeat):
            for b in (b0, b1):
                for s in settings:
                    peaks[(s[0], s[1], b)].append(peak_mb(args, config, s, b))
    tokens = (b1 - b0) * args.seq
    rows = []
    for side, label, _, _ in settings:
        lo, hi = median(peaks[(side, label, b0)]), median(peaks[(side, label, b1)])
        per_token_kib = (hi - lo) * 1024.0 / tokens
        rows.append({"side": side, "setting": label, "peak_rss_mb": [round(lo, 1), round(hi, 1)],
                     "runs_mb": [[round(x, 1) for x in peaks[(side, label, b)]] for b in (b0, b1)],
                     "kib_per_token": round(per_token_kib, 1), "fixed_mb": round(lo - per_token_kib * b0 * args.seq / 1024.0)})
    for r in rows:
        fp32 = next(x for x in rows if x["side"] == r["side"] and x["setting"] == "fp32")
        r["of_own_fp32"] = round(r["kib_per_token"] / fp32["kib_per_token"], 3)
    head = {"cpu": cpu_description(), "threads": args.threads, "model": f"Qwen3-0.6B shape, {args.layers} layers",
            "seq": args.seq, "batches": [b0, b1], "repeat": args.repeat}
    if "pytorch" in sides:
        head["torch"] = subprocess.run([sys.executable, "-c", "import torch; print(torch.__version__)"],
                                       check=True, capture_output=True, text=True).stdout.strip()
    if args.json:
        print(json.dumps({**head, "rows": rows}))
        return
    print(f"CPU: {head['cpu']}; {args.threads} threads; {head['model']}; T {args.seq}, B {b0} and {b1}, "
          f"median of {args.repeat}" + (f"; PyTorch {head['torch']}" if "torch" in head else ""))
    print(f"{'side':8s} {'setting':14s} {'peak MB (B0, B1)':>20s} {'KiB/token':>10s} {'of own fp32':>11s} {'fixed MB':>9s}")
    for r in rows:
        print(f"{r['side']:8s} {r['setting']:14s} {str(r['peak_rss_mb']):>20s} {r['kib_per_token']:10.1f} "
              f"{r['of_own_fp32']:11.3f} {r['fixed_mb']:9d}")


if __name__ == "__main__":
    main()
