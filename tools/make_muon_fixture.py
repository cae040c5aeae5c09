#!/usr/bin/python3
"""Writes the Muon + QK-Clip reference fixture: three MuonClip steps on a tiny GQA model with
q/k/v biases, computed in float64 with plain PyTorch, stored as F32.

    /usr/bin/python3 tools/make_muon_fixture.py [--out tests/fixtures/muon_qk_clip]

What one step does (the order keel's trainer uses):
  1. loss and gradients of the current weights, and the per-head max scaled logits S_h of that
     forward (tools/reference_model.py);
  2. global-norm gradient clipping (torch's clip_grad_norm_ rule);
  3. Muon (Moonlight's form, arXiv:2502.16982 eqs. 1-4 and examples/toy_train.py) on the 2-D
     hidden matrices: buf = mu*buf + g; u = g + mu*buf (Nesterov); O = NS5(u) with Keller
     Jordan's quintic coefficients after Frobenius normalization, tall matrices transposed;
     W = W*(1 - lr*wd) - lr*0.2*sqrt(max(A, B))*O. AdamW (torch.optim.AdamW) with the same lr on
     embeddings, lm_head, norm gains and biases;
  4. after step 3 only, QK-Clip (Kimi K2, Algorithm 1) from that step's S_h with the GQA rule:
     gamma_h = min(1, tau/S_h); in each KV group g with gamma_min < 1, k rows (and k bias) by
     sqrt(gamma_min) and each query head's q rows (and q bias) by gamma_h/sqrt(gamma_min), so each
     head's logits scale by exactly gamma_h.
tau is set between the 2nd and 3rd largest of the 8 step-3 maxima, so two heads clip, each in a
KV group whose other head does not (the GQA compensation is exercised), with a margin far above
fp32 noise. The fixture stores the weights after the three Muon
steps (before the clip), after the clip, the step losses, the step-3 maxima (of the weights
before step 3's update, as Algorithm 1 uses them), the maxima of the updated weights before and
after the clip, and tau.
"""

import argparse
import json
import math
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import make_fixtures as mf  # noqa: E402
import reference_model as rm  # noqa: E402
import safetensors_py as st  # noqa: E402

NAME = "muon_qk_clip"
LR, MOMENTUM, UPDATE_RMS, WEIGHT_DECAY, MAX_GRAD_NORM, STEPS = 1e-2, 0.95, 0.2, 0.1, 1.0, 3
BETAS, ADAM_EPS = (0.9, 0.95), 1e-8
NS_COEFFS, NS_STEPS, NS_EPS = (3.4445, -4.7750, 2.0315), 5, 1e-7
DT = torch.float64
CONFIG = mf.llama_variant({"qkv_bias": True})
MUON_SUFFIXES = (".q_proj.weight", ".k_proj.weight", ".v_proj.weight", ".o_proj.weight",
                 ".gate_proj.weight", ".up_proj.weight", ".down_proj.weight")


def uses_muon(name):
    return name.endswith(MUON_SUFFIXES)


def newton_schulz5(g):
    a, b, c = NS_COEFFS
    x = g.clone()
    transposed = x.shape[0] > x.shape[1]
    if transposed:
        x = x.T
    x = x / (x.norm() + NS_EPS)
    for _ in range(NS_STEPS):
        A = x @ x.T
        B = b * A + c * A @ A
        x = a * x + B @ x
    return x.T if transposed else x


class MuonWithAdamW:
    def __init__(self):
        self.buf = {}
        self.adamw = rm.AdamW(LR, BETAS, ADAM_EPS, WEIGHT_DECAY)

    def step(self, params, grads, decay):
        rest = {}
        for name, p in params.items():
            if not uses_muon(name):
                rest[name] = p
                continue
            g = grads[name]
            buf = self.buf.setdefault(name, torch.zeros_like(p))
            buf.mul_(MOMENTUM).add_(g)
            u = g + MOMENTUM * buf
            o = newton_schulz5(u)
            rows, cols = p.shape
            if decay[name]:
                p.mul_(1 - LR * WEIGHT_DECAY)
            p.add_(o, alpha=-LR * UPDATE_RMS * math.sqrt(max(rows, cols)))
        self.adamw.step(rest, {n: grads[n] for n in rest}, decay)


def qk_clip_gqa(s, params, max_logit, tau):
    """Returns the number of clipped heads; scales params in place."""
    nh, nkv, hd = s["heads"], s["kv_heads"], s["head_dim"]
    group = nh // nkv
    clipped = 0
    for l in range(s["layers"]):
        pre = f"model.layers.{l}.self_attn."
        gamma = [min(1.0, tau / max_logit[l, h].item()) for h in range(nh)]
        clipped += sum(g < 1.0 for g in gamma)
        for kv in range(nkv):
            heads = range(kv * group, (kv + 1) * group)
            gmin = min(gamma[h] for h in heads)
            if gmin >= 1.0:
                continue
            rows = slice(kv * hd, (kv + 1) * hd)
            for suffix in ("k_proj.weight", "k_proj.bias"):
                if pre + suffix in params:
                    params[pre + suffix][rows] *= math.sqrt(gmin)
            for h in heads:
                rows = slice(h * hd, (h + 1) * hd)
                for suffix in ("q_proj.weight", "q_proj.bias"):
                    if pre + suffix in params:
                        params[pre + suffix][rows] *= gamma[h] / math.sqrt(gmin)
    return clipped


def main():
    here = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default=os.path.join(here, "tests", "fixtures", NAME))
    args = ap.parse_args()
    torch.set_grad_enabled(True)

    # Self-check: NS5 maps a random matrix's singular values into Keller Jordan's band.
    g = torch.Generator().manual_seed(7)
    sv = torch.linalg.svdvals(newton_schulz5(torch.randn(24, 40, generator=g, dtype=DT)))
    assert 0.6 < sv.min().item() and sv.max().item() < 1.2, sv

    s = rm.resolve(CONFIG)
    layout = rm.tensor_layout(s)
    seed = mf.fixture_seed(NAME)
    gen = torch.Generator().manual_seed(seed)
    tokens = torch.randint(0, s["vocab"], (mf.BATCH, mf.SEQ), generator=gen, dtype=torch.int64)
    params, decay = mf.init_params(layout, gen, None)
    initial = {k: v.clone() for k, v in params.items()}

    opt = MuonWithAdamW()
    losses, step_max, first_grads = [], None, None
    for _ in range(STEPS):
        loss, _, _, max_logit, grads = mf.loss_grads(s, params, tokens)
        first_grads = first_grads or {k: v.clone() for k, v in grads.items()}
        losses.append(loss.item())
        step_max = max_logit
        rm.clip_grad_norm([grads[n] for n in params], MAX_GRAD_NORM)
        opt.step(params, grads, decay)
    after_muon = {k: v.clone() for k, v in params.items()}

    ordered = sorted(step_max.flatten().tolist(), reverse=True)
    tau = 0.5 * (ordered[1] + ordered[2])
    margin = min(abs(x - tau) for x in ordered) / tau
    assert margin > 1e-3, f"tau {tau} too close to a head's max logit (relative gap {margin})"
    clipped = qk_clip_gqa(s, params, step_max, tau)
    assert clipped == 2, clipped
    # At least one KV group must hold a clipped and an unclipped head (the GQA compensation).
    group = s["heads"] // s["kv_heads"]
    over = (step_max > tau).view(s["layers"], s["kv_heads"], group)
    assert (over.any(-1) & ~over.all(-1)).any(), over

    # Check: the clip multiplies every head's logits by exactly gamma_h. S_h came from the forward
    # before step 3's update (Algorithm 1's one-step lag), so the clipped maxima are gamma_h times
    # the maxima of the updated weights, which sit near but not exactly on tau. Exact for layer 0
    # only: clipping layer 0 changes the inputs of layer 1.
    _, _, _, updated_max, _ = mf.loss_grads(s, after_muon, tokens)
    _, _, _, clipped_max, _ = mf.loss_grads(s, params, tokens)
    gamma = torch.clamp(tau / step_max, max=1.0)
    assert torch.allclose(clipped_max[0], gamma[0] * updated_max[0], rtol=1e-12, atol=0), (clipped_max, updated_max)

    f32 = lambda t: t.detach().to(torch.float32).contiguous().numpy()  # noqa: E731
    tensors = {"tokens": tokens.numpy(), "step_losses": f32(torch.tensor(losses, dtype=DT)),
               "step3_max_logit": f32(step_max), "updated_max_logit": f32(updated_max),
               "clipped_max_logit": f32(clipped_max),
               "tau": f32(torch.tensor([tau], dtype=DT))}
    for n, _, _ in layout:
        tensors["param." + n] = f32(initial[n])
        tensors["grad." + n] = f32(first_grads[n])  # step 1, before clipping
        tensors["muon3." + n] = f32(after_muon[n])
        tensors["clipped." + n] = f32(params[n])
    metadata = {
        "format": "keel-reference", "format_version": mf.FORMAT_VERSION, "fixture": NAME,
        "family": s["family"], "torch_version": torch.__version__, "compute_dtype": "float64",
        "stored_dtype": "F32", "batch": str(mf.BATCH), "seq": str(mf.SEQ), "seed": str(seed),
        "optimizer": "muon", "muon_scaling": "moonlight", "lr": repr(LR), "momentum": repr(MOMENTUM),
        "nesterov": "true", "update_rms": repr(UPDATE_RMS), "ns_steps": str(NS_STEPS),
        "ns_coefficients": json.dumps(NS_COEFFS), "weight_decay": repr(WEIGHT_DECAY),
        "beta1": repr(BETAS[0]), "beta2": repr(BETAS[1]), "adam_eps": repr(ADAM_EPS),
        "max_grad_norm": repr(MAX_GRAD_NORM), "steps": str(STEPS), "tau": repr(tau),
        "clipped_heads": str(clipped),
        "muon_params": ",".join(n for n, _, _ in layout if uses_muon(n)),
        "decay_params": ",".join(n for n, _, _ in layout if decay[n]),
        "config": json.dumps(CONFIG, sort_keys=True),
    }
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "config.json"), "w") as f:
        json.dump(CONFIG, f, indent=2)
        f.write("\n")
    path = os.path.join(args.out, "muon_reference.safetensors")
    st.save_file(tensors, path, metadata)
    back, meta = st.load_file(path)
    assert meta == metadata and set(back) == set(tensors)
    print(f"{NAME}: step losses {[round(x, 6) for x in losses]}, step-3 max logits "
          f"{[round(x, 3) for x in step_max.flatten().tolist()]}, tau {tau:.4f}, {clipped} heads clipped, "
          f"{os.path.getsize(path) // 1024} KiB")


if __name__ == "__main__":
    main()
