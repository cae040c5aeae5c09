#!/usr/bin/env python3
"""Writes the seed corpus of fuzz/shard_fuzz.cpp: small valid keel token shards (docs/data.md)
at both token widths, with and without a document table, empty, and with odd token counts so
the padding before the table is exercised. An independent writer of the format: its files must
open in keel, and keel's writer must reproduce them byte for byte.
Usage: python3 fuzz/make_shard_seeds.py [OUT_DIR]  (default fuzz/corpus/shard)"""
import os
import struct
import sys


def crc32c(data):
    crc = 0xFFFFFFFF
    for byte in data:
        crc ^= byte
        for _ in range(8):
            crc = (crc >> 1) ^ (0x82F63B78 if crc & 1 else 0)
    return crc ^ 0xFFFFFFFF


def shard(tokens, starts, width, table=True):
    body = b"".join(struct.pack("<H" if width == 2 else "<I", t) for t in tokens)
    if table:
        body += b"\0" * ((-(64 + len(body))) % 8)
        body += b"".join(struct.pack("<Q", s) for s in starts)
    limit = max(tokens) + 1 if tokens else 0
    head = b"KEELTOK\0" + struct.pack("<IIQQII", 1, width, len(tokens), len(starts), 1 if table else 0, limit)
    head += struct.pack("<I", crc32c(body)) + b"\0" * 16
    head += struct.pack("<I", crc32c(head))
    assert len(head) == 64
    return head + body


def main():
    out = sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(__file__), "corpus", "shard")
    os.makedirs(out, exist_ok=True)
    seeds = {
        "empty.bin": shard([], [], 2),
        "u16_docs.bin": shard([5, 1, 65535, 0, 7], [0, 3], 2),
        "u16_even.bin": shard(list(range(100, 116)), [0, 4, 8, 12], 2),
        "u32_docs.bin": shard([70000, 1, 2, 2147483647, 3], [1, 4], 4),
        "u16_no_table.bin": shard([9, 8, 7], [0], 2, table=False),
        "u32_continued.bin": shard([1, 2, 3, 4, 5, 6, 7], [], 4),
    }
    for name, data in seeds.items():
        with open(os.path.join(out, name), "wb") as f:
            f.write(data)


if __name__ == "__main__":
    main()
