#pragma once
// Byte-level BPE tokenizers in the Hugging Face tokenizer.json format (GPT-2, Qwen, Llama 3 and
// the like), and training new ones. Encoding follows the HF pipeline step by step:
//   added tokens split out of the raw text -> normalizer (NFC or none) -> pre-tokenizer (the
//   Split regex of the GPT-2/GPT-4 family, then ByteLevel) -> BPE merges by rank -> ids.
// Decoding maps ids back to their bytes (the ByteLevel decoder). docs/tokenizer.md says what is
// supported and how the implementation was checked against the reference.
//
// A Tokenizer is immutable after loading: copies share state, and encode/decode may run on many
// threads at once.
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace keel::data {

class Tokenizer {
 public:
  // Reads an HF tokenizer.json whose model is BPE and whose pre-tokenizer and decoder are
  // byte-level. Anything else, or a malformed file: keel::Error(path, field, reason).
  static Tokenizer load(const std::string& path);
  // The same from the text of a tokenizer.json; `origin` names it in errors.
  static Tokenizer parse(std::string_view json_text, const std::string& origin = "<tokenizer.json>");

  // No special tokens are added; added and special tokens written in the text map to their ids.
  // Any bytes are accepted: invalid UTF-8 is encoded byte by byte, so decode(encode(x)) == x.
  std::vector<int32_t> encode(std::string_view text) const;
  // The bytes of the tokens, concatenated (not repaired into valid UTF-8: a cut in the middle of
  // a character stays cut). An id outside the vocabulary: keel::Error(<the tokenizer's file>, "ids",
  // reason).
  std::string decode(std::span<const int32_t> ids) const;

  int64_t vocab_size() const;  // max id + 1 over the model vocab and the added tokens
  // The id of a token written as in tokenizer.json (byte-level form, e.g. "Ġthe"), or of an
  // added token by its content.
  std::optional<int32_t> token_id(std::string_view token) const;
  // The end-of-text token: the first of <|endoftext|>, <|end_of_text|>, </s>, <eos> present.
  std::optional<int32_t> eos_id() const;
  bool is_special(int32_t id) const;  // an added token marked "special"

  // HF-format tokenizer.json, loadable by keel and by HF tokenizers.
  std::string to_json() const;
  // Writes to_json() atomically (temp file, fsync, rename); keel::Error(path, "", reason).
  void save(const std::string& path) const;

  struct Impl;

 private:
  explicit Tokenizer(std::shared_ptr<const Impl> impl) : impl_(std::move(impl)) {}
  std::shared_ptr<const Impl> impl_;
};

// Byte-level BPE training: the GPT-2 byte alphabet (ids 0-255 in byte order), NFC, the Qwen /
// GPT-4-style pre-tokenizer regex, then merges of the most frequent adjacent pair, ties broken
// by the smaller (left id, right id), until vocab_size is reached or no pair occurs twice.
// Special tokens are never split or merged into; they take the last ids. Deterministic: the same
// texts give the same tokenizer. vocab_size < 256 + special tokens, an empty or repeated special
// token: keel::Error(source, "vocab_size" / "special_tokens", reason), `source` naming where the
// settings came from (the tokenizer being written, a test).
Tokenizer train_bpe(const std::string& source, const std::vector<std::string>& texts, int64_t vocab_size,
                    const std::vector<std::string>& special_tokens = {"<|endoftext|>"});

}  // namespace keel::data
