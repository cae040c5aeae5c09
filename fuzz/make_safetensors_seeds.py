#!/usr/bin/env python3
"""Writes the seed corpus of fuzz/safetensors_fuzz.cpp: small valid safetensors files that
reach every dtype, metadata, scalars, empty tensors and header padding. Byte-exact to the
format spec (8-byte little-endian header size, JSON header, data), no torch needed.
Usage: python3 fuzz/make_safetensors_seeds.py [OUT_DIR]  (default fuzz/corpus/safetensors)"""
import json
import os
import struct
import sys


def write(path, tensors, metadata=None, pad_to=1, sort_names=False):
    """tensors: list of (name, dtype, shape, raw bytes), laid out in order."""
    header, offset, data = {}, 0, b""
    if metadata is not None:
        header["__metadata__"] = metadata
    for name, dtype, shape, raw in tensors:
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [offset, offset + len(raw)]}
        offset += len(raw)
        data += raw
    if sort_names:  # HF's writer lists names sorted
        header = dict(sorted(header.items()))
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * ((-(8 + len(text))) % pad_to)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)) + text + data)


def main():
    out = sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(__file__), "corpus", "safetensors")
    os.makedirs(out, exist_ok=True)
    f32 = lambda *v: struct.pack(f"<{len(v)}f", *v)
    bf16 = lambda *v: b"".join(struct.pack("<f", x)[2:] for x in v)  # truncation; exact for these values
    f16 = lambda *v: struct.pack(f"<{len(v)}e", *v)
    i32 = lambda *v: struct.pack(f"<{len(v)}i", *v)
    i64 = lambda *v: struct.pack(f"<{len(v)}q", *v)

    write(os.path.join(out, "f32_metadata.safetensors"),
          [("weight", "F32", [2, 2], f32(1.0, -2.0, 0.5, 3.25))], metadata={"format": "pt"}, pad_to=8)
    write(os.path.join(out, "all_dtypes.safetensors"),
          [("a.bf16", "BF16", [3], bf16(1.0, -0.5, float("inf"))),
           ("b.f16", "F16", [2, 1], f16(1.0, -65504.0)),
           ("c.i32", "I32", [2], i32(-1, 2**31 - 1)),
           ("d.i64", "I64", [1], i64(-(2**63))),
           ("e.scalar", "F32", [], f32(7.0)),
           ("f.empty", "BF16", [0, 4], b"")], pad_to=8)
    write(os.path.join(out, "hf_sorted.safetensors"),
          [("model.norm.weight", "BF16", [4], bf16(1, 1, 1, 1)),
           ("model.embed_tokens.weight", "BF16", [2, 4], bf16(*range(8))),
           ("lm_head.weight", "F32", [2, 2], f32(0.25, 0.5, 0.75, 1.0))],
          metadata={"format": "pt", "step": "10"}, sort_names=True, pad_to=8)
    write(os.path.join(out, "unpadded.safetensors"),
          [("x", "F16", [3], f16(0.1, 0.2, 0.3)), ("y", "I64", [2], i64(5, 6))])
    write(os.path.join(out, "no_tensors.safetensors"), [], metadata={})


if __name__ == "__main__":
    main()
