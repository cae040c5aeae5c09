#!/usr/bin/env python3
"""Writes a Hugging Face model folder with random weights in the exact layout a published Qwen3
checkpoint has: config.json (copied), bf16 tensors under HF's names split into shards with a
model.safetensors.index.json, lm_head.weight stored although the head is tied (as Qwen3-0.6B's
checkpoint does), generation_config.json and tokenizer.json.

Written independently of keel's exporter (only torch and the safetensors format spec), so a
fine-tune that starts from it tests keel's importer against another writer.

Usage: make_synthetic_hf_checkpoint.py CONFIG.json TOKENIZER.json OUT_DIR [--shards N] [--seed S]
"""
import argparse
import json
import os
import struct

import torch


def qwen3_tensors(c):
    """(name, shape) in the order HF's Qwen3ForCausalLM.state_dict() lists them."""
    h, i = c["hidden_size"], c["intermediate_size"]
    hd = c.get("head_dim", h // c["num_attention_heads"])
    q, kv = c["num_attention_heads"] * hd, c["num_key_value_heads"] * hd
    out = [("model.embed_tokens.weight", (c["vocab_size"], h))]
    for l in range(c["num_hidden_layers"]):
        p = f"model.layers.{l}."
        out += [
            (p + "self_attn.q_proj.weight", (q, h)),
            (p + "self_attn.k_proj.weight", (kv, h)),
            (p + "self_attn.v_proj.weight", (kv, h)),
            (p + "self_attn.o_proj.weight", (h, q)),
            (p + "self_attn.q_norm.weight", (hd,)),
            (p + "self_attn.k_norm.weight", (hd,)),
            (p + "mlp.gate_proj.weight", (i, h)),
            (p + "mlp.up_proj.weight", (i, h)),
            (p + "mlp.down_proj.weight", (h, i)),
            (p + "input_layernorm.weight", (h,)),
            (p + "post_attention_layernorm.weight", (h,)),
        ]
    out.append(("model.norm.weight", (h,)))
    return out


def write_safetensors(path, tensors):
    """tensors: list of (name, bf16 torch tensor). The format: u64 header size, JSON, bytes."""
    header, offset, blobs = {}, 0, []
    for name, t in tensors:
        raw = t.contiguous().view(torch.int16).numpy().tobytes()
        header[name] = {"dtype": "BF16", "shape": list(t.shape), "data_offsets": [offset, offset + len(raw)]}
        offset += len(raw)
        blobs.append(raw)
    header["__metadata__"] = {"format": "pt"}
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    tmp = path + ".tmp"
    with open(tmp, "wb") as f:
        f.write(struct.pack("<Q", len(text)))
        f.write(text)
        for b in blobs:
            f.write(b)
    os.replace(tmp, path)
    return offset


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("config")
    ap.add_argument("tokenizer")
    ap.add_argument("out")
    ap.add_argument("--shards", type=int, default=2)
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args()
    with open(a.config) as f:
        config = json.load(f)
    if config.get("model_type") != "qwen3":
        raise SystemExit(f"{a.config}: model_type must be qwen3")
    os.makedirs(a.out, exist_ok=True)
    gen = torch.Generator().manual_seed(a.seed)
    std = config.get("initializer_range", 0.02)
    tensors = []
    for name, shape in qwen3_tensors(config):
        if len(shape) == 1:  # norm gains: ones, jittered so a wrong mapping shows
            t = 1.0 + 0.01 * torch.randn(shape, generator=gen)
        else:
            t = std * torch.randn(shape, generator=gen)
        tensors.append((name, t.to(torch.bfloat16)))
    if config.get("tie_word_embeddings"):
        tensors.append(("lm_head.weight", tensors[0][1].clone()))
    else:
        tensors.append(("lm_head.weight", (std * torch.randn(tensors[0][1].shape, generator=gen)).to(torch.bfloat16)))

    # Shards of about equal size, in order.
    total = sum(t.numel() * 2 for _, t in tensors)
    per_shard = total / a.shards
    groups, size = [[]], 0
    for name, t in tensors:
        if groups[-1] and size + t.numel() * 2 > per_shard * 1.0001 and len(groups) < a.shards:
            groups.append([])
            size = 0
        groups[-1].append((name, t))
        size += t.numel() * 2
    weight_map = {}
    for k, group in enumerate(groups):
        file = f"model-{k + 1:05d}-of-{len(groups):05d}.safetensors"
        write_safetensors(os.path.join(a.out, file), group)
        for name, _ in group:
            weight_map[name] = file
    with open(os.path.join(a.out, "model.safetensors.index.json"), "w") as f:
        json.dump({"metadata": {"total_size": total}, "weight_map": weight_map}, f, indent=2)
    with open(os.path.join(a.out, "config.json"), "w") as f:
        json.dump(config, f, indent=2)
    with open(os.path.join(a.out, "generation_config.json"), "w") as f:
        json.dump({"bos_token_id": config.get("bos_token_id"), "eos_token_id": [151645, 151643],
                   "do_sample": True, "temperature": 0.6, "top_k": 20, "top_p": 0.95}, f, indent=2)
    with open(a.tokenizer, "rb") as src, open(os.path.join(a.out, "tokenizer.json"), "wb") as dst:
        dst.write(src.read())
    print(f"wrote {a.out}: {sum(t.numel() for _, t in tensors):,} values in {len(groups)} bf16 shards ({total / 1e9:.2f} GB)")


if __name__ == "__main__":
    main()
