#pragma once
// Token embedding lookup, optionally scaled (keel.embed_scale: out = scale * table[id]).
#include <cstdint>

namespace keel::kernels {

// ids: (n) int32 in [0, vocab); table: (vocab, dim) -> out: (n, dim) = scale * rows, overwritten.
void embedding_forward(const int32_t* ids, const float* table, float* out, int64_t n, int64_t dim,
                       float scale = 1.0f);

// Accumulates dtable[ids[i]] += scale * dout[i]. Deterministic for any thread count (threads own
// column slices, rows are visited in order), so repeated ids need no atomics.
void embedding_backward(const int32_t* ids, const float* dout, float* dtable, int64_t n, int64_t dim,
                        float scale = 1.0f);

}  // namespace keel::kernels
