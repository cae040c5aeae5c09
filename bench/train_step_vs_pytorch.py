#!/usr/bin/env python3
"""Side-by-side benchmark of one training step (forward, backward, grad clip, AdamW or Muon):
keel against the same model in PyTorch, same shapes, same thread count, in one run; prints both
and their ratio, and peak memory of each. The Muon case also reports the share of the step that
Newton-Schulz takes on each side (PyTorch runs the same Moonlight-form Muon written with torch
ops: fp32 NS5 on each hidden matrix, AdamW on the rest). The *_bf16 cases run keel with
`--precision bf16` and PyTorch's forward and loss under torch.autocast("cpu", dtype=torch.bfloat16)
(fp32 parameters and AdamW on both sides), and also time keel in fp32 on the same model to report
keel's own bf16/fp32 speed ratio (docs/precision.md).

PyTorch runs the reference model of tools/reference_model.py (HF semantics, float32, autograd,
torch.optim.AdamW) in a subprocess with OpenMP's OpenBLAS loaded in place of Debian's default
pthread build (its best configuration on these machines). Each side runs in its own process so
peak RSS is its own.

    /usr/bin/python3 bench/train_step_vs_pytorch.py [--keel build/release/keel] [--cases small,gpt2,large]
"""
import argparse
import json
import os
import resource
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

CASES = {
    # name: (config, batch, seq, optimizer)
    "small": ("bench/configs/qwen3_small.json", 8, 256, "adamw"),
    "gpt2": ("bench/configs/gpt2_small.json", 8, 256, "adamw"),
    "large": ("bench/configs/qwen3_large.json", 4, 512, "adamw"),
    "muon": ("bench/configs/qwen3_small.json", 8, 256, "muon"),
    "muon_large": ("bench/configs/qwen3_large.json", 4, 512, "muon"),
    # Mixtral-style MoE (8 experts, top-2; PyTorch gathers each expert's tokens as HF does) and
    # DeepSeek-V3-style MLA with dense MLPs.
    "moe": ("bench/configs/mixtral_small.json", 8, 256, "adamw"),
    "mla": ("bench/configs/mla_small.json", 8, 256, "adamw"),
    # bf16 mixed precision (keel --precision bf16; PyTorch autocast bf16).
    "small_bf16": ("bench/configs/qwen3_small.json", 8, 256, "adamw", "bf16"),
    "large_bf16": ("bench/configs/qwen3_large.json", 4, 512, "adamw", "bf16"),
    "moe_bf16": ("bench/configs/mixtral_small.json", 8, 256, "adamw", "bf16"),
    "mla_bf16": ("bench/configs/mla_small.json", 8, 256, "adamw", "bf16"),
}
MUON_SUFFIXES = (".q_proj.weight", ".k_proj.weight", ".v_proj.weight", ".o_proj.weight",
                 ".gate_proj.weight", ".up_proj.weight", ".down_proj.weight")


def torch_muon(torch, muon_params, adamw):
    """Moonlight-form Muon (Nesterov 0.95, NS5 in fp32, 0.2*sqrt(max(A, B)), decoupled decay)
    on muon_params; adamw (a torch.optim.AdamW) steps the rest. Returns step() -> NS seconds."""
    a, b, c = 3.4445, -4.7750, 2.0315
    bufs = [torch.zeros_like(p) for p in muon_params]

    def ns5(g):
        x = g.T if g.shape[0] > g.shape[1] else g
        x = x / (x.norm() + 1e-7)
        for _ in range(5):
            A = x @ x.T
            B = b * A + c * (A @ A)
            x = a * x + B @ x
        return x.T if g.shape[0] > g.shape[1] else x

    @torch.no_grad()
    def step(lr=1e-4, wd=0.1, mu=0.95):
        ns = 0.0
        for p, buf in zip(muon_params, bufs):
            buf.mul_(mu).add_(p.grad)
            u = p.grad + mu * buf
            t0 = time.perf_counter()
            o = ns5(u)
            ns += time.perf_counter() - t0
            p.mul_(1 - lr * wd).add_(o, alpha=-lr * 0.2 * max(p.shape) ** 0.5)
        adamw.step()
        return ns
    return step
OPENMP_BLAS = "/usr/lib/x86_64-linux-gnu/openblas-openmp"


def torch_worker(config, batch, seq, steps, warmup, optimizer, precision="fp32"):
    import torch
    sys.path.insert(0, os.path.join(ROOT, "tools"))
    import reference_model as ref

    torch.manual_seed(0)
    cfg = json.load(open(os.path.join(ROOT, config)))
    s = ref.resolve(cfg)
    params = {}
    decay, no_decay = [], []
    for name, shape, kind in ref.tensor_layout(s):
        if kind in ("norm_weight",):
            t = torch.ones(shape)
        elif kind in ("norm_bias", "bias"):
            t = torch.zeros(shape)
        else:
            t = torch.randn(shape) * 0.02
        t.requires_grad_(True)
        params[name] = t
        (decay if ref.decays(name, shape, kind) else no_decay).append(t)
    muon_set = {id(params[n]) for n in params if optimizer == "muon" and n.endswith(MUON_SUFFIXES)}
    groups = [{"params": [p for p in decay if id(p) not in muon_set], "weight_decay": 0.1},
              {"params": no_decay, "weight_decay": 0.0}]
    opt = torch.optim.AdamW([g for g in groups if g["params"]], lr=1e-4, betas=(0.9, 0.95), eps=1e-8)
    muon_step = torch_muon(torch, [p for p in params.values() if id(p) in muon_set], opt) if muon_set else None
    tokens = torch.randint(0, s["vocab"], (batch, seq))
    plist = list(params.values())

    def step():
        for p in plist:
            p.grad = None
        if precision == "bf16":
            # Autocast: linear/matmul in bf16 on fp32 parameters (their bf16 copies are made per
            # op), reductions as autocast's op lists decide; backward runs outside, as documented.
            with torch.autocast("cpu", dtype=torch.bfloat16):
                logits, _ = ref.forward(s, params, tokens, collect_stats=False)
                loss, _ = ref.causal_lm_loss(logits.float(), tokens, s["z_loss"])
        else:
            logits, _ = ref.forward(s, params, tokens, collect_stats=False)
            loss, _ = ref.causal_lm_loss(logits, tokens, s["z_loss"])
        loss.backward()
        torch.nn.utils.clip_grad_norm_(plist, 1.0)
        if muon_step:
            return muon_step()
        opt.step()
        return 0.0

    for _ in range(warmup):
        step()
    ns = 0.0
    start = time.perf_counter()
    for _ in range(steps):
        ns += step()
    ms = (time.perf_counter() - start) * 1000.0 / steps
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0
    out = {"ms_per_step": ms, "tokens_per_s": batch * seq / (ms / 1000.0), "peak_rss_mb": rss,
           "threads": torch.get_num_threads()}
    if muon_step:
        out["ns_ms_per_step"] = ns * 1000.0 / steps
        out["ns_share"] = out["ns_ms_per_step"] / ms
    print(json.dumps(out))


def run_torch(config, batch, seq, steps, warmup, threads, optimizer, precision="fp32"):
    env = dict(os.environ, OMP_NUM_THREADS=str(threads))
    if os.path.isdir(OPENMP_BLAS):
        env["LD_LIBRARY_PATH"] = OPENMP_BLAS + (":" + env["LD_LIBRARY_PATH"] if env.get("LD_LIBRARY_PATH") else "")
    out = subprocess.run([sys.executable, __file__, "--torch-worker", config, str(batch), str(seq), str(steps),
                          str(warmup), optimizer, precision], env=env, check=True, capture_output=True, text=True).stdout
    return json.loads(out.strip().splitlines()[-1])


def run_keel(keel, config, batch, seq, steps, warmup, threads, optimizer, precision="fp32"):
    env = dict(os.environ, OMP_NUM_THREADS=str(threads))
    out = subprocess.run([keel, "bench", "--config", os.path.join(ROOT, config), "--batch", str(batch), "--seq",
                          str(seq), "--steps", str(steps), "--warmup", str(warmup), "--optimizer", optimizer, "--precision", precision,
                          "--json"],
                         env=env, check=True, capture_output=True, text=True).stdout
    return json.loads(out)


def main():
    if len(sys.argv) > 1 and sys.argv[1] == "--torch-worker":
        a = sys.argv[2:]
        torch_worker(a[0], int(a[1]), int(a[2]), int(a[3]), int(a[4]), a[5], a[6] if len(a) > 6 else "fp32")
        return
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--keel", default=os.path.join(ROOT, "build/release/keel"))
    ap.add_argument("--cases", default="small,gpt2,large,muon")
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--repeat", type=int, default=1,
                    help="run each side this many times, interleaved, and keep the fastest (shared, noisy machines)")
    ap.add_argument("--json", action="store_true", help="print one JSON object per case")
    args = ap.parse_args()
    rows = []
    for case in args.cases.split(","):
        config, batch, seq, optimizer, *rest = CASES[case]
        precision = rest[0] if rest else "fp32"
        def best(runs):
            return max(runs, key=lambda r: r["tokens_per_s"])
        ks, ts, k32s = [], [], []
        for _ in range(args.repeat):
            ks.append(run_keel(args.keel, config, batch, seq, args.steps, args.warmup, args.threads, optimizer,
                               precision))
            ts.append(run_torch(config, batch, seq, args.steps, args.warmup, args.threads, optimizer, precision))
            if precision == "bf16":
                k32s.append(run_keel(args.keel, config, batch, seq, args.steps, args.warmup, args.threads, optimizer))
        k, t = best(ks), best(ts)
        row = {"case": case, "config": config, "batch": batch, "seq": seq, "optimizer": optimizer,
               "precision": precision,
               "keel_tokens_per_s": round(k["tokens_per_s"], 1), "torch_tokens_per_s": round(t["tokens_per_s"], 1),
               "speed_ratio": round(k["tokens_per_s"] / t["tokens_per_s"], 3),
               "keel_peak_mb": round(k["peak_rss_mb"], 1), "torch_peak_mb": round(t["peak_rss_mb"], 1),
               "memory_ratio": round(k["peak_rss_mb"] / t["peak_rss_mb"], 3)}
        if optimizer == "muon":
            row.update(keel_ns_share=round(k["ns_share"], 4), torch_ns_share=round(t["ns_share"], 4),
                       keel_ns_ms=round(k["ns_ms_per_step"], 2), torch_ns_ms=round(t["ns_ms_per_step"], 2))
        if precision == "bf16":
            k32 = best(k32s)
            row.update(keel_fp32_tokens_per_s=round(k32["tokens_per_s"], 1),
                       keel_bf16_over_fp32=round(k["tokens_per_s"] / k32["tokens_per_s"], 3))
        rows.append(row)
        if args.json:
            print(json.dumps(row), flush=True)
        else:
            print(f"{case:6s} B={batch} T={seq}: keel {row['keel_tokens_per_s']:>9.0f} tok/s  "
                  f"torch {row['torch_tokens_per_s']:>9.0f} tok/s  ratio {row['speed_ratio']:.2f}x  |  "
                  f"peak RSS keel {row['keel_peak_mb']:.0f} MB, torch {row['torch_peak_mb']:.0f} MB "
                  f"(ratio {row['memory_ratio']:.2f})", flush=True)
            if precision == "bf16":
                print(f"{'':6s} keel bf16 vs keel fp32 ({row['keel_fp32_tokens_per_s']:.0f} tok/s): "
                      f"{row['keel_bf16_over_fp32']:.2f}x", flush=True)
            if optimizer == "muon":
                print(f"{'':6s} Newton-Schulz per step: keel {row['keel_ns_ms']:.1f} ms "
                      f"({100 * row['keel_ns_share']:.1f}% of the step), torch {row['torch_ns_ms']:.1f} ms "
                      f"({100 * row['torch_ns_share']:.1f}%)", flush=True)


if __name__ == "__main__":
    main()
