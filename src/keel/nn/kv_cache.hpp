#pragma once
// What incremental decoding keeps between calls. A KvCache holds one layer's rows, one per
// token: keys and values of standard attention (after QK-Norm and RoPE), or MLA's compressed
// latent with the shared rotary key, [c_KV (kv_lora_rank) | k^R (qk_rope_head_dim)], from which
// the absorbed projections read both keys and values (values_in_keys). A DecodeState is the
// whole model's: a cache per layer, the tokens cached, and the scratch arena of the incremental
// forward (TransformerModel::forward_incremental).
#include <algorithm>
#include <cstdint>
#include <cstring>
#include <vector>

#include "keel/core/arena.hpp"
#include "keel/core/error.hpp"

namespace keel::nn {

class KvCache {
 public:
  KvCache() = default;
  // value_width 0: the values are read from the key rows (MLA's latent). window > 0: a
  // sliding-window layer, whose queries never look further back than window - 1 positions, so
  // the cache drops older rows and stays below 2·window rows (plus one call's new rows).
  KvCache(int64_t key_width, int64_t value_width, int64_t max_rows, int64_t window = 0)
      : key_width_(key_width), value_width_(value_width), max_rows_(max_rows), window_(window) {}

  // Appends n rows (values ignored when value_width is 0). Grows by doubling, so a short
  // generation never allocates the whole context. A windowed cache first drops all but the
  // newest window - 1 rows once it holds 2·window: the new queries see no older key.
  // key_stride / value_stride: floats between the source rows (0: dense, the row width).
  void append(const float* keys, const float* values, int64_t n, int64_t key_stride = 0, int64_t value_stride = 0) {
    if (window_ > 0 && rows_ + n > 2 * window_ && rows_ > window_ - 1) drop_oldest(rows_ - (window_ - 1));
    KEEL_CHECK(rows_ + n <= max_rows_);
    copy_rows(keys_, keys, n, key_width_, key_stride > 0 ? key_stride : key_width_);
    if (value_width_ > 0) copy_rows(values_, values, n, value_width_, value_stride > 0 ? value_stride : value_width_);
    rows_ += n;
  }
  void clear() {
    rows_ = 0;
    dropped_ = 0;
  }

  const float* keys() const { return keys_.data(); }
  const float* values() const { return value_width_ > 0 ? values_.data() : keys_.data(); }
  int64_t rows() const { return rows_; }
  // Tokens this cache has seen: the position of the next one (rows() + the rows dropped).
  int64_t positions() const { return dropped_ + rows_; }
  int64_t window() const { return window_; }
  int64_t key_width() const { return key_width_; }
  int64_t value_width() const { return value_width_; }
  // Floats one token adds to this layer's cache.
  int64_t floats_per_token() const { return key_width_ + value_width_; }

 private:
  void reserve(std::vector<float>& buf, int64_t rows, int64_t width) const {
    const size_t need = static_cast<size_t>(rows * width);
    if (buf.size() >= need) return;
    const int64_t have = static_cast<int64_t>(buf.size()) / std::max<int64_t>(width, 1);
    const int64_t grown = std::min(max_rows_, std::max({rows, 2 * have, int64_t{16}}));
    buf.resize(static_cast<size_t>(grown * width));
  }

  void copy_rows(std::vector<float>& buf, const float* src, int64_t n, int64_t width, int64_t stride) {
    KEEL_CHECK(src != nullptr);
    reserve(buf, rows_ + n, width);
    float* dst = buf.data() + rows_ * width;
    if (stride == width) {
      std::memcpy(dst, src, sizeof(float) * static_cast<size_t>(n * width));
      return;
    }
    for (int64_t r = 0; r < n; ++r) std::memcpy(dst + r * width, src + r * stride, sizeof(float) * static_cast<size_t>(width));
  }

  void drop_oldest(int64_t n) {
    auto shift = [&](std::vector<float>& buf, int64_t width) {
      std::memmove(buf.data(), buf.data() + n * width, sizeof(float) * static_cast<size_t>((rows_ - n) * width));
    };
    shift(keys_, key_width_);
    if (value_width_ > 0) shift(values_, value_width_);
    rows_ -= n;
    dropped_ += n;
  }

  int64_t key_width_ = 0, value_width_ = 0, max_rows_ = 0, window_ = 0, rows_ = 0, dropped_ = 0;
  std::vector<float> keys_, values_;
};

struct DecodeState {
  std::vector<KvCache> layers;
  int64_t length = 0;  // tokens cached (the position of the next token)
  Arena arena;         // scratch of one incremental call, reset at its start
  // Empties every cache for a new sequence, keeping the memory already grown.
  void clear() {
    for (KvCache& c : layers) c.clear();
    length = 0;
  }
  // Bytes one token adds over all layers (fp32).
  int64_t bytes_per_token() const {
    int64_t floats = 0;
    for (const KvCache& c : layers) floats += c.floats_per_token();
    return floats * static_cast<int64_t>(sizeof(float));
  }
};

}  // namespace keel::nn
