"""Reference implementations of keel's dense families, in plain PyTorch, following Hugging Face
transformers' modeling code line by line (transformers itself is not a dependency).

Every block below names the transformers function it reproduces. Everything runs in whatever
dtype the parameters have; make_fixtures.py uses torch.float64 so that the fixtures hold the
exact math (HF upcasts norms and softmax to fp32; in float64 those casts are no-ops).

Families: gpt2, llama, mistral, qwen2, qwen3, olmo2, gemma2, gemma3_text, deepseek_v3 / kimi_k2 with Multi-head Latent
Attention and dense MLPs in every layer (first_k_dense_replace >= num_hidden_layers), and the MoE
families mixtral, qwen3_moe and glm4_moe (standard attention; the DeepSeek-V3 router), deepseek_v2
(MLA with complex-pair RoPE, the softmax greedy / group_limited_greedy router) and gpt_oss
(attention sinks, alternating sliding window, YaRN, the biased top-k router and the fused, clamped
SwiGLU experts), plus keel's variants declared by the optional "keel" object in config.json: norm
(rmsnorm|layernorm|rmsnorm_1p), norm_placement (pre|post|sandwich|post_sublayer), qk_norm (bool,
"per_head", "full_width"), qkv_bias, z_loss, attn_softcap, final_softcap, embed_scale (a number or
"sqrt_hidden"), attn_sinks (gpt-oss sinks), attn_output_gate (Qwen3-Next's gated attention).

Parameters are a dict {hf_name: tensor} with exactly the names and shapes of the HF
checkpoints (and of keel's src/keel/arch/hf_tensors.cpp).
"""

import math

import torch
import torch.nn.functional as F


# --------------------------------------------------------------------------------------------
# Config -> resolved architecture (mirrors keel's ModelSpec and each family's Config class)
# --------------------------------------------------------------------------------------------

# transformers Config defaults that matter here.
_FAMILY_DEFAULTS = {
    # model_type: (rms_norm_eps default, rope_theta default, tie default, head_dim default or None)
    "llama": (1e-6, 10000.0, False, None),     # LlamaConfig
    "mistral": (1e-6, 10000.0, False, None),   # MistralConfig
    "qwen2": (1e-6, 10000.0, False, None),     # Qwen2Config
    "qwen3": (1e-6, 10000.0, False, 128),      # Qwen3Config.head_dim = 128
    "deepseek_v3": (1e-6, 10000.0, False, None),  # DeepseekV3Config
    "kimi_k2": (1e-6, 10000.0, False, None),      # Kimi K2 ships the DeepSeek-V3 architecture
    "mixtral": (1e-5, 1e6, False, None),       # MixtralConfig
    "qwen3_moe": (1e-6, 10000.0, False, 128),  # Qwen3MoeConfig
    "glm4_moe": (1e-5, 10000.0, False, 128),   # Glm4MoeConfig (partial_rotary_factor 0.5)
    "olmo2": (1e-5, 10000.0, False, None),     # Olmo2Config
    "gemma2": (1e-6, 10000.0, True, 256),      # Gemma2Config
    "gemma3_text": (1e-6, 1e6, True, 256),     # Gemma3TextConfig
    "gpt_oss": (1e-5, 150000.0, False, 64),    # GptOssConfig (head_dim 64, rope_theta 150000)
    "deepseek_v2": (1e-6, 10000.0, False, None),  # DeepseekV2Config
}

_MLA_FAMILIES = ("deepseek_v3", "kimi_k2", "deepseek_v2")


def resolve_moe(cfg, mt, layers):
    """MoE fields: MixtralSparseMoeBlock, Qwen3MoeSparseMoeBlock (+ Qwen3MoeDecoderLayer's sparse
    rule), Glm4MoeMoE / DeepseekV3MoE with the sigmoid TopkRouter (first_k_dense_replace)."""
    if mt == "mixtral":
        return dict(moe=True, router="softmax", experts=cfg["num_local_experts"], top_k=cfg["num_experts_per_tok"],
                    norm_topk=True, scaling=1.0, n_group=1, topk_group=1, moe_inter=cfg["intermediate_size"],
                    shared_inter=0, moe_layers=list(range(layers)), moe_prefix="block_sparse_moe",
                    expert_names=("w1", "w3", "w2"), score_bias=False)
    if mt == "qwen3_moe":
        dense = set(cfg.get("mlp_only_layers", []))
        step = cfg.get("decoder_sparse_step", 1)
        moe_layers = [l for l in range(layers) if l not in dense and cfg.get("num_experts", 0) > 0 and (l + 1) % step == 0]
        return dict(moe=True, router="softmax", experts=cfg["num_experts"], top_k=cfg["num_experts_per_tok"],
                    norm_topk=bool(cfg.get("norm_topk_prob", False)), scaling=1.0, n_group=1, topk_group=1,
                    moe_inter=cfg["moe_intermediate_size"], shared_inter=0, moe_layers=moe_layers, moe_prefix="mlp",
                    expert_names=("gate_proj", "up_proj", "down_proj"), score_bias=False)
    if mt == "glm4_moe":
        first = cfg.get("first_k_dense_replace", 1)
        return dict(moe=True, router="sigmoid", experts=cfg["n_routed_experts"], top_k=cfg["num_experts_per_tok"],
                    norm_topk=bool(cfg.get("norm_topk_prob", True)),
                    scaling=float(cfg.get("routed_scaling_factor", 1.0)), n_group=cfg.get("n_group", 1),
                    topk_group=cfg.get("topk_group", 1), moe_inter=cfg["moe_intermediate_size"],
                    shared_inter=cfg["moe_intermediate_size"] * cfg.get("n_shared_experts", 1),
                    moe_layers=[l for l in range(layers) if l >= first], moe_prefix="mlp",
                    expert_names=("gate_proj", "up_proj", "down_proj"), score_bias=True)
    if mt == "gpt_oss":
        # GptOssMLP in every layer: GptOssTopKRouter (linear with bias, top-k of the logits, softmax
        # over those k) and GptOssExperts (fused, interleaved gate/up, clamped SwiGLU with biases).
        # GptOssExperts.__init__ hard-codes alpha 1.702 and limit 7.0 in the modeling code read;
        # GptOssConfig documents swiglu_alpha / swiglu_limit (defaults 1.702 / 7.0) and the released
        # configs carry swiglu_limit 7.0, so reading the config is the same model for them.
        return dict(moe=True, router="gpt_oss", experts=cfg["num_local_experts"], top_k=cfg.get("num_experts_per_tok", 4),
                    norm_topk=True, scaling=1.0, n_group=1, topk_group=1, moe_inter=cfg["intermediate_size"],
                    shared_inter=0, moe_layers=list(range(layers)), moe_prefix="mlp", expert_names=None,
                    score_bias=False, swiglu_limit=float(cfg.get("swiglu_limit", 7.0)),
                    swiglu_alpha=float(cfg.get("swiglu_alpha", 1.702)))
    if mt == "deepseek_v2":
        # DeepseekV2Moe (modeling_deepseek_v2.py): softmax over the experts, then route_tokens_to_experts
        # with topk_method "greedy" (top-k of the probabilities) or "group_limited_greedy" (group
        # score = max within the group, topk_group groups kept, the rest masked_fill(0.0), top-k),
        # weights = the chosen probabilities * routed_scaling_factor; shared_experts always added.
        # DeepseekV2DecoderLayer: MoE iff layer_idx >= first_k_dense_replace (HF ignores
        # moe_layer_freq; DeepSeek's own modeling_deepseek.py also requires layer_idx % moe_layer_freq
        # == 0, which is the same rule at the released moe_layer_freq 1 -- that rule is used here).
        first, freq = cfg.get("first_k_dense_replace", 0), cfg.get("moe_layer_freq", 1)
        n_shared = cfg.get("n_shared_experts", 2)
        method = cfg.get("topk_method", "greedy")
        if method not in ("greedy", "group_limited_greedy"):
            raise ValueError(f"deepseek_v2 topk_method {method} not implemented")
        return dict(moe=True, router="deepseek_v2", topk_method=method, experts=cfg["n_routed_experts"],
                    top_k=cfg["num_experts_per_tok"], norm_topk=bool(cfg.get("norm_topk_prob", False)),
                    scaling=float(cfg.get("routed_scaling_factor", 1.0)), n_group=cfg.get("n_group") or 1,
                    topk_group=cfg.get("topk_group") or 1, moe_inter=cfg["moe_intermediate_size"],
                    shared_inter=cfg["moe_intermediate_size"] * n_shared if n_shared else 0,
                    moe_layers=[l for l in range(layers) if l >= first and l % freq == 0], moe_prefix="mlp",
                    expert_names=("gate_proj", "up_proj", "down_proj"), score_bias=False)
    return dict(moe=False, moe_layers=[])


_KEEL_ATTN_KEYS = ("attn_sinks", "attn_output_gate")


def resolve(cfg):
    """Returns a dict describing the architecture that HF (and keel) derive from config.json."""
    mt = cfg["model_type"]
    keel = cfg.get("keel") or {}
    s = {"family": mt}
    if mt == "gpt2":
        # GPT2Config: n_embd, n_head, n_layer, n_positions, n_inner (None -> 4 * n_embd),
        # activation_function (default gelu_new), layer_norm_epsilon; lm_head always tied.
        H = cfg["n_embd"]
        s.update(
            hidden=H, heads=cfg["n_head"], kv_heads=cfg["n_head"], head_dim=H // cfg["n_head"],
            layers=cfg["n_layer"], vocab=cfg["vocab_size"], positions=cfg["n_positions"],
            inter=cfg.get("n_inner") or 4 * H, act=cfg.get("activation_function", "gelu_new"),
            eps=cfg.get("layer_norm_epsilon", 1e-5), norm="layernorm", placement="pre",
            tie=True, qk_norm=False, qkv_bias=True, o_bias=True, mlp_bias=True, gated=False,
            rope=None, scale_attn_by_inverse_layer_idx=cfg.get("scale_attn_by_inverse_layer_idx", False),
        )
        s.update(z_loss=float(keel.get("z_loss", 0.0)), attn_softcap=float(keel.get("attn_softcap", 0.0)),
                 final_softcap=float(keel.get("final_softcap", 0.0)), embed_scale=_embed_scale(keel, H))
        if any(keel.get(k) for k in _KEEL_ATTN_KEYS) or keel.get("norm") == "rmsnorm_1p":
            raise ValueError("keel attn_sinks / attn_output_gate / rmsnorm_1p are not defined for gpt2")
        return s

    if mt not in _FAMILY_DEFAULTS:
        raise ValueError(f"unsupported model_type {mt}")
    eps_d, theta_d, tie_d, hd_d = _FAMILY_DEFAULTS[mt]
    if mt in _MLA_FAMILIES:
        return _resolve_mla(cfg, keel, s, eps_d, theta_d, tie_d)
    H = cfg["hidden_size"]
    heads = cfg["num_attention_heads"]
    kv = cfg.get("num_key_value_heads") or heads
    head_dim = cfg.get("head_dim") or (hd_d if hd_d else H // heads)
    attention_bias = bool(cfg.get("attention_bias", mt == "gpt_oss"))  # GptOssConfig.attention_bias = True
    if mt == "llama":      # LlamaAttention: q,k,v,o all use bias=config.attention_bias
        qkv_bias, o_bias = attention_bias, attention_bias
        mlp_bias = bool(cfg.get("mlp_bias", False))   # LlamaMLP: bias=config.mlp_bias
    elif mt == "mistral":  # MistralAttention: no biases
        qkv_bias, o_bias, mlp_bias = False, False, False
    elif mt == "qwen2":    # Qwen2Attention: q,k,v bias=True, o_proj bias=False
        qkv_bias, o_bias, mlp_bias = True, False, False
    elif mt == "mixtral":  # MixtralAttention: no biases
        qkv_bias, o_bias, mlp_bias = False, False, False
    elif mt == "glm4_moe":  # Glm4MoeAttention: q,k,v bias=config.attention_bias, o_proj bias=False
        qkv_bias, o_bias, mlp_bias = attention_bias, False, False
    else:                  # Qwen3Attention / Qwen3MoeAttention / Olmo2Attention: q,k,v,o bias=config.attention_bias
        qkv_bias, o_bias, mlp_bias = attention_bias, attention_bias, False
    qk_norm = mt in ("qwen3", "qwen3_moe", "olmo2", "gemma3_text")  # Qwen3/Olmo2/Gemma3Attention q_norm, k_norm
    # Olmo2Attention: q_norm = Olmo2RMSNorm(num_heads * head_dim), k_norm over num_kv_heads * head_dim
    qk_full = mt == "olmo2"
    if mt == "glm4_moe":
        qk_norm = bool(cfg.get("use_qk_norm", False))
    if "qkv_bias" in keel:   # keel: switches only q, k, v biases
        qkv_bias = bool(keel["qkv_bias"])
    if "qk_norm" in keel:
        if isinstance(keel["qk_norm"], str):
            qk_norm, qk_full = True, keel["qk_norm"] == "full_width"
        else:
            qk_norm = bool(keel["qk_norm"])
    # Olmo2DecoderLayer: no input_layernorm; post_attention / post_feedforward norms after each sublayer.
    # Gemma2DecoderLayer: four norms, before and after each sublayer.
    placement_d = {"olmo2": "post_sublayer", "gemma2": "sandwich", "gemma3_text": "sandwich"}.get(mt, "pre")
    s.update(
        hidden=H, heads=heads, kv_heads=kv, head_dim=head_dim, layers=cfg["num_hidden_layers"],
        vocab=cfg["vocab_size"], inter=cfg["intermediate_size"], act=cfg.get("hidden_act", "silu"),
        eps=float(cfg.get("rms_norm_eps", eps_d)), norm=keel.get("norm", "rmsnorm"),
        placement=keel.get("norm_placement", placement_d), tie=bool(cfg.get("tie_word_embeddings", tie_d)),
        qk_norm=qk_norm, qk_full=qk_full, qkv_bias=qkv_bias, o_bias=o_bias, mlp_bias=mlp_bias, gated=True,
        rope={"theta": float(cfg.get("rope_theta", theta_d)), "scaling": cfg.get("rope_scaling")},
        z_loss=float(keel.get("z_loss", 0.0)), attn_softcap=float(keel.get("attn_softcap", 0.0)),
        final_softcap=float(keel.get("final_softcap", 0.0)), embed_scale=_embed_scale(keel, H),
    )
    _resolve_keel_attention(cfg, keel, s, mt)
    if mt in ("gemma2", "gemma3_text"):
        _resolve_gemma(cfg, s, mt)
    _resolve_decoder_window(cfg, s, mt)
    # Glm4MoeRotaryEmbedding: only the first head_dim * partial_rotary_factor dims rotate.
    prf = float(cfg.get("partial_rotary_factor", 0.5 if mt == "glm4_moe" else 1.0))
    s["rotary_dim"] = int(head_dim * prf)
    s.update(resolve_moe(cfg, mt, s["layers"]))
    return s


def _resolve_keel_attention(cfg, keel, s, mt):
    """keel.attn_sinks: GptOssAttention's learned per-head sink logit (self_attn.sinks [heads]) in
    every layer's softmax (modeling_gpt_oss.eager_attention_forward); always on for gpt_oss.
    keel.attn_output_gate: Qwen3NextAttention's output gate (q_proj twice as wide, per head
    [query | gate], attn_output * sigmoid(gate) before o_proj; modeling_qwen3_next.py).
    keel.norm "rmsnorm_1p": Qwen3NextRMSNorm, x_hat * (1 + w) (Gemma's form) for every RMSNorm
    including q_norm / k_norm; its weights are weight-decayed (see decays)."""
    s["attn_sinks"] = mt == "gpt_oss" or bool(keel.get("attn_sinks", False))
    s["attn_gate"] = bool(keel.get("attn_output_gate", False))
    if s["norm"] == "rmsnorm_1p":
        if mt in ("gemma2", "gemma3_text"):
            raise ValueError("rmsnorm_1p on a Gemma family: its norms already are x_hat * (1 + w)")
        s["norm_offset"] = True
    elif s["norm"] not in ("rmsnorm", "layernorm"):
        raise ValueError(f"unknown keel norm {s['norm']}")
    if mt == "gpt_oss":
        # GptOssRotaryEmbedding reads rope_scaling (YaRN by default, truncate false in the released
        # config); yarn's original_max_position_embeddings falls back to max_position_embeddings.
        s["rope"]["max_positions"] = cfg.get("max_position_embeddings", 131072)


def _resolve_gemma(cfg, s, mt):
    """Gemma2Config / modeling_gemma2.py: Gemma2MLP's act_fn = ACT2FN[config.hidden_activation];
    Gemma2RMSNorm: x_hat * (1 + w); Gemma2Model: hidden * normalizer (sqrt(hidden_size));
    Gemma2Attention: scaling = query_pre_attn_scalar ** -0.5, attn_logit_softcapping before the
    mask; Gemma2ForCausalLM: final_logit_softcapping; sliding_window on layer_types
    ("sliding_attention" if (i + 1) % 2 else "full_attention" by default). A null cap is off.
    Gemma3TextConfig / modeling_gemma3.py: the same layer with q_norm / k_norm (Gemma3RMSNorm over
    head_dim, before RoPE), no soft-caps by default, (i + 1) % sliding_window_pattern (6) for the
    layer types, and the local layers' RoPE from rope_local_base_freq without rope_scaling."""
    gemma3 = mt == "gemma3_text"

    def cap(field, default):
        v = cfg.get(field, None if gemma3 else default)
        return 0.0 if v is None else float(v)
    s["act"] = cfg.get("hidden_activation", "gelu_pytorch_tanh")
    s["norm_offset"] = True
    s["embed_scale"] = s["hidden"] ** 0.5
    s["query_scale"] = float(cfg.get("query_pre_attn_scalar", 256)) ** -0.5
    s["attn_softcap"] = cap("attn_logit_softcapping", 50.0)
    s["final_softcap"] = cap("final_logit_softcapping", 30.0)
    s["sliding_window"] = cfg.get("sliding_window", 4096) or 0
    pattern = cfg.get("sliding_window_pattern", 6) if gemma3 else 2
    types = cfg.get("layer_types") or ["sliding_attention" if (i + 1) % pattern else "full_attention"
                                       for i in range(s["layers"])]
    s["sliding_layers"] = [i for i, t in enumerate(types) if t == "sliding_attention"]
    if gemma3:
        s["local_rope"] = {"theta": float(cfg.get("rope_local_base_freq", 10000.0)), "scaling": None}


def _resolve_decoder_window(cfg, s, mt):
    """Sliding windows outside Gemma. MistralAttention / MixtralAttention pass
    sliding_window=config.sliding_window to every layer (MistralConfig default 4096, Mixtral None).
    Qwen2Config / Qwen3Config: sliding_window is None unless use_sliding_window, and
    layer_types[i] = "sliding_attention" if i >= max_window_layers (default 28). Qwen3MoeAttention
    passes config.sliding_window (None unless use_sliding_window) to every layer."""
    L = s["layers"]
    if mt in ("mistral", "mixtral"):
        w = cfg.get("sliding_window", 4096 if mt == "mistral" else None) or 0
        s["sliding_window"], s["sliding_layers"] = w, list(range(L)) if w else []
    elif mt in ("qwen2", "qwen3", "qwen3_moe") and cfg.get("use_sliding_window", False):
        w = cfg.get("sliding_window", 4096) or 0
        first = cfg.get("max_window_layers", 28)
        types = cfg.get("layer_types") or ["sliding_attention" if i >= first else "full_attention" for i in range(L)]
        if mt == "qwen3_moe":
            types = ["sliding_attention"] * L
        s["sliding_window"] = w
        s["sliding_layers"] = [i for i, t in enumerate(types) if t == "sliding_attention"] if w else []
    elif mt == "gpt_oss":
        # GptOssConfig: sliding_window 128, layer_types[i] = "sliding_attention" if (i + 1) % 2 else
        # "full_attention" (layer 0 sliding); GptOssAttention: sliding_window only on sliding layers.
        w = cfg.get("sliding_window", 128) or 0
        types = cfg.get("layer_types") or ["sliding_attention" if (i + 1) % 2 else "full_attention" for i in range(L)]
        s["sliding_window"] = w
        s["sliding_layers"] = [i for i, t in enumerate(types) if t == "sliding_attention"] if w else []


def _embed_scale(keel, hidden):
    """keel.embed_scale: the factor on the token embeddings (Vaswani et al. 2017 §3.4 and Gemma
    use sqrt(hidden_size))."""
    v = keel.get("embed_scale", 1.0)
    return math.sqrt(hidden) if v == "sqrt_hidden" else float(v)


def _resolve_mla(cfg, keel, s, eps_d, theta_d, tie_d):
    """DeepseekV3Config: MLA ranks and head dims; attention_bias applies to q_a_proj,
    kv_a_proj_with_mqa and o_proj (DeepseekV3Attention.__init__); rope_interleave defaults to
    True. Layers >= first_k_dense_replace are DeepseekV3MoE, the same block as Glm4MoeMoE (sigmoid
    TopkRouter with e_score_correction_bias, group-limited top-k, shared experts)."""
    if any(keel.get(k) for k in _KEEL_ATTN_KEYS) or keel.get("norm") == "rmsnorm_1p":
        raise ValueError("keel attn_sinks / attn_output_gate / rmsnorm_1p are defined for the llama-style attention only")
    L = cfg["num_hidden_layers"]
    nope, rope, v = cfg["qk_nope_head_dim"], cfg["qk_rope_head_dim"], cfg["v_head_dim"]
    v2 = s["family"] == "deepseek_v2"
    bias = bool(cfg.get("attention_bias", False))
    heads = cfg["num_attention_heads"]
    s.update(
        hidden=cfg["hidden_size"], heads=heads, kv_heads=heads, head_dim=nope + rope,
        layers=L, vocab=cfg["vocab_size"], inter=cfg["intermediate_size"], act=cfg.get("hidden_act", "silu"),
        eps=float(cfg.get("rms_norm_eps", eps_d)), norm="rmsnorm", placement="pre",
        tie=bool(cfg.get("tie_word_embeddings", tie_d)), qk_norm=False, qkv_bias=bias, o_bias=bias,
        mlp_bias=False, gated=True,
        rope={"theta": float(cfg.get("rope_theta", theta_d)), "scaling": cfg.get("rope_scaling"),
              "max_positions": cfg.get("max_position_embeddings", 4096)},
        rope_dim=rope,
        mla={"q_lora_rank": cfg.get("q_lora_rank"), "kv_lora_rank": cfg["kv_lora_rank"], "nope": nope,
             "rope": rope, "v": v, "interleave": True if v2 else bool(cfg.get("rope_interleave", True)),
             # DeepseekV2: apply_rotary_emb multiplies (2i, 2i+1) pairs as complex numbers in place;
             # DeepseekV2Attention.scaling is qk_head_dim ** -0.5 with no YaRN mscale factor.
             "complex_rope": v2, "mscale_scale": not v2},
        z_loss=float(keel.get("z_loss", 0.0)), attn_softcap=float(keel.get("attn_softcap", 0.0)),
        final_softcap=float(keel.get("final_softcap", 0.0)), embed_scale=_embed_scale(keel, cfg["hidden_size"]),
    )
    if v2:
        s.update(resolve_moe(cfg, "deepseek_v2", L))
    else:
        moe_cfg = dict(cfg, first_k_dense_replace=cfg.get("first_k_dense_replace", 3))  # DeepseekV3Config default
        s.update(resolve_moe(moe_cfg, "glm4_moe", L))
    if not s["moe_layers"]:
        s.update(moe=False)
    return s


# --------------------------------------------------------------------------------------------
# Tensor layout (names, shapes, kinds) -- mirrors keel's hf_tensors.cpp LayoutBuilder
# --------------------------------------------------------------------------------------------
# kind: "embedding" | "linear" ([out, in]) | "conv1d" ([in, out], GPT-2) | "norm_weight" |
#       "norm_offset_weight" (w of x_hat * (1 + w)) | "norm_bias" | "bias" | "router" | "buffer" |
#       "sink" (attention sinks [heads]) | "expert_weight" (gpt-oss fused [E, in, out]) |
#       "expert_bias" (gpt-oss fused [E, out])

def tensor_layout(s):
    out = []

    def add(name, shape, kind):
        out.append((name, tuple(shape), kind))

    def norm(prefix, dim):
        # Gemma stores w of x_hat * (1 + w): its gains start at zero.
        add(prefix + ".weight", [dim], "norm_offset_weight" if s.get("norm_offset") else "norm_weight")
        if s["norm"] == "layernorm":
            add(prefix + ".bias", [dim], "norm_bias")

    def linear(prefix, o, i, bias):
        add(prefix + ".weight", [o, i], "linear")
        if bias:
            add(prefix + ".bias", [o], "bias")

    H, V = s["hidden"], s["vocab"]
    if s["family"] == "gpt2":
        W = s["inter"]
        add("transformer.wte.weight", [V, H], "embedding")
        add("transformer.wpe.weight", [s["positions"], H], "embedding")
        for l in range(s["layers"]):
            p = f"transformer.h.{l}"
            norm(p + ".ln_1", H)
            add(p + ".attn.c_attn.weight", [H, 3 * H], "conv1d")
            add(p + ".attn.c_attn.bias", [3 * H], "bias")
            add(p + ".attn.c_proj.weight", [H, H], "conv1d")
            add(p + ".attn.c_proj.bias", [H], "bias")
            norm(p + ".ln_2", H)
            add(p + ".mlp.c_fc.weight", [H, W], "conv1d")
            add(p + ".mlp.c_fc.bias", [W], "bias")
            add(p + ".mlp.c_proj.weight", [W, H], "conv1d")
            add(p + ".mlp.c_proj.bias", [H], "bias")
        norm("transformer.ln_f", H)
        return out

    nh, nkv, hd, I = s["heads"], s["kv_heads"], s["head_dim"], s["inter"]

    def attention(p):
        if "mla" in s:  # DeepseekV3Attention.__init__, in module order
            m = s["mla"]
            qk = m["nope"] + m["rope"]
            if m["q_lora_rank"]:
                linear(p + ".q_a_proj", m["q_lora_rank"], H, s["qkv_bias"])
                add(p + ".q_a_layernorm.weight", [m["q_lora_rank"]], "norm_weight")
                linear(p + ".q_b_proj", nh * qk, m["q_lora_rank"], False)
            else:
                linear(p + ".q_proj", nh * qk, H, False)
            linear(p + ".kv_a_proj_with_mqa", m["kv_lora_rank"] + m["rope"], H, s["qkv_bias"])
            add(p + ".kv_a_layernorm.weight", [m["kv_lora_rank"]], "norm_weight")
            linear(p + ".kv_b_proj", nh * (m["nope"] + m["v"]), m["kv_lora_rank"], False)
            linear(p + ".o_proj", H, nh * m["v"], s["o_bias"])
            return
        # Qwen3NextAttention: q_proj (and its bias) 2 * heads * head_dim wide, per head [query | gate].
        linear(p + ".q_proj", nh * hd * (2 if s.get("attn_gate") else 1), H, s["qkv_bias"])
        linear(p + ".k_proj", nkv * hd, H, s["qkv_bias"])
        linear(p + ".v_proj", nkv * hd, H, s["qkv_bias"])
        linear(p + ".o_proj", H, nh * hd, s["o_bias"])
        if s["qk_norm"]:  # RMSNorm over head_dim (Qwen3RMSNorm) or the full width (Olmo2RMSNorm), weight only
            # rmsnorm_1p: w of x_hat * (1 + w), drawn near 0 and decayed. (Gemma 3's q_norm / k_norm
            # keep the "norm_weight" draw 1 + 0.1 N(0,1) that its fixture was written with.)
            kind = "norm_offset_weight" if s["norm"] == "rmsnorm_1p" else "norm_weight"
            add(p + ".q_norm.weight", [nh * hd if s.get("qk_full") else hd], kind)
            add(p + ".k_norm.weight", [nkv * hd if s.get("qk_full") else hd], kind)
        if s.get("attn_sinks"):  # GptOssAttention.sinks = nn.Parameter(torch.empty(num_attention_heads))
            add(p + ".sinks", [nh], "sink")

    def dense_mlp(p):
        linear(p + ".mlp.gate_proj", I, H, s["mlp_bias"])
        linear(p + ".mlp.up_proj", I, H, s["mlp_bias"])
        linear(p + ".mlp.down_proj", H, I, s["mlp_bias"])

    def mlp(p):
        layer = int(p.rsplit(".", 1)[1])
        if layer not in s.get("moe_layers", []):
            return dense_mlp(p)
        if s["router"] == "gpt_oss":
            # GptOssTopKRouter (weight [E, H], bias [E]) and GptOssExperts' fused tensors as stored in
            # the (dequantized) checkpoint: gate_up_proj [E, H, 2I] (x @ W: [in, out], gate columns
            # 0, 2, 4, ..., up columns 1, 3, 5, ...), gate_up_proj_bias [E, 2I], down_proj [E, I, H],
            # down_proj_bias [E, H].
            m, E, W = p + ".mlp", s["experts"], s["moe_inter"]
            add(m + ".router.weight", [E, H], "router")
            add(m + ".router.bias", [E], "bias")
            add(m + ".experts.gate_up_proj", [E, H, 2 * W], "expert_weight")
            add(m + ".experts.gate_up_proj_bias", [E, 2 * W], "expert_bias")
            add(m + ".experts.down_proj", [E, W, H], "expert_weight")
            add(m + ".experts.down_proj_bias", [E, H], "expert_bias")
            return
        m, (g, u, d), W = f"{p}.{s['moe_prefix']}", s["expert_names"], s["moe_inter"]
        add(m + ".gate.weight", [s["experts"], H], "router")
        if s["score_bias"]:
            add(m + ".gate.e_score_correction_bias", [s["experts"]], "buffer")
        for e in range(s["experts"]):
            linear(f"{m}.experts.{e}.{g}", W, H, False)
            linear(f"{m}.experts.{e}.{u}", W, H, False)
            linear(f"{m}.experts.{e}.{d}", H, W, False)
        if s["shared_inter"]:
            linear(m + ".shared_experts.gate_proj", s["shared_inter"], H, False)
            linear(m + ".shared_experts.up_proj", s["shared_inter"], H, False)
            linear(m + ".shared_experts.down_proj", H, s["shared_inter"], False)

    add("model.embed_tokens.weight", [V, H], "embedding")
    for l in range(s["layers"]):
        p = f"model.layers.{l}"
        if s["placement"] == "pre":
            norm(p + ".input_layernorm", H)
            attention(p + ".self_attn")
            norm(p + ".post_attention_layernorm", H)
            mlp(p)
        elif s["placement"] == "post":
            attention(p + ".self_attn")
            norm(p + ".post_attention_layernorm", H)
            mlp(p)
            norm(p + ".post_feedforward_layernorm", H)
        elif s["placement"] == "sandwich":
            norm(p + ".input_layernorm", H)
            attention(p + ".self_attn")
            norm(p + ".post_attention_layernorm", H)
            norm(p + ".pre_feedforward_layernorm", H)
            mlp(p)
            norm(p + ".post_feedforward_layernorm", H)
        elif s["placement"] == "post_sublayer":
            attention(p + ".self_attn")
            norm(p + ".post_attention_layernorm", H)
            mlp(p)
            norm(p + ".post_feedforward_layernorm", H)
        else:
            raise ValueError(s["placement"])
    if s["placement"] != "post":
        norm("model.norm", H)
    if not s["tie"]:
        add("lm_head.weight", [V, H], "linear")
    return out


def decays(name, shape, kind, s=None):
    """AdamW weight-decay rule used by the fixtures: 2-D weights that are not embeddings
    (the MoE router's gate.weight included); gpt-oss's fused 3-D expert matrices too, never their
    2-D [E, out] biases; and, for keel's "rmsnorm_1p" (Qwen3-Next's zero-centred,
    weight-decayed norm), the norm weights w of x_hat * (1 + w). Sinks and other 1-D tensors don't."""
    if kind == "expert_weight":
        return True
    if kind == "expert_bias":
        return False
    if kind == "norm_offset_weight" and s is not None and s.get("norm") == "rmsnorm_1p":
        return True
    return len(shape) == 2 and kind != "embedding"


def trainable(kind):
    """Buffers (e_score_correction_bias, a registered buffer in HF) get no gradient and no
    optimizer update."""
    return kind != "buffer"


# --------------------------------------------------------------------------------------------
# Blocks
# --------------------------------------------------------------------------------------------

def rms_norm(x, weight, eps):
    """LlamaRMSNorm.forward (modeling_llama.py; identical in Mistral/Qwen2/Qwen3RMSNorm):
    variance = x.pow(2).mean(-1, keepdim=True); x * rsqrt(variance + eps); weight * x.
    Plain x_hat * w form (not Gemma's 1 + w)."""
    variance = x.pow(2).mean(-1, keepdim=True)
    return weight * (x * torch.rsqrt(variance + eps))


def layer_norm(x, weight, bias, eps):
    """torch.nn.LayerNorm (GPT2 ln_1/ln_2/ln_f; keel "norm": "layernorm"): biased variance."""
    return F.layer_norm(x, (x.shape[-1],), weight, bias, eps)


def apply_norm(s, p, prefix, x):
    if s["norm"] == "layernorm":
        return layer_norm(x, p[prefix + ".weight"], p[prefix + ".bias"], s["eps"])
    if s.get("norm_offset"):  # Gemma2RMSNorm: output * (1.0 + self.weight)
        return rms_norm(x, 1.0 + p[prefix + ".weight"], s["eps"])
    return rms_norm(x, p[prefix + ".weight"], s["eps"])


def activation(name, x):
    """transformers activations.py ACT2FN."""
    if name in ("silu", "swish"):
        return F.silu(x)                       # SiLUActivation: x * sigmoid(x)
    if name == "gelu":
        return F.gelu(x)                       # GELUActivation: exact erf GELU
    if name in ("gelu_new", "gelu_pytorch_tanh"):
        # NewGELUActivation: 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))
        # (PytorchGELUTanh = F.gelu(approximate="tanh") is the same function)
        return 0.5 * x * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * torch.pow(x, 3.0))))
    if name == "relu":
        return F.relu(x)
    raise ValueError(f"unknown activation {name}")


def yarn_get_mscale(scale=1, mscale=1):
    """modeling_deepseek_v3.yarn_get_mscale (= get_mscale in _compute_yarn_parameters)."""
    if scale <= 1:
        return 1.0
    return 0.1 * mscale * math.log(scale) + 1.0


def rope_attention_factor(s):
    """_compute_yarn_parameters' attention_factor (multiplies cos and sin); 1 for other types."""
    sc = s["rope"]["scaling"]
    if sc is None or sc.get("rope_type", sc.get("type")) != "yarn":
        return 1.0
    factor = sc["factor"]
    if sc.get("attention_factor") is not None:
        return sc["attention_factor"]
    mscale, mscale_all_dim = sc.get("mscale"), sc.get("mscale_all_dim")
    if mscale and mscale_all_dim:
        return float(yarn_get_mscale(factor, mscale) / yarn_get_mscale(factor, mscale_all_dim))
    return yarn_get_mscale(factor)


def rope_inv_freq(s, dtype=torch.float64):
    """modeling_rope_utils.py: _compute_default_rope_parameters and, for rope_type "llama3",
    _compute_llama3_parameters, for "yarn" _compute_yarn_parameters. Computed in float64 here
    (HF computes inv_freq in fp32; difference ~1e-7 relative). The rotated width is head_dim, or
    qk_rope_head_dim for MLA (DeepseekV3Config sets head_dim = qk_rope_head_dim for RoPE)."""
    dim = s.get("rope_dim") or s.get("rotary_dim") or s["head_dim"]  # rotary_dim: partial (Glm4Moe)
    base = s["rope"]["theta"]
    inv_freq = 1.0 / (base ** (torch.arange(0, dim, 2, dtype=torch.int64).to(dtype) / dim))
    sc = s["rope"]["scaling"]
    rope_type = (sc or {}).get("rope_type", (sc or {}).get("type", "default"))
    if sc is None or rope_type == "default":
        return inv_freq
    if rope_type == "linear":  # _compute_linear_scaling_rope_parameters: inv_freq / factor
        return inv_freq / sc["factor"]
    if rope_type == "yarn":
        factor = sc["factor"]
        original = sc.get("original_max_position_embeddings") or s["rope"]["max_positions"]
        beta_fast = sc.get("beta_fast") or 32
        beta_slow = sc.get("beta_slow") or 1

        def find_correction_dim(num_rotations):
            return (dim * math.log(original / (num_rotations * 2 * math.pi))) / (2 * math.log(base))

        low, high = find_correction_dim(beta_fast), find_correction_dim(beta_slow)
        if sc.get("truncate", True):
            low, high = math.floor(low), math.ceil(high)
        low, high = max(low, 0), min(high, dim - 1)
        if low == high:
            high += 0.001
        ramp = torch.clamp((torch.arange(dim // 2, dtype=dtype) - low) / (high - low), 0, 1)
        extrapolation_factor = 1 - ramp
        return (inv_freq / factor) * (1 - extrapolation_factor) + inv_freq * extrapolation_factor
    if rope_type != "llama3":
        raise ValueError(f"rope_type {rope_type} not implemented")
    factor = sc["factor"]
    low_freq_factor = sc["low_freq_factor"]
    high_freq_factor = sc["high_freq_factor"]
    old_context_len = sc["original_max_position_embeddings"]
    low_freq_wavelen = old_context_len / low_freq_factor
    high_freq_wavelen = old_context_len / high_freq_factor
    wavelen = 2 * math.pi / inv_freq
    # wavelen < high_freq_wavelen: unchanged; wavelen > low_freq_wavelen: divide by factor
    inv_freq_llama = torch.where(wavelen > low_freq_wavelen, inv_freq / factor, inv_freq)
    # otherwise interpolate with a smooth factor
    smooth_factor = (old_context_len / wavelen - low_freq_factor) / (high_freq_factor - low_freq_factor)
    smoothed_inv_freq = (1 - smooth_factor) * inv_freq_llama / factor + smooth_factor * inv_freq_llama
    is_medium_freq = ~(wavelen < high_freq_wavelen) * ~(wavelen > low_freq_wavelen)
    return torch.where(is_medium_freq, smoothed_inv_freq, inv_freq_llama)


def rope_cos_sin(s, T, dtype=torch.float64):
    """LlamaRotaryEmbedding.forward: freqs = position_ids (0..T-1) x inv_freq;
    emb = cat(freqs, freqs); cos, sin (times attention_scaling = 1)."""
    inv_freq = rope_inv_freq(s, dtype)
    pos = torch.arange(T, dtype=dtype)
    freqs = pos[:, None] * inv_freq[None, :]
    emb = torch.cat((freqs, freqs), dim=-1)
    af = rope_attention_factor(s)
    if af != 1.0:  # YaRN (DeepseekV3RotaryEmbedding: cos * attention_scaling, sin * attention_scaling)
        return emb.cos() * af, emb.sin() * af
    return emb.cos(), emb.sin()


def rotate_half(x):
    """modeling_llama.rotate_half: halves layout (not interleaved pairs)."""
    x1 = x[..., : x.shape[-1] // 2]
    x2 = x[..., x.shape[-1] // 2:]
    return torch.cat((-x2, x1), dim=-1)


def apply_rotary_pos_emb(q, k, cos, sin):
    """modeling_llama.apply_rotary_pos_emb, q/k [B, heads, T, hd], cos/sin [T, rd]. With rd < hd
    (modeling_glm4_moe.apply_rotary_pos_emb) only the first rd dims rotate; the rest pass."""
    rd = cos.shape[-1]
    if rd == q.shape[-1]:
        return (q * cos) + (rotate_half(q) * sin), (k * cos) + (rotate_half(k) * sin)
    q_rot, q_pass = q[..., :rd], q[..., rd:]
    k_rot, k_pass = k[..., :rd], k[..., rd:]
    q_embed = torch.cat([(q_rot * cos) + (rotate_half(q_rot) * sin), q_pass], dim=-1)
    k_embed = torch.cat([(k_rot * cos) + (rotate_half(k_rot) * sin), k_pass], dim=-1)
    return q_embed, k_embed


def repeat_kv(x, n_rep):
    """modeling_llama.repeat_kv: [B, kv, T, hd] -> [B, kv*n_rep, T, hd]; query head h reads
    kv head h // n_rep."""
    if n_rep == 1:
        return x
    B, kv, T, hd = x.shape
    return x[:, :, None, :, :].expand(B, kv, n_rep, T, hd).reshape(B, kv * n_rep, T, hd)


def causal_attention_core(q, k, v, scaling, softcap, stats, window=0, sinks=None):
    """modeling_llama.eager_attention_forward (+ Gemma2's soft-capping, modeling_gemma2.py):
    w = q k^T * scaling; [softcap: w = c * tanh(w / c)]; + causal mask; softmax; w v.
    window > 0: the sliding-window mask too, query i sees key j iff 0 <= i - j < window
    (masking_utils.sliding_window_overlay). stats: list to which the per-head max of the scaled,
    pre-cap logit over batch and unmasked positions is appended (real q.k logits only, never the
    sink). sinks [heads]: modeling_gpt_oss.eager_attention_forward -- the head's sink logit is
    concatenated as an extra last column of every (masked) row, the row max (sink included) is
    subtracted, softmax over keys + sink, the sink column dropped: probabilities over the keys sum
    to 1 - p_sink; the sink adds nothing to the output."""
    T = q.shape[-2]
    w = torch.matmul(q, k.transpose(2, 3)) * scaling
    mask = torch.ones(T, T, dtype=torch.bool).tril()
    if window:
        mask = mask & ~torch.ones(T, T, dtype=torch.bool).tril(-window)
    if stats is not None:
        with torch.no_grad():
            stats.append(w.masked_fill(~mask, float("-inf")).amax(dim=(0, 2, 3)))
    if softcap:
        w = softcap * torch.tanh(w / softcap)
    w = w.masked_fill(~mask, float("-inf"))
    if sinks is not None:
        B, nh = w.shape[0], w.shape[1]
        col = sinks.reshape(1, -1, 1, 1).expand(B, nh, T, 1)
        combined = torch.cat([w, col], dim=-1)
        combined = combined - combined.max(dim=-1, keepdim=True).values
        w = torch.softmax(combined, dim=-1)[..., :-1]
        return torch.matmul(w, v)
    w = torch.softmax(w, dim=-1)
    return torch.matmul(w, v)


def decoder_attention(s, p, prefix, x, cos, sin, stats):
    """LlamaAttention.forward (MistralAttention / Qwen2Attention identical; Qwen3Attention adds
    q_norm/k_norm over head_dim after the projection + reshape and before RoPE)."""
    B, T, _ = x.shape
    nh, nkv, hd = s["heads"], s["kv_heads"], s["head_dim"]

    def proj(name, t):
        return F.linear(t, p[f"{prefix}.{name}.weight"], p.get(f"{prefix}.{name}.bias"))

    q, k = proj("q_proj", x), proj("k_proj", x)
    gate = None
    if s.get("attn_gate"):
        # Qwen3NextAttention.forward: q_proj(x).view(B, T, heads, 2 * head_dim), torch.chunk(2, dim=-1)
        # -> query (first head_dim of each head's block), gate (second); gate.reshape(B, T, heads * hd).
        q, gate = torch.chunk(q.view(B, T, nh, 2 * hd), 2, dim=-1)
        gate = gate.reshape(B, T, nh * hd)
        q = q.reshape(B, T, nh * hd)
    if s["qk_norm"] and s.get("qk_full"):  # Olmo2Attention: normalize the whole projection, then split heads
        q = rms_norm(q, p[prefix + ".q_norm.weight"], s["eps"])
        k = rms_norm(k, p[prefix + ".k_norm.weight"], s["eps"])
    q = q.view(B, T, nh, hd)
    k = k.view(B, T, nkv, hd)
    v = proj("v_proj", x).view(B, T, nkv, hd)
    if s["qk_norm"] and not s.get("qk_full"):  # Qwen3RMSNorm(head_dim) / Gemma3RMSNorm (1 + w), eps = rms_norm_eps
        off = 1.0 if s.get("norm_offset") else 0.0
        q = rms_norm(q, off + p[prefix + ".q_norm.weight"], s["eps"])
        k = rms_norm(k, off + p[prefix + ".k_norm.weight"], s["eps"])
    q, k, v = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)
    q, k = apply_rotary_pos_emb(q, k, cos, sin)
    n_rep = nh // nkv
    k, v = repeat_kv(k, n_rep), repeat_kv(v, n_rep)
    layer = int(prefix.split(".")[2])
    window = s.get("sliding_window", 0) if layer in s.get("sliding_layers", []) else 0
    sinks = p[prefix + ".sinks"] if s.get("attn_sinks") else None
    o = causal_attention_core(q, k, v, s.get("query_scale", hd ** -0.5), s["attn_softcap"], stats, window, sinks)
    o = o.transpose(1, 2).reshape(B, T, nh * hd)
    if gate is not None:  # Qwen3NextAttention: attn_output * torch.sigmoid(gate), then o_proj
        o = o * torch.sigmoid(gate)
    return proj("o_proj", o)


def apply_rotary_pos_emb_interleave(q, k, cos, sin):
    """modeling_deepseek_v3.apply_rotary_pos_emb_interleave: each vector's (2i, 2i+1) pairs are
    first permuted to halves layout (evens, then odds), then rotated half. The results stay in
    the permuted layout; q and k are permuted alike, so q.k is that of adjacent-pair rotation."""
    b, h, t, d = q.shape
    q = q.view(b, h, t, d // 2, 2).transpose(4, 3).reshape(b, h, t, d)
    b, h, t, d = k.shape
    k = k.view(b, h, t, d // 2, 2).transpose(4, 3).reshape(b, h, t, d)
    return (q * cos) + (rotate_half(q) * sin), (k * cos) + (rotate_half(k) * sin)


def apply_rotary_emb_complex(q, k, cos, sin):
    """modeling_deepseek_v2.apply_rotary_emb: view_as_complex over (2i, 2i+1) pairs, times
    freqs_cis = polar(1, pos * inv_freq_i) * attention_scaling, view_as_real: each pair rotated in
    place (output stays in the interleaved layout). Written with real arithmetic:
    (a + ib)(c + is) = (ac - bs) + i(as + bc). cos/sin [T, d] (halves repeated; the first d/2 used)."""
    d = q.shape[-1]
    c, sn = cos[..., : d // 2], sin[..., : d // 2]

    def rot(x):
        a, b = x[..., 0::2], x[..., 1::2]
        return torch.stack((a * c - b * sn, a * sn + b * c), dim=-1).flatten(-2)
    return rot(q), rot(k)


def mla_softmax_scale(s):
    """DeepseekV3Attention.__init__: qk_head_dim ** -0.5, times mscale**2 when rope_scaling sets
    mscale_all_dim. DeepseekV2Attention.__init__: qk_head_dim ** -0.5 only (HF dropped the mscale
    factor that DeepSeek's own modeling_deepseek.py applies)."""
    m = s["mla"]
    scaling = (m["nope"] + m["rope"]) ** (-0.5)
    sc = s["rope"]["scaling"]
    if sc is not None and m.get("mscale_scale", True):
        mscale_all_dim = sc.get("mscale_all_dim", 0)
        if mscale_all_dim:
            mscale = yarn_get_mscale(sc["factor"], mscale_all_dim)
            scaling = scaling * mscale * mscale
    return scaling


def mla_attention(s, p, prefix, x, cos, sin, stats):
    """DeepseekV3Attention.forward (modeling_deepseek_v3.py), eager path; DeepseekV2Attention.forward
    (modeling_deepseek_v2.py) is the same data flow with apply_rotary_emb (complex pairs) and the
    plain scale. Both build q_a_layernorm / kv_a_layernorm without the config eps (default 1e-6)."""
    B, T, _ = x.shape
    m = s["mla"]
    nh, nope, rope, vd = s["heads"], m["nope"], m["rope"], m["v"]

    def proj(name, t):
        return F.linear(t, p[f"{prefix}.{name}.weight"], p.get(f"{prefix}.{name}.bias"))

    if m["q_lora_rank"]:
        # DeepseekV3Attention builds q_a_layernorm and kv_a_layernorm as DeepseekV3RMSNorm(rank):
        # the class default eps 1e-6, not config.rms_norm_eps.
        q = proj("q_b_proj", rms_norm(proj("q_a_proj", x), p[prefix + ".q_a_layernorm.weight"], 1e-6))
    else:
        q = proj("q_proj", x)
    q = q.view(B, T, nh, nope + rope).transpose(1, 2)
    q_pass, q_rot = torch.split(q, [nope, rope], dim=-1)
    compressed = proj("kv_a_proj_with_mqa", x)
    k_pass, k_rot = torch.split(compressed, [m["kv_lora_rank"], rope], dim=-1)
    k_pass = proj("kv_b_proj", rms_norm(k_pass, p[prefix + ".kv_a_layernorm.weight"], 1e-6))
    k_pass = k_pass.view(B, T, nh, nope + vd).transpose(1, 2)
    k_pass, v = torch.split(k_pass, [nope, vd], dim=-1)
    k_rot = k_rot.view(B, 1, T, rope)
    if m.get("complex_rope"):
        q_rot, k_rot = apply_rotary_emb_complex(q_rot, k_rot, cos, sin)
    elif m["interleave"]:
        q_rot, k_rot = apply_rotary_pos_emb_interleave(q_rot, k_rot, cos, sin)
    else:
        q_rot, k_rot = apply_rotary_pos_emb(q_rot, k_rot, cos, sin)
    k_rot = k_rot.expand(*k_pass.shape[:-1], -1)
    q = torch.cat((q_pass, q_rot), dim=-1)
    k = torch.cat((k_pass, k_rot), dim=-1)
    o = causal_attention_core(q, k, v, mla_softmax_scale(s), s["attn_softcap"], stats)
    o = o.transpose(1, 2).reshape(B, T, nh * vd)
    return proj("o_proj", o)


def gated_mlp(s, p, prefix, x):
    """LlamaMLP.forward: down_proj(act_fn(gate_proj(x)) * up_proj(x)) (SwiGLU/GeGLU/ReGLU)."""
    def proj(name, t):
        return F.linear(t, p[f"{prefix}.{name}.weight"], p.get(f"{prefix}.{name}.bias"))
    return proj("down_proj", activation(s["act"], proj("gate_proj", x)) * proj("up_proj", x))


# Smallest selection margin seen by moe_block since the last reset: fixtures must not sit near a
# routing tie (keel computes the router in fp32).
ROUTING_MARGIN = [float("inf")]


def _kth_gap(v, k):
    """Per row: (k-th largest) - ((k+1)-th largest)."""
    top = torch.topk(v, k + 1, dim=-1)[0]
    return (top[:, k - 1] - top[:, k]).min().item()


def keep_top_groups(choice, group_scores, tg):
    """Group-limited routing (DeepseekV3TopkRouter / DeepseekV2Moe): the experts of the tg
    best-scoring groups keep their choice values, the others' are masked_fill(0.0)."""
    n, ng = group_scores.shape
    E = choice.shape[-1]
    if tg < ng:
        ROUTING_MARGIN[0] = min(ROUTING_MARGIN[0], _kth_gap(group_scores, tg))
    group_idx = torch.topk(group_scores, k=tg, dim=-1, sorted=False)[1]
    group_mask = torch.zeros_like(group_scores)
    group_mask.scatter_(1, group_idx, 1)
    score_mask = group_mask.unsqueeze(-1).expand(-1, ng, E // ng).reshape(-1, E)
    return choice.masked_fill(~score_mask.bool(), 0.0)


# Clamp bookkeeping of gpt_oss_moe (counts of elements beyond the limit, and of gates below -limit
# that the one-sided gate clamp leaves alone), so that the fixture can assert that both clamps bind.
CLAMP_STATS = {"gate_hi": 0, "gate_lo": 0, "up_hi": 0, "up_lo": 0}


def gpt_oss_moe(s, p, prefix, x):
    """GptOssMLP.forward: GptOssTopKRouter (router_logits = x W^T + b; top-k of the logits;
    softmax over those k values) and GptOssExperts.forward's per-expert loop: gate_up = x @
    gate_up_proj[e] + gate_up_proj_bias[e]; gate, up = gate_up[..., ::2], gate_up[..., 1::2];
    gate = gate.clamp(max=limit) (no lower bound); up = up.clamp(-limit, limit);
    glu = gate * sigmoid(alpha * gate); out = ((up + 1) * glu) @ down_proj[e] + down_proj_bias[e];
    weighted by the token's routing weight and index_add-ed. torch.clamp's gradient is zero where
    it clamps."""
    B, T, H = x.shape
    h = x.reshape(-1, H)
    E, k = s["experts"], s["top_k"]
    limit, alpha = s["swiglu_limit"], s["swiglu_alpha"]
    logits = F.linear(h, p[prefix + ".router.weight"], p[prefix + ".router.bias"])
    top, idx = torch.topk(logits, k, dim=-1)
    ROUTING_MARGIN[0] = min(ROUTING_MARGIN[0], _kth_gap(logits.detach(), k))
    weights = torch.softmax(top, dim=-1)
    gu_w, gu_b = p[prefix + ".experts.gate_up_proj"], p[prefix + ".experts.gate_up_proj_bias"]
    dn_w, dn_b = p[prefix + ".experts.down_proj"], p[prefix + ".experts.down_proj_bias"]
    out = torch.zeros_like(h)
    for e in range(E):
        token_idx, slot = torch.where(idx == e)
        if token_idx.numel() == 0:
            continue
        gate_up = h[token_idx] @ gu_w[e] + gu_b[e]
        gate, up = gate_up[..., ::2], gate_up[..., 1::2]
        with torch.no_grad():
            CLAMP_STATS["gate_hi"] += int((gate > limit).sum())
            CLAMP_STATS["gate_lo"] += int((gate < -limit).sum())
            CLAMP_STATS["up_hi"] += int((up > limit).sum())
            CLAMP_STATS["up_lo"] += int((up < -limit).sum())
        gate = gate.clamp(max=limit)
        up = up.clamp(min=-limit, max=limit)
        glu = gate * torch.sigmoid(gate * alpha)
        ye = ((up + 1) * glu) @ dn_w[e] + dn_b[e]
        out = out.index_add(0, token_idx, ye * weights[token_idx, slot].unsqueeze(-1))
    return out.view(B, T, H)


def deepseek_v2_route(s, logits):
    """DeepseekV2Moe.route_tokens_to_experts: probabilities = softmax(logits); "greedy": top-k of
    them; "group_limited_greedy": group score = max over the group's experts, the topk_group best
    groups kept, the others' probabilities masked_fill(0.0), top-k of the rest. Weights = chosen
    probabilities * routed_scaling_factor. norm_topk_prob (HF ignores it; every released V2 config
    has it false): DeepSeek's MoEGate divides by (sum + 1e-20) instead of scaling, used here."""
    E, k = s["experts"], s["top_k"]
    probs = torch.softmax(logits, dim=-1)
    with torch.no_grad():
        choice = probs
        if s["topk_method"] == "group_limited_greedy":
            ng = s["n_group"]
            choice = keep_top_groups(probs, probs.view(-1, ng, E // ng).max(dim=-1).values, s["topk_group"])
        ROUTING_MARGIN[0] = min(ROUTING_MARGIN[0], _kth_gap(choice, k))
        idx = torch.topk(choice, k=k, dim=-1, sorted=False)[1]
    weights = probs.gather(1, idx)
    if s["norm_topk"] and k > 1:
        weights = weights / (weights.sum(dim=-1, keepdim=True) + 1e-20)
    else:
        weights = weights * s["scaling"]
    return weights, idx


def moe_block(s, p, prefix, x):
    """MixtralSparseMoeBlock.forward / Qwen3MoeSparseMoeBlock.forward (softmax over experts, top-k,
    renormalized when norm_topk_prob / always for Mixtral) and Glm4MoeMoE / DeepseekV3MoE.forward
    with DeepseekV3TopkRouter (sigmoid scores; e_score_correction_bias added for selection only;
    group score = sum of the top-2 biased scores per group; topk_group groups kept, the others
    masked_fill(0.0); top-k of the rest; weights = scores gathered, / (sum + 1e-20) when
    norm_topk_prob, * routed_scaling_factor; plus shared_experts(x))."""
    if s["router"] == "gpt_oss":
        return gpt_oss_moe(s, p, prefix, x)
    B, T, H = x.shape
    h = x.reshape(-1, H)
    E, k = s["experts"], s["top_k"]
    logits = F.linear(h, p[prefix + ".gate.weight"])
    if s["router"] == "deepseek_v2":
        weights, idx = deepseek_v2_route(s, logits)
    elif s["router"] == "softmax":
        probs = torch.softmax(logits, dim=-1)
        weights, idx = torch.topk(probs, k, dim=-1)
        ROUTING_MARGIN[0] = min(ROUTING_MARGIN[0], _kth_gap(probs.detach(), k))
        if s["norm_topk"]:
            weights = weights / weights.sum(dim=-1, keepdim=True)
    else:
        scores = logits.sigmoid()
        with torch.no_grad():
            choice = scores + p[prefix + ".gate.e_score_correction_bias"].unsqueeze(0)
            ng = s["n_group"]
            choice = keep_top_groups(choice, choice.view(-1, ng, E // ng).topk(2, dim=-1)[0].sum(dim=-1),
                                     s["topk_group"])
            ROUTING_MARGIN[0] = min(ROUTING_MARGIN[0], _kth_gap(choice, k))
            idx = torch.topk(choice, k=k, dim=-1, sorted=False)[1]
        weights = scores.gather(1, idx)
        if s["norm_topk"]:
            weights = weights / (weights.sum(dim=-1, keepdim=True) + 1e-20)
        weights = weights * s["scaling"]
    g, u, d = s["expert_names"]
    out = torch.zeros_like(h)
    for e in range(E):
        token_idx, slot = torch.where(idx == e)
        if token_idx.numel() == 0:
            continue
        xe = h[token_idx]
        pe = f"{prefix}.experts.{e}."
        ye = F.linear(activation(s["act"], F.linear(xe, p[pe + g + ".weight"])) * F.linear(xe, p[pe + u + ".weight"]),
                      p[pe + d + ".weight"])
        # .to(out.dtype) as HF's Mixtral does: a no-op in float64, needed under bf16 autocast.
        out = out.index_add(0, token_idx, (ye * weights[token_idx, slot].unsqueeze(-1)).to(out.dtype))
    out = out.view(B, T, H)
    if s["shared_inter"]:
        out = out + gated_mlp(s, p, prefix + ".shared_experts", x)
    return out


def decoder_layer(s, p, l, x, cos, sin, stats):
    """LlamaDecoderLayer.forward for "pre"; keel's "post" and Gemma2DecoderLayer's "sandwich"."""
    pre = f"model.layers.{l}"
    attend = mla_attention if "mla" in s else decoder_attention
    attn = lambda t: attend(s, p, pre + ".self_attn", t, cos, sin, stats)  # noqa: E731
    if l in s.get("moe_layers", []):
        mlp = lambda t: moe_block(s, p, f"{pre}.{s['moe_prefix']}", t)  # noqa: E731
    else:
        mlp = lambda t: gated_mlp(s, p, pre + ".mlp", t)  # noqa: E731
    norm = lambda name, t: apply_norm(s, p, f"{pre}.{name}", t)  # noqa: E731
    if s["placement"] == "pre":
        x = x + attn(norm("input_layernorm", x))
        x = x + mlp(norm("post_attention_layernorm", x))
    elif s["placement"] == "post":
        x = norm("post_attention_layernorm", x + attn(x))
        x = norm("post_feedforward_layernorm", x + mlp(x))
    elif s["placement"] == "post_sublayer":  # Olmo2DecoderLayer.forward
        x = x + norm("post_attention_layernorm", attn(x))
        x = x + norm("post_feedforward_layernorm", mlp(x))
    else:  # sandwich (Gemma2DecoderLayer, but with the plain x_hat * w norm)
        x = x + norm("post_attention_layernorm", attn(norm("input_layernorm", x)))
        x = x + norm("post_feedforward_layernorm", mlp(norm("pre_feedforward_layernorm", x)))
    return x


def decoder_forward(s, p, tokens, collect_stats=True):
    """LlamaModel.forward + LlamaForCausalLM.forward. Returns (logits, max_logit[layers, heads]).
    logits are after the final soft-cap when configured (Gemma2ForCausalLM)."""
    T = tokens.shape[1]
    emb = p["model.embed_tokens.weight"]
    x = F.embedding(tokens, emb)
    if s.get("embed_scale", 1.0) != 1.0:
        x = x * s["embed_scale"]
    cos, sin = rope_cos_sin(s, T, emb.dtype)
    if "local_rope" in s:  # Gemma3TextModel.rotary_emb_local for the sliding layers
        cos_l, sin_l = rope_cos_sin(dict(s, rope=s["local_rope"]), T, emb.dtype)
    stats = [] if collect_stats else None
    for l in range(s["layers"]):
        local = "local_rope" in s and l in s["sliding_layers"]
        x = decoder_layer(s, p, l, x, cos_l if local else cos, sin_l if local else sin, stats)
    if s["placement"] != "post":
        x = apply_norm(s, p, "model.norm", x)
    head = emb if s["tie"] else p["lm_head.weight"]
    logits = F.linear(x, head)
    if s["final_softcap"]:
        c = s["final_softcap"]
        logits = c * torch.tanh(logits / c)
    return logits, (torch.stack(stats) if collect_stats else None)


def gpt2_attention(s, p, prefix, x, layer, stats):
    """GPT2Attention.forward + _attn (modeling_gpt2.py): c_attn (Conv1D, x @ W + b) split into
    q, k, v of width n_embd; heads split as view(B, T, n_head, hd); weights / sqrt(hd)
    (scale_attn_weights, value.size(-1) ** 0.5); optional / (layer_idx + 1); causal; c_proj."""
    B, T, H = x.shape
    nh, hd = s["heads"], s["head_dim"]
    qkv = x @ p[prefix + ".c_attn.weight"] + p[prefix + ".c_attn.bias"]
    q, k, v = qkv.split(H, dim=2)
    q, k, v = (t.view(B, T, nh, hd).transpose(1, 2) for t in (q, k, v))
    scaling = hd ** -0.5
    if s["scale_attn_by_inverse_layer_idx"]:
        scaling /= float(layer + 1)
    o = causal_attention_core(q, k, v, scaling, s["attn_softcap"], stats)
    o = o.transpose(1, 2).reshape(B, T, H)
    return o @ p[prefix + ".c_proj.weight"] + p[prefix + ".c_proj.bias"]


def gpt2_mlp(s, p, prefix, x):
    """GPT2MLP.forward: c_proj(act(c_fc(x))), Conv1D layout [in, out]."""
    h = activation(s["act"], x @ p[prefix + ".c_fc.weight"] + p[prefix + ".c_fc.bias"])
    return h @ p[prefix + ".c_proj.weight"] + p[prefix + ".c_proj.bias"]


def gpt2_forward(s, p, tokens, collect_stats=True):
    """GPT2Model.forward + GPT2LMHeadModel.forward: wte + wpe(0..T-1), pre-LN blocks
    (GPT2Block), ln_f, lm_head tied to wte."""
    T = tokens.shape[1]
    wte = p["transformer.wte.weight"]
    x = F.embedding(tokens, wte) * s.get("embed_scale", 1.0) + p["transformer.wpe.weight"][:T][None]
    stats = [] if collect_stats else None
    ln = lambda name, t: layer_norm(t, p[name + ".weight"], p[name + ".bias"], s["eps"])  # noqa: E731
    for l in range(s["layers"]):
        pre = f"transformer.h.{l}"
        x = x + gpt2_attention(s, p, pre + ".attn", ln(pre + ".ln_1", x), l, stats)
        x = x + gpt2_mlp(s, p, pre + ".mlp", ln(pre + ".ln_2", x))
    x = ln("transformer.ln_f", x)
    logits = F.linear(x, wte)
    if s["final_softcap"]:
        c = s["final_softcap"]
        logits = c * torch.tanh(logits / c)
    return logits, (torch.stack(stats) if collect_stats else None)


def forward(s, p, tokens, collect_stats=True):
    """collect_stats=False skips the per-head max-logit bookkeeping (benchmarks time the bare model)."""
    if s["family"] == "gpt2":
        return gpt2_forward(s, p, tokens, collect_stats)
    return decoder_forward(s, p, tokens, collect_stats)


def causal_lm_loss(logits, tokens, z_loss=0.0):
    """loss_utils.ForCausalLMLoss: shift by one, mean cross-entropy over the B*(T-1) predicted
    positions (no ignored labels). Plus keel's z-loss: z_loss * mean(logsumexp(logits)^2) over
    the same positions. Returns (loss, ce)."""
    shift = logits[:, :-1, :]
    labels = tokens[:, 1:]
    lse = torch.logsumexp(shift, dim=-1)
    picked = shift.gather(-1, labels.unsqueeze(-1)).squeeze(-1)
    ce = (lse - picked).mean()
    loss = ce + z_loss * (lse * lse).mean() if z_loss else ce
    return loss, ce


def loss_and_stats(s, p, tokens):
    logits, max_logit = forward(s, p, tokens)
    loss, ce = causal_lm_loss(logits, tokens, s["z_loss"])
    return loss, ce, logits, max_logit


# --------------------------------------------------------------------------------------------
# Optimizer: torch.nn.utils.clip_grad_norm_ + torch.optim.AdamW (torch 1.13 _single_tensor_adamw)
# --------------------------------------------------------------------------------------------

def clip_grad_norm(grads, max_norm):
    """clip_grad_norm_: total = ||(||g_i||_2)_i||_2; coef = max_norm / (total + 1e-6);
    grads *= min(coef, 1). Returns total."""
    total = torch.norm(torch.stack([torch.norm(g, 2.0) for g in grads]), 2.0)
    coef = torch.clamp(max_norm / (total + 1e-6), max=1.0)
    for g in grads:
        g.mul_(coef)
    return total


class AdamW:
    """torch.optim.AdamW, single-tensor path: p *= 1 - lr*wd; m = b1 m + (1-b1) g;
    v = b2 v + (1-b2) g^2; p -= lr / (1 - b1^t) * m / (sqrt(v) / sqrt(1 - b2^t) + eps)."""

    def __init__(self, lr, betas, eps, weight_decay):
        self.lr, self.b1, self.b2, self.eps, self.wd = lr, betas[0], betas[1], eps, weight_decay
        self.state = {}

    def step(self, params, grads, decay_flags):
        for name in params:
            p, g = params[name], grads[name]
            st = self.state.setdefault(name, {"t": 0, "m": torch.zeros_like(p), "v": torch.zeros_like(p)})
            st["t"] += 1
            t = st["t"]
            wd = self.wd if decay_flags[name] else 0.0
            p.mul_(1 - self.lr * wd)
            st["m"].mul_(self.b1).add_(g, alpha=1 - self.b1)
            st["v"].mul_(self.b2).addcmul_(g, g, value=1 - self.b2)
            bc1 = 1 - self.b1 ** t
            bc2 = 1 - self.b2 ** t
            denom = (st["v"].sqrt() / math.sqrt(bc2)).add_(self.eps)
            p.addcdiv_(st["m"], denom, value=-self.lr / bc1)
