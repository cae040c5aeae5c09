#!/usr/bin/env python3
"""Writes the seed corpus of fuzz/tokenizer_fuzz.cpp: a small tokenizer.json trained by keel's
train_bpe (`keel tokenizer train`), layout variants of it (GPT-2 ByteLevel regex, legacy merge
strings, added tokens with lstrip/rstrip/normalized, ignore_merges) and malformed ones that
must be rejected (each names one field). Compact JSON keeps the seeds small.
Usage: python3 fuzz/make_tokenizer_seeds.py KEEL_BINARY [OUT_DIR]  (default fuzz/corpus/tokenizer)"""
import copy
import json
import os
import subprocess
import sys
import tempfile

TEXT = """The cat sat on the mat. The cat ate the rat; the rat ran.
It's 2024 and they're training tokenizers: 12345 + 678 = 13023.
Les chats dorment. 猫は寝ている。 고양이가 잔다. Кошка спит.
def f(x):\n    return x * 2\n\n<|endoftext|>
"""


def main():
    keel = sys.argv[1]
    out = sys.argv[2] if len(sys.argv) > 2 else os.path.join(os.path.dirname(__file__), "corpus", "tokenizer")
    os.makedirs(out, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        text_path = os.path.join(tmp, "text.txt")
        with open(text_path, "w", encoding="utf-8") as f:
            f.write(TEXT * 3)
        tok_path = os.path.join(tmp, "tokenizer.json")
        subprocess.run([keel, "tokenizer", "train", "--text", text_path, "--vocab-size", "300", "--out", tok_path],
                       check=True, stdout=subprocess.DEVNULL)
        with open(tok_path, encoding="utf-8") as f:
            base = json.load(f)

    def write(name, doc):
        text = doc if isinstance(doc, str) else json.dumps(doc, ensure_ascii=False, separators=(",", ":"))
        with open(os.path.join(out, name), "w", encoding="utf-8") as f:
            f.write(text)

    def variant(change):
        doc = copy.deepcopy(base)
        change(doc)
        return doc

    write("trained_small.json", base)
    write("gpt2_byte_level.json", variant(lambda d: d.update(
        normalizer=None, pre_tokenizer={"type": "ByteLevel", "add_prefix_space": True, "use_regex": True})))
    write("legacy_merges.json", variant(lambda d: d["model"].update(
        merges=[f"{a} {b}" for a, b in d["model"]["merges"]])))
    write("ignore_merges.json", variant(lambda d: d["model"].update(ignore_merges=True)))

    def more_added(d):
        n = max(d["model"]["vocab"].values()) + 2
        d["added_tokens"] += [
            {"id": n, "content": "<think>", "special": False, "normalized": True, "lstrip": True, "rstrip": True},
            {"id": n + 1, "content": "é", "special": False, "normalized": True},
            {"id": n + 2, "content": "<|im_start|>", "special": True, "normalized": False},
        ]
    write("added_tokens.json", variant(more_added))
    write("llama3_regex.json", variant(lambda d: d["pre_tokenizer"]["pretokenizers"][0]["pattern"].update(
        Regex=r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")))

    write("bad_wordpiece.json", variant(lambda d: d["model"].update(type="WordPiece")))
    write("bad_missing_byte.json", variant(lambda d: d["model"]["vocab"].pop("Ġ")))
    write("bad_merge.json", variant(lambda d: d["model"]["merges"].append(["zz", "q"])))
    write("bad_regex.json", variant(lambda d: d["pre_tokenizer"]["pretokenizers"][0]["pattern"].update(
        Regex=r"[a-z]+|\s+")))
    write("bad_decoder.json", variant(lambda d: d.update(decoder={"type": "Metaspace"})))
    write("bad_truncated.json", json.dumps(base, ensure_ascii=False, separators=(",", ":"))[:700])


if __name__ == "__main__":
    main()
