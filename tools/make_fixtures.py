#!/usr/bin/python3
"""Writes keel's level-2 reference fixtures: tiny models of each family computed in
float64 with tools/reference_model.py (HF transformers semantics), stored as F32.

    /usr/bin/python3 tools/make_fixtures.py [--out tests/fixtures] [--only NAME ...]

Deterministic: the same torch version writes byte-identical files. See tests/fixtures/README.md
for the format. Self-checks run before anything is written (finite differences against
autograd, llama3 RoPE against a hand computation, the optimizer against torch.optim.AdamW and
clip_grad_norm_, the safetensors reader against the writer, and, when a keel binary is found,
parameter counts against `keel inspect --json`).
"""

import argparse
import copy
import json
import math
import os
import subprocess
import sys
import zlib

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import reference_model as rm  # noqa: E402
import safetensors_py as st  # noqa: E402

FORMAT_VERSION = "1"
BATCH, SEQ = 2, 9
LR, BETAS, ADAM_EPS, WEIGHT_DECAY, MAX_GRAD_NORM, STEPS = 1e-2, (0.9, 0.95), 1e-8, 0.1, 1.0, 3
DT = torch.float64

# Default init (std of a normal draw, per tensor kind). Norm weights 1 + 0.1 N(0,1).
INIT = {"linear": 0.15, "conv1d": 0.15, "embedding": 0.15, "bias": 0.1, "norm_weight": 0.1, "norm_bias": 0.1,
        "norm_offset_weight": 0.1,
        "router": 0.3, "buffer": 0.05,
        # gpt-oss / keel.attn_sinks: the per-head sink logit; gpt-oss's fused experts.
        "sink": 0.5, "expert_weight": 0.15, "expert_bias": 0.1}
# MoE fixtures: the smallest selection margin (k-th minus (k+1)-th choice, and the same for
# groups) over every forward of the fixture, 3 steps included, must exceed this, so fp32 keel
# routes exactly as the float64 reference. Seeds are tried from crc32(name) upward until it holds.
MIN_ROUTING_MARGIN = 2e-3

# ---- fixture configs: the families' tiny configs (configs/tiny/*.json) shrunk to hidden 32 and
# vocab 64 so that each fixture stays small, keeping what distinguishes each family. ----

LLAMA = {
    "model_type": "llama",
    "hidden_act": "silu",
    "hidden_size": 32,
    "intermediate_size": 88,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "num_hidden_layers": 2,
    "max_position_embeddings": 2048,
    "vocab_size": 64,
    "rms_norm_eps": 1e-05,
    "rope_theta": 500000.0,
    # head_dim 8: wavelengths 6.3 (high band, kept), 167 (medium band, smoothed), 4443 and
    # 1.2e5 (low band, divided by 8) -- all three llama3 branches are exercised.
    "rope_scaling": {"factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                     "original_max_position_embeddings": 256, "rope_type": "llama3"},
    "attention_bias": False,
    "tie_word_embeddings": False,
    "initializer_range": 0.02,
}


def llama_variant(keel=None, **over):
    c = copy.deepcopy(LLAMA)
    c.update(over)
    if keel:
        c["keel"] = keel
    return c


FIXTURES = {
    "gpt2": {
        "config": {"model_type": "gpt2", "activation_function": "gelu_new", "n_embd": 32, "n_head": 4,
                   "n_layer": 2, "n_positions": 16, "vocab_size": 64, "layer_norm_epsilon": 1e-05,
                   "initializer_range": 0.02},
    },
    "llama": {"config": llama_variant()},
    "mistral": {
        # MQA (1 kv head) and head_dim 12 != hidden / heads = 8.
        "config": {"model_type": "mistral", "hidden_act": "silu", "hidden_size": 32, "intermediate_size": 80,
                   "num_attention_heads": 4, "num_key_value_heads": 1, "head_dim": 12, "num_hidden_layers": 2,
                   "max_position_embeddings": 128, "vocab_size": 64, "rms_norm_eps": 1e-05,
                   "rope_theta": 10000.0, "tie_word_embeddings": False, "initializer_range": 0.02},
    },
    # MistralConfig.sliding_window on every layer: a window of 4 inside 9 tokens.
    "mistral_window": {
        "config": {"model_type": "mistral", "hidden_act": "silu", "hidden_size": 32, "intermediate_size": 80,
                   "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 8, "num_hidden_layers": 2,
                   "max_position_embeddings": 128, "vocab_size": 64, "rms_norm_eps": 1e-05, "sliding_window": 4,
                   "rope_theta": 10000.0, "tie_word_embeddings": False, "initializer_range": 0.02},
    },
    # Qwen2's use_sliding_window: the window (3) only from max_window_layers (1) on.
    "qwen2_window": {
        "config": {"model_type": "qwen2", "hidden_act": "silu", "hidden_size": 32, "intermediate_size": 96,
                   "num_attention_heads": 4, "num_key_value_heads": 4, "num_hidden_layers": 2,
                   "max_position_embeddings": 128, "vocab_size": 64, "rms_norm_eps": 1e-06,
                   "use_sliding_window": True, "sliding_window": 3, "max_window_layers": 1,
                   "rope_theta": 1000000.0, "tie_word_embeddings": True, "initializer_range": 0.02},
    },
    "qwen2": {
        # q/k/v biases (always), no o_proj bias, tied embeddings, MHA.
        "config": {"model_type": "qwen2", "hidden_act": "silu", "hidden_size": 32, "intermediate_size": 96,
                   "num_attention_heads": 4, "num_key_value_heads": 4, "num_hidden_layers": 2,
                   "max_position_embeddings": 128, "vocab_size": 64, "rms_norm_eps": 1e-06,
                   "rope_theta": 1000000.0, "tie_word_embeddings": True, "initializer_range": 0.02},
    },
    "qwen3": {
        # QK-Norm, GQA 4/2, head_dim 16 != hidden / heads = 8, tied.
        "config": {"model_type": "qwen3", "hidden_act": "silu", "hidden_size": 32, "intermediate_size": 96,
                   "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16, "num_hidden_layers": 2,
                   "max_position_embeddings": 128, "vocab_size": 64, "rms_norm_eps": 1e-06,
                   "rope_theta": 1000000, "attention_bias": False, "tie_word_embeddings": True,
                   "initializer_range": 0.02},
    },
    "olmo2": {
        # Post-sublayer norms (no input norm), QK-Norm over the full q and k widths (GQA 4/2:
        # k_norm is 2 x 8 wide), untied head, rope_theta and eps of the released configs.
        "config": {"model_type": "olmo2", "hidden_act": "silu", "hidden_size": 32, "intermediate_size": 88,
                   "num_attention_heads": 4, "num_key_value_heads": 2, "num_hidden_layers": 2,
                   "max_position_embeddings": 128, "vocab_size": 64, "rms_norm_eps": 1e-06,
                   "rope_theta": 500000, "attention_bias": False, "tie_word_embeddings": False,
                   "initializer_range": 0.02},
    },
    "gemma2": {
        # (1 + w) norms around both sublayers, GeGLU (tanh), head_dim 12 != 32 / 4 and
        # query_pre_attn_scalar 20 != head_dim, soft-caps small enough to bite, embeddings times
        # sqrt(32), layer 0 local with a window of 3 (shorter than the sequence), layer 1 global.
        "config": {"model_type": "gemma2", "hidden_act": "gelu_pytorch_tanh", "hidden_activation": "gelu_pytorch_tanh",
                   "hidden_size": 32, "intermediate_size": 64, "num_attention_heads": 4, "num_key_value_heads": 2,
                   "head_dim": 12, "query_pre_attn_scalar": 20, "num_hidden_layers": 2,
                   "max_position_embeddings": 128, "vocab_size": 64, "rms_norm_eps": 1e-06, "rope_theta": 10000.0,
                   "sliding_window": 3, "attn_logit_softcapping": 2.0, "final_logit_softcapping": 3.0,
                   "attention_bias": False, "tie_word_embeddings": True, "initializer_range": 0.02},
    },
    "gemma3_text": {
        # Gemma 3: (1 + w) q_norm / k_norm per head, no soft-caps, sliding_window_pattern 3 over
        # 3 layers (0, 1 local with window 4 and RoPE base 100; 2 global with base 1e4 and linear
        # scaling x4), head_dim 12, query_pre_attn_scalar 16, embeddings times sqrt(32).
        "config": {"model_type": "gemma3_text", "hidden_activation": "gelu_pytorch_tanh", "hidden_size": 32,
                   "intermediate_size": 64, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 12,
                   "query_pre_attn_scalar": 16, "num_hidden_layers": 3, "max_position_embeddings": 128,
                   "vocab_size": 64, "rms_norm_eps": 1e-06, "rope_theta": 10000.0, "rope_local_base_freq": 100.0,
                   "rope_scaling": {"rope_type": "linear", "factor": 4.0}, "sliding_window": 4,
                   "sliding_window_pattern": 3, "attn_logit_softcapping": None, "final_logit_softcapping": None,
                   "attention_bias": False, "tie_word_embeddings": True, "initializer_range": 0.02},
    },
    "llama_layernorm_post": {
        "config": llama_variant({"norm": "layernorm", "norm_placement": "post"}),
        # Post-norm feeds the raw embedding to layer 0's attention: draw it at unit scale so
        # that attention is not near-uniform there.
        "init_override": {"model.embed_tokens.weight": 1.0},
    },
    "llama_sandwich": {"config": llama_variant({"norm": "rmsnorm", "norm_placement": "sandwich"})},
    # Post-norm with the Transformer's sqrt(d) embedding scale: the 0.02-scale table enters layer
    # 0's attention at ~0.11, and the scale is on the embedding's gradient path too.
    "llama_post_embed_scale": {"config": llama_variant({"norm_placement": "post", "embed_scale": "sqrt_hidden"})},
    "llama_qknorm_bias": {"config": llama_variant({"qk_norm": True, "qkv_bias": True})},
    "llama_caps_zloss": {
        "config": llama_variant({"attn_softcap": 20.0, "final_softcap": 15.0, "z_loss": 1e-3}),
        # Larger q/k and lm_head draws so that both soft-caps bend values noticeably: about 20% of
        # the unmasked attention logits exceed 10 in magnitude (max ~38 before the cap of 20),
        # and about 16% of the output logits exceed 7.5 (max ~18 before the cap of 15).
        "init_override": {"self_attn.q_proj.weight": 0.5, "self_attn.k_proj.weight": 0.5, "lm_head.weight": 1.0},
    },
    "llama_geglu": {"config": llama_variant(hidden_act="gelu")},
    # MLA (DeepSeek-V3 attention) with dense MLPs in every layer (first_k_dense_replace = layers):
    # q_lora, rope_interleave (DeepSeek's adjacent pairs), v_head_dim 10 != qk head dim 12, and
    # YaRN with mscale != mscale_all_dim so that both the cos/sin attention factor and the
    # softmax's mscale^2 differ from 1; with rotary dim 8 the ramp keeps, blends and interpolates.
    "deepseek_v3_mla": {
        "config": {"model_type": "deepseek_v3", "hidden_act": "silu", "hidden_size": 32, "intermediate_size": 80,
                   "moe_intermediate_size": 16, "n_routed_experts": 4, "n_shared_experts": 1,
                   "num_experts_per_tok": 2, "n_group": 2, "topk_group": 1, "first_k_dense_replace": 2,
                   "routed_scaling_factor": 2.5, "norm_topk_prob": True, "num_attention_heads": 4,
                   "num_key_value_heads": 4, "q_lora_rank": 24, "kv_lora_rank": 16, "qk_nope_head_dim": 4,
                   "qk_rope_head_dim": 8, "v_head_dim": 10, "num_hidden_layers": 2,
                   "max_position_embeddings": 128, "vocab_size": 64, "rms_norm_eps": 1e-06, "rope_theta": 10000.0,
                   "rope_interleave": True,
                   "rope_scaling": {"type": "yarn", "factor": 4.0, "original_max_position_embeddings": 64,
                                    "beta_fast": 32, "beta_slow": 1, "mscale": 1.0, "mscale_all_dim": 0.8},
                   "attention_bias": False, "tie_word_embeddings": False, "initializer_range": 0.02},
    },
    # MLA without q compression (q_proj, as DeepSeek-V2-Lite), the rotate-half RoPE layout, and
    # attention_bias (biases on kv_a_proj_with_mqa and o_proj; HF's q_proj never has one).
    "mla_no_q_lora": {
        "config": {"model_type": "deepseek_v3", "hidden_act": "silu", "hidden_size": 32, "intermediate_size": 72,
                   "moe_intermediate_size": 16, "n_routed_experts": 4, "n_shared_experts": 1,
                   "num_experts_per_tok": 2, "n_group": 1, "topk_group": 1, "first_k_dense_replace": 2,
                   "num_attention_heads": 4, "num_key_value_heads": 4, "q_lora_rank": None, "kv_lora_rank": 12,
                   "qk_nope_head_dim": 8, "qk_rope_head_dim": 4, "v_head_dim": 8, "num_hidden_layers": 2,
                   "max_position_embeddings": 128, "vocab_size": 64, "rms_norm_eps": 1e-06, "rope_theta": 10000.0,
                   "rope_interleave": False, "attention_bias": True, "tie_word_embeddings": False,
                   "initializer_range": 0.02},
    },
    # MLA at rms_norm_eps 1e-2: the block norms use it, q_a_layernorm and kv_a_layernorm keep HF's
    # DeepseekV3RMSNorm default of 1e-6 (modeling_deepseek_v3.py builds them without the config's
    # eps). Small latent weights make the eps matter: at 1e-2 for every norm, keel's gradients
    # differed from HF's by 12%.
    "mla_latent_eps": {
        "config": {"model_type": "deepseek_v3", "hidden_act": "silu", "hidden_size": 32, "intermediate_size": 72,
                   "moe_intermediate_size": 16, "n_routed_experts": 4, "n_shared_experts": 1,
                   "num_experts_per_tok": 2, "n_group": 1, "topk_group": 1, "first_k_dense_replace": 2,
                   "num_attention_heads": 4, "num_key_value_heads": 4, "q_lora_rank": 16, "kv_lora_rank": 12,
                   "qk_nope_head_dim": 8, "qk_rope_head_dim": 4, "v_head_dim": 8, "num_hidden_layers": 2,
                   "max_position_embeddings": 128, "vocab_size": 64, "rms_norm_eps": 1e-02, "rope_theta": 10000.0,
                   "rope_interleave": True, "attention_bias": False, "tie_word_embeddings": False,
                   "initializer_range": 0.02},
        "init_override": {"self_attn.q_a_proj.weight": 0.02, "self_attn.kv_a_proj_with_mqa.weight": 0.02},
    },
    "llama_relu": {"config": llama_variant(hidden_act="relu", tie_word_embeddings=True)},
    # DeepSeek-V3's whole block: MLA (q_lora, interleaved RoPE) in both layers, layer 0 dense,
    # layer 1 DeepseekV3MoE (sigmoid router with correction bias, 4 groups of 2 with 2 kept,
    # top-2 renormalized x2.5, one shared expert).
    "deepseek_v3": {
        "config": {"model_type": "deepseek_v3", "hidden_act": "silu", "hidden_size": 32, "intermediate_size": 80,
                   "moe_intermediate_size": 16, "n_routed_experts": 8, "n_shared_experts": 1,
                   "num_experts_per_tok": 2, "n_group": 4, "topk_group": 2, "first_k_dense_replace": 1,
                   "routed_scaling_factor": 2.5, "norm_topk_prob": True, "num_attention_heads": 4,
                   "num_key_value_heads": 4, "q_lora_rank": 24, "kv_lora_rank": 16, "qk_nope_head_dim": 8,
                   "qk_rope_head_dim": 4, "v_head_dim": 8, "num_hidden_layers": 2,
                   "max_position_embeddings": 128, "vocab_size": 64, "rms_norm_eps": 1e-06, "rope_theta": 10000.0,
                   "rope_interleave": True, "attention_bias": False, "tie_word_embeddings": False,
                   "initializer_range": 0.02},
    },
    # Kimi K2's variant of the same block (model_type kimi_k2): one expert group (n_group 1, so the
    # sigmoid router is not group-limited), routed_scaling_factor 2.827 as in K2's config, and
    # RoPE theta 5e4.
    "kimi_k2": {
        "config": {"model_type": "kimi_k2", "hidden_act": "silu", "hidden_size": 32, "intermediate_size": 72,
                   "moe_intermediate_size": 16, "n_routed_experts": 8, "n_shared_experts": 1,
                   "num_experts_per_tok": 2, "n_group": 1, "topk_group": 1, "first_k_dense_replace": 1,
                   "routed_scaling_factor": 2.827, "norm_topk_prob": True, "num_attention_heads": 4,
                   "num_key_value_heads": 4, "q_lora_rank": 16, "kv_lora_rank": 12, "qk_nope_head_dim": 8,
                   "qk_rope_head_dim": 4, "v_head_dim": 8, "num_hidden_layers": 2,
                   "max_position_embeddings": 128, "vocab_size": 64, "rms_norm_eps": 1e-06, "rope_theta": 50000.0,
                   "attention_bias": False, "tie_word_embeddings": False, "initializer_range": 0.02},
    },
    "mixtral": {
        # Softmax router over 4 experts, top-2 renormalized; experts w1/w3/w2 under block_sparse_moe.
        "config": {"model_type": "mixtral", "hidden_act": "silu", "hidden_size": 32, "intermediate_size": 48,
                   "num_local_experts": 4, "num_experts_per_tok": 2, "num_attention_heads": 4,
                   "num_key_value_heads": 2, "num_hidden_layers": 2, "max_position_embeddings": 128,
                   "vocab_size": 64, "rms_norm_eps": 1e-05, "rope_theta": 1000000.0,
                   "tie_word_embeddings": False, "initializer_range": 0.02},
    },
    "qwen3_moe": {
        # Softmax top-2 of 8 WITHOUT renormalization (norm_topk_prob false), QK-Norm, layer 0 dense.
        "config": {"model_type": "qwen3_moe", "hidden_act": "silu", "hidden_size": 32, "intermediate_size": 64,
                   "moe_intermediate_size": 24, "num_experts": 8, "num_experts_per_tok": 2,
                   "norm_topk_prob": False, "decoder_sparse_step": 1, "mlp_only_layers": [0],
                   "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16, "num_hidden_layers": 2,
                   "max_position_embeddings": 128, "vocab_size": 64, "rms_norm_eps": 1e-06, "rope_theta": 1000000,
                   "attention_bias": False, "tie_word_embeddings": False, "initializer_range": 0.02},
    },
    # Qwen3MoeAttention windows every layer once use_sliding_window is on (max_window_layers is
    # not read): a window of 3 in 9 tokens on both layers, although max_window_layers says 1.
    "qwen3_moe_window": {
        "config": {"model_type": "qwen3_moe", "hidden_act": "silu", "hidden_size": 32, "intermediate_size": 64,
                   "moe_intermediate_size": 24, "num_experts": 8, "num_experts_per_tok": 2,
                   "norm_topk_prob": False, "decoder_sparse_step": 1, "mlp_only_layers": [0],
                   "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16, "num_hidden_layers": 2,
                   "max_position_embeddings": 128, "vocab_size": 64, "rms_norm_eps": 1e-06, "rope_theta": 1000000,
                   "use_sliding_window": True, "sliding_window": 3, "max_window_layers": 1,
                   "attention_bias": False, "tie_word_embeddings": False, "initializer_range": 0.02},
    },
    "glm4_moe": {
        # The DeepSeek-V3 router: sigmoid, correction bias for selection, 4 groups of 2 with the
        # best 2 groups kept, top-2, renormalized, x2.5, one shared expert, layer 0 dense; GLM's
        # partial rotary (half of head_dim 16), q/k/v biases and QK-Norm.
        "config": {"model_type": "glm4_moe", "hidden_act": "silu", "hidden_size": 32, "intermediate_size": 64,
                   "moe_intermediate_size": 16, "n_routed_experts": 8, "n_shared_experts": 1,
                   "num_experts_per_tok": 2, "n_group": 4, "topk_group": 2, "first_k_dense_replace": 1,
                   "routed_scaling_factor": 2.5, "norm_topk_prob": True, "num_attention_heads": 4,
                   "num_key_value_heads": 2, "head_dim": 16, "partial_rotary_factor": 0.5, "attention_bias": True,
                   "use_qk_norm": True, "num_hidden_layers": 2, "max_position_embeddings": 128, "vocab_size": 64,
                   "rms_norm_eps": 1e-05, "rope_theta": 1000000, "tie_word_embeddings": False,
                   "initializer_range": 0.02},
    },
}


def qwen3_variant(keel, **over):
    c = copy.deepcopy(FIXTURES["qwen3"]["config"])
    c.update(over)
    c["keel"] = keel
    return c


FIXTURES.update({
    # keel.attn_sinks on Qwen3 (QK-Norm, GQA 4/2, head_dim 16, tied): gpt-oss's learned per-head sink
    # logit (self_attn.sinks [4], N(0, 0.5^2)) in every softmax denominator.
    "qwen3_sinks": {"config": qwen3_variant({"attn_sinks": True})},
    # keel.attn_output_gate on Qwen3 with attention_bias: Qwen3-Next's gated attention -- q_proj and
    # its bias 2 x 4 x 16 = 128 wide, per head [query 16 | gate 16]; QK-Norm on the query half only;
    # attn_output * sigmoid(gate) before o_proj (which has a bias here too).
    "qwen3_gate": {"config": qwen3_variant({"attn_output_gate": True}, attention_bias=True)},
    # keel.norm rmsnorm_1p (Qwen3-Next's zero-centred x_hat * (1 + w), weights decayed) on Llama
    # with keel.qk_norm, so that input / post-attention / final norms and q_norm / k_norm all use it.
    "llama_rmsnorm_1p": {"config": llama_variant({"norm": "rmsnorm_1p", "qk_norm": True})},
    # DeepSeek-V2: MLA with q_lora, complex-pair RoPE (in place, DeepseekV2's apply_rotary_emb),
    # layer 0 dense, layer 1 DeepseekV2Moe: softmax router, group_limited_greedy over 2 groups of 4
    # with 1 kept (group score = max), top-2 not renormalized x routed_scaling_factor 4, two shared
    # experts (width 2 x 16).
    "deepseek_v2": {
        "config": {"model_type": "deepseek_v2", "hidden_act": "silu", "hidden_size": 32, "intermediate_size": 80,
                   "moe_intermediate_size": 16, "n_routed_experts": 8, "n_shared_experts": 2,
                   "num_experts_per_tok": 2, "topk_method": "group_limited_greedy", "n_group": 2, "topk_group": 1,
                   "first_k_dense_replace": 1, "moe_layer_freq": 1, "routed_scaling_factor": 4.0,
                   "norm_topk_prob": False, "scoring_func": "softmax", "num_attention_heads": 4,
                   "num_key_value_heads": 4, "q_lora_rank": 24, "kv_lora_rank": 16, "qk_nope_head_dim": 8,
                   "qk_rope_head_dim": 8, "v_head_dim": 8, "num_hidden_layers": 2, "max_position_embeddings": 128,
                   "vocab_size": 64, "rms_norm_eps": 1e-06, "rope_theta": 10000.0, "attention_bias": False,
                   "tie_word_embeddings": False, "initializer_range": 0.02},
    },
    # DeepSeek-V2-Lite's shape: q_proj (q_lora_rank null), greedy top-2 of 8 (no groups),
    # routed_scaling_factor 1, two shared experts, layer 0 dense.
    "deepseek_v2_lite": {
        "config": {"model_type": "deepseek_v2", "hidden_act": "silu", "hidden_size": 32, "intermediate_size": 72,
                   "moe_intermediate_size": 16, "n_routed_experts": 8, "n_shared_experts": 2,
                   "num_experts_per_tok": 2, "topk_method": "greedy", "n_group": 1, "topk_group": 1,
                   "first_k_dense_replace": 1, "moe_layer_freq": 1, "routed_scaling_factor": 1.0,
                   "norm_topk_prob": False, "scoring_func": "softmax", "num_attention_heads": 4,
                   "num_key_value_heads": 4, "q_lora_rank": None, "kv_lora_rank": 12, "qk_nope_head_dim": 8,
                   "qk_rope_head_dim": 4, "v_head_dim": 8, "num_hidden_layers": 2, "max_position_embeddings": 128,
                   "vocab_size": 64, "rms_norm_eps": 1e-06, "rope_theta": 10000.0, "attention_bias": False,
                   "tie_word_embeddings": False, "initializer_range": 0.02},
    },
    # gpt-oss: sinks, q/k/v/o biases, GQA 4/2 with head_dim 8, layer 0 sliding (window 4 of 9 tokens),
    # layer 1 full, the released YaRN (factor 32, original 4096, theta 150000, truncate false: the
    # ramp ends 1.011 / 2.174 are not rounded), the biased top-2-of-4 router with softmax over the
    # two logits, fused interleaved experts with biases and swiglu_limit 1 (both clamps bind).
    "gpt_oss": {
        "config": {"model_type": "gpt_oss", "hidden_act": "silu", "hidden_size": 32, "intermediate_size": 16,
                   "num_local_experts": 4, "num_experts_per_tok": 2, "num_attention_heads": 4,
                   "num_key_value_heads": 2, "head_dim": 8, "num_hidden_layers": 2,
                   "layer_types": ["sliding_attention", "full_attention"], "sliding_window": 4,
                   "max_position_embeddings": 4096, "vocab_size": 64, "rms_norm_eps": 1e-05,
                   "rope_theta": 150000.0,
                   "rope_scaling": {"rope_type": "yarn", "factor": 32.0, "beta_fast": 32.0, "beta_slow": 1.0,
                                    "truncate": False, "original_max_position_embeddings": 4096},
                   "attention_bias": True, "swiglu_limit": 1.0, "router_aux_loss_coef": 0.9,
                   "output_router_logits": False, "tie_word_embeddings": False, "initializer_range": 0.02},
    },
})


def fixture_seed(name):
    return zlib.crc32(name.encode("utf-8")) & 0x7FFFFFFF


def init_params(layout, gen, override, s=None):
    params, decay = {}, {}
    for name, shape, kind in layout:
        std = INIT[kind]
        for suffix, v in (override or {}).items():
            if name.endswith(suffix):
                std = v
        z = torch.randn(shape, generator=gen, dtype=DT)
        params[name] = 1.0 + std * z if kind == "norm_weight" else std * z
        decay[name] = rm.decays(name, shape, kind, s)
    return params, decay


def is_buffer(name):
    return name.endswith("e_score_correction_bias")


def loss_grads(s, params, tokens):
    leaves = {k: v.detach().clone().requires_grad_(not is_buffer(k)) for k, v in params.items()}
    loss, ce, logits, max_logit = rm.loss_and_stats(s, leaves, tokens)
    names = [n for n in leaves if not is_buffer(n)]
    # allow_unused: an expert no token picked has no gradient, like a buffer.
    grads = dict(zip(names, torch.autograd.grad(loss, [leaves[n] for n in names], allow_unused=True)))
    for n in leaves:  # buffers: no gradient (HF registers the correction bias as a buffer)
        if grads.get(n) is None:
            grads[n] = torch.zeros_like(params[n])
    return loss.detach(), ce.detach(), logits.detach(), max_logit.detach(), {n: grads[n] for n in leaves}


def train(s, params, decay, tokens):
    p = {k: v.clone() for k, v in params.items()}
    opt = rm.AdamW(LR, BETAS, ADAM_EPS, WEIGHT_DECAY)
    losses = []
    for _ in range(STEPS):
        loss, _, _, _, grads = loss_grads(s, p, tokens)
        losses.append(loss.item())
        rm.clip_grad_norm([grads[n] for n in p], MAX_GRAD_NORM)
        opt.step(p, grads, decay)
    return losses, p


# ---------------------------------------- self-checks ----------------------------------------

def check_finite_differences(name, s, params, tokens, grads, gen, h=1e-5):
    """Central differences on one random element of every parameter tensor."""
    worst = 0.0
    for n in params:
        if is_buffer(n):
            continue
        flat = params[n].view(-1)
        j = int(torch.randint(flat.numel(), (1,), generator=gen))
        old = flat[j].item()
        flat[j] = old + h
        lp = rm.loss_and_stats(s, params, tokens)[0].item()
        flat[j] = old - h
        lm = rm.loss_and_stats(s, params, tokens)[0].item()
        flat[j] = old
        fd = (lp - lm) / (2 * h)
        ad = grads[n].view(-1)[j].item()
        err = abs(fd - ad) / max(1e-3, abs(ad))
        worst = max(worst, err)
        assert err < 1e-6, f"{name}: finite difference mismatch on {n}[{j}]: fd {fd} vs autograd {ad}"
    return worst


def check_attention_naive(name, s, params, tokens):
    """Layer-0 attention of a decoder family against a loop-per-head, per-position version that
    rotates each pair (i, i + hd/2) by position * inv_freq[i] (times YaRN's attention factor) and
    maps query head h to kv head h // (heads / kv_heads), independent of rotate_half / repeat_kv;
    with sinks, softmax over [scores..., sink_h] without the sink's share; with the output gate,
    query h = q_proj rows [2h hd, 2h hd + hd) and gate h the next hd rows, output * sigmoid(gate)."""
    B, T = tokens.shape
    p = params
    x = torch.nn.functional.embedding(tokens, p["model.embed_tokens.weight"]) * s.get("embed_scale", 1.0)
    if s["placement"] not in ("post", "post_sublayer"):  # those have no norm before attention
        x = rm.apply_norm(s, p, "model.layers.0.input_layernorm", x)
    if "local_rope" in s and 0 in s["sliding_layers"]:  # Gemma 3: layer 0 rotates with the local base
        s = dict(s, rope=s["local_rope"])
    cos, sin = rm.rope_cos_sin(s, T)
    want = rm.decoder_attention(s, p, "model.layers.0.self_attn", x, cos, sin, None)
    nh, nkv, hd = s["heads"], s["kv_heads"], s["head_dim"]
    rd = s["rotary_dim"]
    inv = rm.rope_inv_freq(s)
    pre = "model.layers.0.self_attn."

    def lin(n, v):
        y = p[pre + n + ".weight"] @ v
        return y + p[pre + n + ".bias"] if pre + n + ".bias" in p else y

    af = rm.rope_attention_factor(s)

    def rot(v, pos):
        out = v.clone()
        for i in range(rd // 2):  # dims rd.. pass through (partial rotary)
            c, sn = af * math.cos(pos * inv[i].item()), af * math.sin(pos * inv[i].item())
            out[i] = v[i] * c - v[i + rd // 2] * sn
            out[i + rd // 2] = v[i + rd // 2] * c + v[i] * sn
        return out

    gated = s.get("attn_gate")

    def proj_vec(n, b, t):
        full = lin(n, x[b, t])
        if n == "q_proj" and gated:  # keep each head's query half
            full = torch.cat([full[2 * h * hd:2 * h * hd + hd] for h in range(nh)])
        return full

    def gate_vec(b, t, h):
        return lin("q_proj", x[b, t])[2 * h * hd + hd:2 * (h + 1) * hd]

    def head_vec(n, b, t, h):
        full = proj_vec(n, b, t)
        if s["qk_norm"] and n in ("q_proj", "k_proj"):
            w = p[pre + ("q_norm" if n == "q_proj" else "k_norm") + ".weight"]
            if s.get("norm_offset"):  # Gemma3RMSNorm: x_hat * (1 + w)
                w = 1.0 + w
            if s.get("qk_full"):  # OLMo 2: one RMS over the token's whole projection, one gain per element
                return (w * full / torch.sqrt((full * full).mean() + s["eps"]))[h * hd:(h + 1) * hd]
            v = full[h * hd:(h + 1) * hd]
            return w * v / torch.sqrt((v * v).mean() + s["eps"])
        return full[h * hd:(h + 1) * hd]

    scale = s.get("query_scale", 1 / math.sqrt(hd))  # Gemma: query_pre_attn_scalar ** -0.5
    window = s.get("sliding_window", 0) if 0 in s.get("sliding_layers", []) else 0
    got = torch.zeros_like(want)
    for b in range(B):
        for t in range(T):
            heads = []
            keys = range(max(0, t - window + 1) if window else 0, t + 1)  # 0 <= t - u < window
            for h in range(nh):
                g = h // (nh // nkv)
                q = rot(head_vec("q_proj", b, t, h), t)
                sc = torch.stack([rot(head_vec("k_proj", b, u, g), u) @ q * scale for u in keys])
                if s["attn_softcap"]:
                    sc = s["attn_softcap"] * torch.tanh(sc / s["attn_softcap"])
                if s.get("attn_sinks"):
                    w = torch.softmax(torch.cat((sc, p[pre + "sinks"][h:h + 1])), 0)[:-1]
                else:
                    w = torch.softmax(sc, 0)
                o = sum(w[i] * head_vec("v_proj", b, u, g) for i, u in enumerate(keys))
                heads.append(o * torch.sigmoid(gate_vec(b, t, h)) if gated else o)
            got[b, t] = lin("o_proj", torch.cat(heads))
    err = (got - want).abs().max().item()
    assert err < 1e-12, f"{name}: naive attention differs by {err}"
    return err


def check_moe_naive(name, s, params, gen):
    """The MoE layer of the gpt_oss / deepseek_v2 fixtures on random inputs against independent
    forms. gpt_oss: HF GptOssExperts' inference branch (every expert on every token with bmm,
    GptOssTopKRouter's scores scattered into a dense [tokens, E] matrix, weighted sum).
    deepseek_v2: a per-token loop over sorted Python lists for the (group-limited) greedy choice."""
    layer = s["moe_layers"][-1]
    prefix = f"model.layers.{layer}.mlp"
    H, E, k = s["hidden"], s["experts"], s["top_k"]
    x = torch.randn(2, 5, H, generator=gen, dtype=DT)
    h = x.reshape(-1, H)
    if s["router"] == "gpt_oss":
        want = rm.gpt_oss_moe(s, params, prefix, x).reshape(-1, H)
        logits = h @ params[prefix + ".router.weight"].T + params[prefix + ".router.bias"]
        top, idx = torch.topk(logits, k, dim=-1)
        dense = torch.zeros_like(logits).scatter_(1, idx, torch.softmax(top, dim=1))
        gu = torch.bmm(h.repeat(E, 1).view(E, -1, H), params[prefix + ".experts.gate_up_proj"])
        gu = gu + params[prefix + ".experts.gate_up_proj_bias"][:, None, :]
        lim, a = s["swiglu_limit"], s["swiglu_alpha"]
        gate, up = gu[..., ::2].clamp(max=lim), gu[..., 1::2].clamp(min=-lim, max=lim)
        y = torch.bmm((up + 1) * (gate * torch.sigmoid(gate * a)), params[prefix + ".experts.down_proj"])
        y = y + params[prefix + ".experts.down_proj_bias"][:, None, :]
        got = (y * dense.T[..., None]).sum(dim=0)
        err = (got - want).abs().max().item()
        assert err < 1e-12, f"{name}: gpt-oss MoE differs from the dense form by {err}"
        return err
    logits = h @ params[prefix + ".gate.weight"].T
    weights, idx = rm.deepseek_v2_route(s, logits)
    probs = torch.softmax(logits, dim=-1)
    err = 0.0
    for t in range(h.shape[0]):
        pr = probs[t].tolist()
        cand = list(range(E))
        if s["topk_method"] == "group_limited_greedy":
            size = E // s["n_group"]
            gmax = [max(pr[g * size:(g + 1) * size]) for g in range(s["n_group"])]
            keep = sorted(range(s["n_group"]), key=lambda g: -gmax[g])[:s["topk_group"]]
            cand = [e for e in cand if e // size in keep]
        chosen = sorted(cand, key=lambda e: -pr[e])[:k]
        got = dict(zip(idx[t].tolist(), weights[t].tolist()))
        assert set(got) == set(chosen), (name, t, got, chosen)
        for e in chosen:
            w = pr[e] / (sum(pr[c] for c in chosen) + 1e-20) if s["norm_topk"] and k > 1 else pr[e] * s["scaling"]
            err = max(err, abs(got[e] - w))
    assert err < 1e-14, f"{name}: deepseek_v2 routing weights differ by {err}"
    return err


def check_mla_attention_naive(name, s, params, tokens):
    """Layer-0 MLA against a loop-per-head, per-position version that rotates the pairs
    (2i, 2i+1) in place when rope_interleave is set (DeepSeek's official complex-multiply form,
    independent of HF's permute-then-rotate-half) and (i, i + d/2) otherwise, scaled by YaRN's
    attention factor, with the shared k^R and the MLA softmax scale."""
    B, T = tokens.shape
    p = params
    m = s["mla"]
    x = torch.nn.functional.embedding(tokens, p["model.embed_tokens.weight"])
    x = rm.apply_norm(s, p, "model.layers.0.input_layernorm", x)
    cos, sin = rm.rope_cos_sin(s, T)
    pre = "model.layers.0.self_attn."
    want = rm.mla_attention(s, p, pre[:-1], x, cos, sin, None)
    nh, nope, rd, vd, r = s["heads"], m["nope"], m["rope"], m["v"], m["kv_lora_rank"]
    inv = rm.rope_inv_freq(s)
    af = rm.rope_attention_factor(s)
    scale = rm.mla_softmax_scale(s)

    def lin(n, v):
        y = p[pre + n + ".weight"] @ v
        return y + p[pre + n + ".bias"] if pre + n + ".bias" in p else y

    def rms(v, w):  # the latent norms: DeepseekV3RMSNorm's default eps, not rms_norm_eps
        return w * v / torch.sqrt((v * v).mean() + 1e-6)

    def rot(v, pos):
        out = v.clone()
        for i in range(rd // 2):
            a, b = (2 * i, 2 * i + 1) if m["interleave"] else (i, i + rd // 2)
            c, sn = af * math.cos(pos * inv[i].item()), af * math.sin(pos * inv[i].item())
            out[a] = v[a] * c - v[b] * sn
            out[b] = v[b] * c + v[a] * sn
        return out

    def q_head(b, t, h):
        if m["q_lora_rank"]:
            q = lin("q_b_proj", rms(lin("q_a_proj", x[b, t]), p[pre + "q_a_layernorm.weight"]))
        else:
            q = lin("q_proj", x[b, t])
        q = q[h * (nope + rd):(h + 1) * (nope + rd)]
        return torch.cat((q[:nope], rot(q[nope:], t)))

    def kv_head(b, t, h):
        a = lin("kv_a_proj_with_mqa", x[b, t])
        kv = lin("kv_b_proj", rms(a[:r], p[pre + "kv_a_layernorm.weight"]))[h * (nope + vd):(h + 1) * (nope + vd)]
        return torch.cat((kv[:nope], rot(a[r:], t))), kv[nope:]

    got = torch.zeros_like(want)
    for b in range(B):
        for t in range(T):
            heads = []
            for h in range(nh):
                q = q_head(b, t, h)
                kvs = [kv_head(b, u, h) for u in range(t + 1)]
                sc = torch.stack([kv[0] @ q * scale for kv in kvs])
                w = torch.softmax(sc, 0)
                heads.append(sum(w[u] * kvs[u][1] for u in range(t + 1)))
            got[b, t] = lin("o_proj", torch.cat(heads))
    err = (got - want).abs().max().item()
    assert err < 1e-12, f"{name}: naive MLA attention differs by {err}"
    return err


def check_yarn_rope():
    """Hand computation of _compute_yarn_parameters and the MLA softmax scale for the
    deepseek_v3_mla fixture (rotary dim 8, factor 4, original context 64, mscale 1 / 0.8)."""
    cfg = FIXTURES["deepseek_v3_mla"]["config"]
    s = rm.resolve(cfg)
    sc = cfg["rope_scaling"]
    d, theta = cfg["qk_rope_head_dim"], cfg["rope_theta"]
    corr = lambda rot: d * math.log(sc["original_max_position_embeddings"] / (rot * 2 * math.pi)) / (2 * math.log(theta))  # noqa: E731
    low, high = max(math.floor(corr(sc["beta_fast"])), 0), min(math.ceil(corr(sc["beta_slow"])), d - 1)
    assert (low, high) == (0, 2), (low, high)
    expect = []
    for i in range(d // 2):
        f = theta ** (-2 * i / d)
        keep = 1 - min(max((i - low) / (high - low), 0.0), 1.0)
        expect.append(f * keep + f / sc["factor"] * (1 - keep))
    got = rm.rope_inv_freq(s).tolist()
    for g, e in zip(got, expect):
        assert abs(g - e) <= 1e-15 * abs(e), (got, expect)
    ms = lambda m: 0.1 * m * math.log(sc["factor"]) + 1.0  # noqa: E731
    assert abs(rm.rope_attention_factor(s) - ms(1.0) / ms(0.8)) < 1e-15
    assert abs(rm.mla_softmax_scale(s) - ms(0.8) ** 2 / math.sqrt(12)) < 1e-15
    return got


def check_gpt_oss_yarn():
    """Hand computation of _compute_yarn_parameters for the gpt_oss fixture with truncate false
    (find_correction_range keeps the unrounded ends), which must differ from the truncated ramp,
    and its attention factor 0.1 ln(factor) + 1 (no mscale fields). The softmax scale stays
    head_dim ** -0.5 (GptOssAttention.scaling)."""
    cfg = FIXTURES["gpt_oss"]["config"]
    s = rm.resolve(cfg)
    sc = cfg["rope_scaling"]
    d, theta, orig = s["head_dim"], cfg["rope_theta"], sc["original_max_position_embeddings"]
    corr = lambda rot: d * math.log(orig / (rot * 2 * math.pi)) / (2 * math.log(theta))  # noqa: E731
    low, high = max(corr(sc["beta_fast"]), 0), min(corr(sc["beta_slow"]), d - 1)
    assert low != math.floor(low) and high != math.ceil(high), (low, high)

    def expect(lo, hi):
        out = []
        for i in range(d // 2):
            f = theta ** (-2 * i / d)
            keep = 1 - min(max((i - lo) / (hi - lo), 0.0), 1.0)
            out.append(f * keep + f / sc["factor"] * (1 - keep))
        return out
    got = rm.rope_inv_freq(s).tolist()
    for g, e in zip(got, expect(low, high)):
        assert abs(g - e) <= 1e-15 * abs(e), (got, expect(low, high))
    truncated = expect(math.floor(low), math.ceil(high))
    assert max(abs(g - e) / e for g, e in zip(got, truncated)) > 1e-2, "truncate does not matter here"
    assert abs(rm.rope_attention_factor(s) - (0.1 * math.log(sc["factor"]) + 1.0)) < 1e-15
    assert s["sliding_layers"] == [0] and s["sliding_window"] == 4 and s["attn_sinks"]
    return got, (low, high)


def check_llama3_rope():
    """Hand computation of _compute_llama3_parameters for the llama fixture config."""
    cfg = FIXTURES["llama"]["config"]
    s = rm.resolve(cfg)
    sc = cfg["rope_scaling"]
    d, theta = s["head_dim"], cfg["rope_theta"]
    lo_wl = sc["original_max_position_embeddings"] / sc["low_freq_factor"]
    hi_wl = sc["original_max_position_embeddings"] / sc["high_freq_factor"]
    expect, bands = [], set()
    for i in range(d // 2):
        f = 1.0 / theta ** (2 * i / d)
        wl = 2 * math.pi / f
        if wl < hi_wl:
            bands.add("high")
            expect.append(f)
        elif wl > lo_wl:
            bands.add("low")
            expect.append(f / sc["factor"])
        else:
            bands.add("medium")
            a = (sc["original_max_position_embeddings"] / wl - sc["low_freq_factor"]) / (
                sc["high_freq_factor"] - sc["low_freq_factor"])
            expect.append((1 - a) * f / sc["factor"] + a * f)
    got = rm.rope_inv_freq(s).tolist()
    assert bands == {"high", "medium", "low"}, bands
    for g, e in zip(got, expect):
        assert abs(g - e) <= 1e-15 * abs(e), (got, expect)
    return got


def check_optimizer_against_torch(s, params, decay, tokens, mine):
    """Our AdamW + clipping against torch.optim.AdamW + torch.nn.utils.clip_grad_norm_."""
    leaves = {k: torch.nn.Parameter(v.clone()) for k, v in params.items()}
    groups = [{"params": [leaves[n] for n in leaves if decay[n]], "weight_decay": WEIGHT_DECAY},
              {"params": [leaves[n] for n in leaves if not decay[n]], "weight_decay": 0.0}]
    opt = torch.optim.AdamW(groups, lr=LR, betas=BETAS, eps=ADAM_EPS, foreach=False)
    for _ in range(STEPS):
        opt.zero_grad()
        loss = rm.loss_and_stats(s, leaves, tokens)[0]
        loss.backward()
        torch.nn.utils.clip_grad_norm_(list(leaves.values()), MAX_GRAD_NORM)
        opt.step()
    worst = max((leaves[n].detach() - mine[n]).abs().max().item() for n in leaves)
    assert worst < 1e-12, worst
    return worst


def find_keel():
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    for sub in ("build/release/keel", "build/ref/keel", "build/debug/keel"):
        path = os.path.join(root, sub)
        if os.access(path, os.X_OK):
            return path
    return None


# keel inspect's messages for a config it does not know (a family or a keel key it lacks): the
# cross-check is then skipped with a printed note instead of failing.
_KEEL_UNKNOWN = ("unsupported model_type", "unknown key", "unknown norm")


def check_against_keel(keel, path, s, layout):
    """Returns the parameter count, or a string (why the check was skipped)."""
    out = subprocess.run([keel, "inspect", "--json", path], capture_output=True, text=True)
    if out.returncode != 0:
        if any(m in out.stderr for m in _KEEL_UNKNOWN):
            return out.stderr.strip().splitlines()[-1]
        raise AssertionError(f"keel inspect failed on {path}: {out.stderr}")
    info = json.loads(out.stdout)
    total = sum(math.prod(shape) for _, shape, _ in layout)
    arch = info["architecture"]
    assert info["params"]["total"] == total, (path, info["params"]["total"], total)
    assert info["params"]["tensors"] == len(layout), (path, info["params"]["tensors"], len(layout))
    att = arch["attention"]
    assert att["head_dim"] == s["head_dim"] and att["num_heads"] == s["heads"], att
    assert att["num_kv_heads"] == s["kv_heads"], att
    if s["family"] != "gpt2":
        assert att["qkv_bias"] == s["qkv_bias"] and att["o_bias"] == s["o_bias"], att
        assert att["qk_norm"] == s["qk_norm"], att
        assert arch["norm"]["placement"] == s["placement"], arch["norm"]
    assert arch["tie_word_embeddings"] == s["tie"], arch
    return total


# ------------------------------------------ main ------------------------------------------

def zero_grad_by_symmetry(s):
    """Flat element ranges [begin, end) whose gradient is exactly zero in exact arithmetic, so
    that AdamW (which normalizes by sqrt(v) + 1e-8) turns fp32 rounding noise there into
    updates of up to lr per step: GPT-2's key bias (columns H..2H of c_attn.bias) adds q.b_k,
    the same constant to every score of a query row, which softmax ignores. (With RoPE the key
    bias is rotated by position, so decoder families have no such elements.)"""
    if s["family"] != "gpt2":
        return {}
    H = s["hidden"]
    return {f"transformer.h.{l}.attn.c_attn.bias": [H, 2 * H] for l in range(s["layers"])}


def weight_decay_rule(s):
    rule = "2-D tensors except embeddings (model.embed_tokens, transformer.wte, transformer.wpe)"
    if s.get("router") == "gpt_oss":
        rule += "; gpt-oss fused expert matrices [E, in, out] decay, their [E, out] biases do not"
    if s.get("norm") == "rmsnorm_1p":
        rule += "; rmsnorm_1p norm weights (w of x_hat * (1 + w)) decay"
    return rule


def build(name, spec):
    cfg = spec["config"]
    s = rm.resolve(cfg)
    layout = rm.tensor_layout(s)
    for attempt in range(100):
        seed = fixture_seed(name) + attempt
        gen = torch.Generator().manual_seed(seed)
        tokens = torch.randint(0, s["vocab"], (BATCH, SEQ), generator=gen, dtype=torch.int64)
        params, decay = init_params(layout, gen, spec.get("init_override"), s)
        rm.ROUTING_MARGIN[0] = float("inf")
        rm.CLAMP_STATS.update(gate_hi=0, gate_lo=0, up_hi=0, up_lo=0)
        loss, ce, logits, max_logit, grads = loss_grads(s, params, tokens)
        losses, final = train(s, params, decay, tokens)
        if not s.get("moe") or rm.ROUTING_MARGIN[0] > MIN_ROUTING_MARGIN:
            break
    else:
        raise AssertionError(f"{name}: no seed keeps the routing away from ties")
    assert abs(losses[0] - loss.item()) < 1e-12
    if s.get("router") == "gpt_oss":
        # Both clamps bind somewhere (gate above the limit, up beyond it on both sides), and some
        # gates lie below -limit, which the one-sided gate clamp must leave alone.
        cs = dict(rm.CLAMP_STATS)
        assert all(cs[k] > 0 for k in ("gate_hi", "gate_lo", "up_hi", "up_lo")), f"{name}: clamps do not bind: {cs}"

    f32 = lambda t: t.detach().to(torch.float32).contiguous().numpy()  # noqa: E731
    tensors = {"tokens": tokens.numpy(), "logits": f32(logits), "loss": f32(loss.reshape(1)),
               "ce": f32(ce.reshape(1)), "max_logit": f32(max_logit),
               "step_losses": f32(torch.tensor(losses, dtype=DT))}
    if s["rope"] is not None:
        tensors["inv_freq"] = f32(rm.rope_inv_freq(s))
    for n, _, _ in layout:
        tensors["param." + n] = f32(params[n])
        tensors["grad." + n] = f32(grads[n])
        tensors["step3." + n] = f32(final[n])
    metadata = {
        "format": "keel-reference", "format_version": FORMAT_VERSION, "fixture": name,
        "family": s["family"], "torch_version": torch.__version__, "compute_dtype": "float64",
        "stored_dtype": "F32", "batch": str(BATCH), "seq": str(SEQ), "seed": str(seed),
        "optimizer": "adamw", "lr": repr(LR), "beta1": repr(BETAS[0]), "beta2": repr(BETAS[1]),
        "adam_eps": repr(ADAM_EPS), "weight_decay": repr(WEIGHT_DECAY),
        "weight_decay_rule": weight_decay_rule(s),
        "max_grad_norm": repr(MAX_GRAD_NORM), "clip_eps": "1e-06", "steps": str(STEPS),
        "z_loss": repr(s["z_loss"]), "attn_softcap": repr(s["attn_softcap"]),
        "final_softcap": repr(s["final_softcap"]),
        "decay_params": ",".join(n for n, _, _ in layout if decay[n]),
        "config": json.dumps(cfg, sort_keys=True),
        "zero_grad_by_symmetry": json.dumps(zero_grad_by_symmetry(s)),
    }
    if s.get("router") == "gpt_oss":
        metadata["clamp_counts"] = json.dumps(dict(rm.CLAMP_STATS), sort_keys=True)
    if s.get("moe"):
        metadata["routing_margin"] = repr(rm.ROUTING_MARGIN[0])
        metadata["buffers"] = ",".join(n for n, _, _ in layout if is_buffer(n))
    return cfg, s, layout, params, tokens, grads, tensors, metadata, decay, final


def diagnostics(s, params, tokens, logits, max_logit):
    p = {k: v for k, v in params.items()}
    s2 = dict(s, final_softcap=0.0, attn_softcap=0.0)
    raw_logits, raw_ml = rm.forward(s2, p, tokens)
    return (f"max|logit| {raw_logits.abs().max().item():.2f} (stored {logits.abs().max().item():.2f}), "
            f"max attn logit {max_logit.max().item():.2f}")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default=os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                                                  "tests", "fixtures"))
    ap.add_argument("--only", nargs="*", help="fixture names (default: all)")
    ap.add_argument("--no-keel", action="store_true", help="skip the cross-check against keel inspect")
    args = ap.parse_args()
    torch.set_grad_enabled(True)

    inv = check_llama3_rope()
    print(f"llama3 rope inv_freq matches the hand computation: {[f'{x:.6g}' for x in inv]}")
    inv = check_yarn_rope()
    print(f"yarn rope inv_freq and MLA scale match the hand computation: {[f'{x:.6g}' for x in inv]}")
    inv, ramp = check_gpt_oss_yarn()
    print(f"gpt-oss yarn (truncate false, ramp {ramp[0]:.4f}..{ramp[1]:.4f}) matches the hand computation: "
          f"{[f'{x:.6g}' for x in inv]}")
    keel = None if args.no_keel else find_keel()

    names = args.only or list(FIXTURES)
    for name in names:
        cfg, s, layout, params, tokens, grads, tensors, metadata, decay, final = build(name, FIXTURES[name])
        gen = torch.Generator().manual_seed(fixture_seed(name) ^ 0x5EED)
        fd = check_finite_differences(name, s, {k: v.clone() for k, v in params.items()}, tokens, grads, gen)
        if s.get("router") in ("gpt_oss", "deepseek_v2"):
            check_moe_naive(name, s, params, gen)
        if "mla" in s:
            check_mla_attention_naive(name, s, params, tokens)
        elif s["family"] != "gpt2":
            check_attention_naive(name, s, params, tokens)
        if name == "llama":
            check_optimizer_against_torch(s, params, decay, tokens, final)
        d = os.path.join(args.out, name)
        os.makedirs(d, exist_ok=True)
        cpath = os.path.join(d, "config.json")
        with open(cpath, "w") as f:
            json.dump(cfg, f, indent=2)
            f.write("\n")
        path = os.path.join(d, "reference.safetensors")
        st.save_file(tensors, path, metadata)
        back, meta = st.load_file(path)
        assert meta == metadata and set(back) == set(tensors)
        for k, v in tensors.items():
            assert back[k].dtype == v.dtype and back[k].shape == v.shape and (back[k] == v).all(), k
        extra = ""
        if keel:
            got = check_against_keel(keel, cpath, s, layout)
            if isinstance(got, str):
                print(f"note: {name}: keel inspect does not know this config yet, skipped its cross-check ({got})")
            else:
                extra = f", keel inspect agrees ({got} params)"
        print(f"{name:22s} loss {tensors['loss'][0]:.5f} ce {tensors['ce'][0]:.5f} "
              f"steps {[round(float(x), 5) for x in tensors['step_losses']]} | "
              f"{diagnostics(s, params, tokens, torch.from_numpy(tensors['logits']), torch.from_numpy(tensors['max_logit']))} | "
              f"fd rel err {fd:.1e} | {os.path.getsize(path) // 1024} KiB{extra}")
    if keel is None and not args.no_keel:
        print("note: no keel binary found under build/; skipped the keel inspect cross-check")


if __name__ == "__main__":
    main()
