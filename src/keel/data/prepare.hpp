#pragma once
// `keel data prepare`: documents -> token shards + meta.json (layout in docs/data.md).
#include <cstdint>
#include <string>
#include <vector>

#include "keel/data/documents.hpp"
#include "keel/data/shards.hpp"
#include "keel/data/tokenizer.hpp"

namespace keel::data {

struct PrepareStats {
  int64_t documents_train = 0, documents_val = 0, tokens_train = 0, tokens_val = 0;
  int64_t shards_train = 0, shards_val = 0;
  int token_bytes = 2;
  int64_t vocab_size_hint = 0;  // max token id + 1
};

// The split rule: a document goes to val when a hash of its name (seed 0) falls below
// val_fraction, so a document keeps its side however the others change. Documents with an
// empty name are hashed as "#<index>".
bool goes_to_val(const std::string& name, double val_fraction);

// Tokenizes each document (the tokenizer's end-of-text id appended when it has one), assigns
// whole documents to train or val with goes_to_val, and writes OUT_DIR/train_00000.bin ...,
// OUT_DIR/val_00000.bin ... (at most shard_tokens tokens each; a document may continue into the
// next shard) and finally OUT_DIR/meta.json, every file atomically. OUT_DIR is created if
// needed and must not already hold a dataset. tokenizer_path, when given, is recorded in
// meta.json with the SHA-256 of its bytes (otherwise the hash is of tok.to_json()).
PrepareStats prepare_dataset(const std::vector<Document>& docs, const Tokenizer& tok, const std::string& out_dir,
                             double val_fraction, int64_t shard_tokens = int64_t{1} << 24,
                             const std::string& tokenizer_path = "");

}  // namespace keel::data
