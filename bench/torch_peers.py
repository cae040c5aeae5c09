"""PyTorch peers for keel's training-step benchmarks: the same model and step written the ways
PyTorch users write them, so that bench/train_step_vs_pytorch.py can measure every candidate and
race keel against the fastest one on the machine (docs/performance.md, "The peer").

Candidates (`PEERS`):
  reference       tools/reference_model.py: the HF modeling code's math over a dict of tensors
                  (the model that writes the correctness fixtures), torch.optim.AdamW (for-loop).
  plain           a nanoGPT-style nn.Module: nn.Linear / nn.Embedding, explicit causal-masked
                  attention, F.cross_entropy, torch.optim.AdamW(foreach=False).
  plain_foreach   the same model with AdamW(foreach=True): multi-tensor AdamW.
  plain_fused     the same model with the attention scores and softmax computed by one
                  torch.baddbmm into a preallocated mask bias, foreach AdamW, set_to_none grads.

Each is run under either BLAS Debian ships for PyTorch (the OpenMP build of OpenBLAS through
LD_LIBRARY_PATH, or the default pthread build), which is the other half of the search.

Only dense Qwen3-style (RMSNorm, QK-Norm, RoPE, GQA, SwiGLU) and GPT-2-style (LayerNorm, learned
positions, GELU-tanh, tied head) configs have a plain model; other families use `reference`.
"""
import math

import torch
import torch.nn as nn
import torch.nn.functional as F


class RMSNorm(nn.Module):
    def __init__(self, dim, eps):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight


def rope_tables(seq, head_dim, theta):
    inv = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.float32) / head_dim))
    freqs = torch.outer(torch.arange(seq, dtype=torch.float32), inv)
    emb = torch.cat([freqs, freqs], dim=-1)
    return emb.cos(), emb.sin()


def rotate_half(x):
    h = x.shape[-1] // 2
    return torch.cat([-x[..., h:], x[..., :h]], dim=-1)


class Attention(nn.Module):
    def __init__(self, c, fused):
        super().__init__()
        self.gpt2 = c["gpt2"]
        self.h, self.kv, self.d = c["heads"], c["kv_heads"], c["head_dim"]
        hidden = c["hidden"]
        if self.gpt2:
            self.c_attn = nn.Linear(hidden, 3 * hidden)
            self.c_proj = nn.Linear(hidden, hidden)
        else:
            self.q_proj = nn.Linear(hidden, self.h * self.d, bias=False)
            self.k_proj = nn.Linear(hidden, self.kv * self.d, bias=False)
            self.v_proj = nn.Linear(hidden, self.kv * self.d, bias=False)
            self.o_proj = nn.Linear(self.h * self.d, hidden, bias=False)
            self.q_norm = RMSNorm(self.d, c["eps"])
            self.k_norm = RMSNorm(self.d, c["eps"])
        self.fused = fused

    def forward(self, x, cos, sin, mask):
        B, T, _ = x.shape
        if self.gpt2:
            q, k, v = self.c_attn(x).split(self.h * self.d, dim=2)
            q = q.view(B, T, self.h, self.d).transpose(1, 2)
            k = k.view(B, T, self.h, self.d).transpose(1, 2)
            v = v.view(B, T, self.h, self.d).transpose(1, 2)
        else:
            q = self.q_norm(self.q_proj(x).view(B, T, self.h, self.d)).transpose(1, 2)
            k = self.k_norm(self.k_proj(x).view(B, T, self.kv, self.d)).transpose(1, 2)
            v = self.v_proj(x).view(B, T, self.kv, self.d).transpose(1, 2)
            q = q * cos + rotate_half(q) * sin
            k = k * cos + rotate_half(k) * sin
            rep = self.h // self.kv
            if rep > 1:
                k = k.repeat_interleave(rep, dim=1)
                v = v.repeat_interleave(rep, dim=1)
        scale = 1.0 / math.sqrt(self.d)
        if self.fused:
            # scores = mask + scale * q k^T in one batched GEMM with beta = 1
            qf = q.reshape(B * self.h, T, self.d)
            kf = k.reshape(B * self.h, T, self.d)
            att = torch.baddbmm(mask.expand(B * self.h, T, T), qf, kf.transpose(1, 2), alpha=scale)
            att = att.softmax(dim=-1)
            y = torch.bmm(att, v.reshape(B * self.h, T, self.d)).view(B, self.h, T, self.d)
        else:
            att = (q @ k.transpose(-2, -1)) * scale
            att = att.masked_fill(mask, float("-inf"))
            y = F.softmax(att, dim=-1) @ v
        y = y.transpose(1, 2).reshape(B, T, self.h * self.d)
        return self.c_proj(y) if self.gpt2 else self.o_proj(y)


class MLP(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.gpt2 = c["gpt2"]
        if self.gpt2:
            self.c_fc = nn.Linear(c["hidden"], c["ffn"])
            self.c_proj = nn.Linear(c["ffn"], c["hidden"])
        else:
            self.gate_proj = nn.Linear(c["hidden"], c["ffn"], bias=False)
            self.up_proj = nn.Linear(c["hidden"], c["ffn"], bias=False)
            self.down_proj = nn.Linear(c["ffn"], c["hidden"], bias=False)

    def forward(self, x):
        if self.gpt2:
            return self.c_proj(F.gelu(self.c_fc(x), approximate="tanh"))
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class Block(nn.Module):
    def __init__(self, c, fused):
        super().__init__()
        norm = (lambda: nn.LayerNorm(c["hidden"], eps=c["eps"])) if c["gpt2"] else (lambda: RMSNorm(c["hidden"], c["eps"]))
        self.ln_1, self.ln_2 = norm(), norm()
        self.attn = Attention(c, fused)
        self.mlp = MLP(c)

    def forward(self, x, cos, sin, mask):
        x = x + self.attn(self.ln_1(x), cos, sin, mask)
        return x + self.mlp(self.ln_2(x))


class PlainLM(nn.Module):
    def __init__(self, c, seq, fused):
        super().__init__()
        self.c = c
        self.wte = nn.Embedding(c["vocab"], c["hidden"])
        if c["gpt2"]:
            self.wpe = nn.Embedding(c["positions"], c["hidden"])
            self.ln_f = nn.LayerNorm(c["hidden"], eps=c["eps"])
        else:
            self.ln_f = RMSNorm(c["hidden"], c["eps"])
        self.h = nn.ModuleList([Block(c, fused) for _ in range(c["layers"])])
        self.lm_head = nn.Linear(c["hidden"], c["vocab"], bias=False)
        if c["tie"]:
            self.lm_head.weight = self.wte.weight
        for name, p in self.named_parameters():
            if p.dim() == 2:
                nn.init.normal_(p, std=0.02)
        cos, sin = rope_tables(seq, c["head_dim"], c["theta"])
        self.register_buffer("cos", cos, persistent=False)
        self.register_buffer("sin", sin, persistent=False)
        causal = torch.ones(seq, seq, dtype=torch.bool).triu(1)
        if fused:
            self.register_buffer("mask", torch.zeros(seq, seq).masked_fill(causal, float("-inf")), persistent=False)
        else:
            self.register_buffer("mask", causal, persistent=False)

    def forward(self, idx, targets):
        B, T = idx.shape
        x = self.wte(idx)
        if self.c["gpt2"]:
            x = x + self.wpe(torch.arange(T))
        for block in self.h:
            x = block(x, self.cos[:T], self.sin[:T], self.mask[:T, :T])
        logits = self.lm_head(self.ln_f(x))
        # .float(): under autocast the logits are bf16 and the loss is taken in fp32, as the
        # reference peer takes it; in fp32 it returns the tensor itself.
        return F.cross_entropy(logits.float().view(-1, logits.size(-1)), targets.view(-1))


def plain_config(cfg):
    """The fields the plain model needs from an HF config.json, or None for families it lacks."""
    mt = cfg.get("model_type")
    if mt == "gpt2":
        hidden = cfg["n_embd"]
        return {"gpt2": True, "hidden": hidden, "layers": cfg["n_layer"], "heads": cfg["n_head"],
                "kv_heads": cfg["n_head"], "head_dim": hidden // cfg["n_head"],
                "ffn": cfg.get("n_inner") or 4 * hidden, "vocab": cfg["vocab_size"],
                "positions": cfg.get("n_positions", 1024), "eps": cfg.get("layer_norm_epsilon", 1e-5),
                "tie": True, "theta": 10000.0}
    if mt in ("qwen3", "llama", "mistral", "qwen2") and cfg.get("hidden_act", "silu") == "silu":
        if mt != "qwen3":
            return None  # the plain model's attention has QK-Norm, as Qwen3's does
        heads = cfg["num_attention_heads"]
        return {"gpt2": False, "hidden": cfg["hidden_size"], "layers": cfg["num_hidden_layers"], "heads": heads,
                "kv_heads": cfg.get("num_key_value_heads", heads),
                "head_dim": cfg.get("head_dim") or cfg["hidden_size"] // heads,
                "ffn": cfg["intermediate_size"], "vocab": cfg["vocab_size"], "eps": cfg.get("rms_norm_eps", 1e-6),
                "tie": bool(cfg.get("tie_word_embeddings", False)), "theta": float(cfg.get("rope_theta", 10000.0))}
    return None


def make_plain_step(cfg, batch, seq, variant, precision="fp32"):
    """(step(), n_params) for the plain model; step() runs forward, backward, clip and AdamW.
    precision "bf16": the forward and loss under torch.autocast("cpu", dtype=torch.bfloat16) on
    fp32 parameters, as the reference peer's bf16 step runs (the backward outside it)."""
    c = plain_config(cfg)
    model = PlainLM(c, seq, fused=variant == "plain_fused")
    decay = [p for p in model.parameters() if p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    foreach = variant in ("plain_foreach", "plain_fused")
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1}, {"params": no_decay, "weight_decay": 0.0}],
                            lr=1e-4, betas=(0.9, 0.95), eps=1e-8, foreach=foreach)
    g = torch.Generator().manual_seed(0)
    idx = torch.randint(0, c["vocab"], (batch, seq), generator=g)
    targets = torch.randint(0, c["vocab"], (batch, seq), generator=g)
    params = list(model.parameters())

    def step():
        opt.zero_grad(set_to_none=True)
        if precision == "bf16":
            with torch.autocast("cpu", dtype=torch.bfloat16):
                loss = model(idx, targets)
        else:
            loss = model(idx, targets)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0, foreach=foreach) if _clip_has_foreach() else \
            torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        return 0.0
    return step, sum(p.numel() for p in params)


def _clip_has_foreach():
    import inspect
    return "foreach" in inspect.signature(torch.nn.utils.clip_grad_norm_).parameters
