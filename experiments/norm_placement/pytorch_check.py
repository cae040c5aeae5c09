"""An independent check of the study's post-norm plateau: the same model trained by PyTorch.

The forward is tools/reference_model.py (the PyTorch model the fixtures under tests/ check keel
against), the backward is autograd, the optimizer torch.optim.AdamW with torch's own gradient
clipping, and the batches are random 65-token windows of the same Brown shards (not keel's data
order). Everything else is the study's base.toml: 8 x 64 tokens per step, AdamW 2e-3, betas
0.9/0.95, eps 1e-8, weight decay 0.1 on matrices, clip 1.0, linear warmup then cosine to 2e-4,
N(0, 0.02) init, validation on the first 8 x 8 windows of the validation split.

    bash scripts/install-deps.sh --torch     # Debian's python3-torch
    /usr/bin/python3 experiments/norm_placement/pytorch_check.py --placement post --layers 4

About 100 s per 400 steps at depth 4 on one core. Needs `make data` (cache/brown/data).
"""
import argparse
import json
import math
import os
import sys

import numpy as np
import torch

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "tools"))
import reference_model as rm  # noqa: E402


def shard_tokens(split):
    """The first shard of a split: a 64-byte header, then uint16 tokens (docs/data.md)."""
    data = os.path.join(ROOT, "cache/brown/data")
    meta = json.load(open(os.path.join(data, "meta.json")))
    n = meta["splits"][split]["tokens"]
    if meta["splits"][split]["shards"] != 1 or meta["dtype"] != "uint16":
        sys.exit(f"pytorch_check.py: expected one uint16 shard per split in {data}")
    raw = open(os.path.join(data, f"{split}_00000.bin"), "rb").read()
    return torch.from_numpy(np.frombuffer(raw, dtype=np.uint16, count=n, offset=64).astype(np.int64))


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--placement", choices=["pre", "post", "sandwich"], default="post")
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--embed-scale", default=None, help='keel.embed_scale: a number or "sqrt_hidden"')
    ap.add_argument("--steps", type=int, default=400)
    ap.add_argument("--warmup", type=int, default=50)
    ap.add_argument("--lr", type=float, default=2e-3)
    ap.add_argument("--final-lr", type=float, default=2e-4)
    ap.add_argument("--eval-every", type=int, default=100)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()

    torch.manual_seed(args.seed)
    torch.set_num_threads(1)
    cfg = json.load(open(os.path.join(ROOT, "experiments/norm_placement/model.json")))
    cfg["num_hidden_layers"] = args.layers
    cfg["keel"] = {"norm_placement": args.placement}
    if args.embed_scale is not None:
        es = args.embed_scale
        cfg["keel"]["embed_scale"] = es if es == "sqrt_hidden" else float(es)
    s = rm.resolve(cfg)

    params, decay = {}, {}
    for name, shape, kind in rm.tensor_layout(s):
        t = torch.empty(shape, dtype=torch.float32)
        if kind in ("linear", "embedding"):
            t.normal_(0, cfg["initializer_range"])
        elif kind == "norm_weight":
            t.fill_(1)
        else:
            t.zero_()
        params[name] = t.requires_grad_()
        decay[name] = rm.decays(name, shape, kind)
    groups = [{"params": [params[n] for n in params if decay[n]], "weight_decay": 0.1},
              {"params": [params[n] for n in params if not decay[n]], "weight_decay": 0.0}]
    opt = torch.optim.AdamW(groups, lr=args.lr, betas=(0.9, 0.95), eps=1e-8)

    def lr_at(step):
        if step <= args.warmup:
            return args.lr * step / args.warmup
        t = (step - args.warmup) / max(1, args.steps - args.warmup)
        return args.final_lr + 0.5 * (args.lr - args.final_lr) * (1 + math.cos(math.pi * t))

    train, val = shard_tokens("train"), shard_tokens("val")
    B, T = 8, 64
    w = T + 1
    val_batches = [torch.stack([val[(b * B + i) * w:(b * B + i + 1) * w] for i in range(B)]) for b in range(8)]

    def evaluate():
        with torch.no_grad():
            losses = [rm.causal_lm_loss(rm.forward(s, params, x, False)[0], x)[1].item() for x in val_batches]
        return sum(losses) / len(losses)

    label = f"{args.placement} depth {args.layers}, warmup {args.warmup}, embed_scale {args.embed_scale or 1}"
    print(f"# PyTorch reference, {label}: step, training loss, grad norm (pre-clip), validation loss")
    for step in range(1, args.steps + 1):
        starts = torch.randint(0, len(train) - w, (B,))
        x = torch.stack([train[i:i + w] for i in starts])
        loss, _ = rm.causal_lm_loss(rm.forward(s, params, x, False)[0], x)
        opt.zero_grad()
        loss.backward()
        grad_norm = torch.nn.utils.clip_grad_norm_(list(params.values()), 1.0)
        for g in opt.param_groups:
            g["lr"] = lr_at(step)
        opt.step()
        if step % args.eval_every == 0 or step == args.steps:
            print(f"{step:6d}  {loss.item():.3f}  {grad_norm.item():6.2f}  {evaluate():.3f}", flush=True)


if __name__ == "__main__":
    main()
