#include "keel/nn/packed_activations.hpp"

#include <algorithm>
#include <cstring>
#include <limits>

#include "keel/core/error.hpp"
#include "keel/core/stage_timer.hpp"

namespace keel::nn {

namespace {

// The recorded tensors that lie wholly inside [begin, end), sorted, overlapping or touching ones
// merged (a module may round a tensor in slices, per expert say, or round the same one twice).
std::vector<kernels::FloatSpan> inside(std::vector<kernels::FloatSpan> spans, const float* begin, const float* end) {
  std::erase_if(spans, [&](const auto& s) { return s.data < begin || s.data + s.count > end; });
  std::sort(spans.begin(), spans.end(), [](const auto& a, const auto& b) { return a.data < b.data; });
  std::vector<kernels::FloatSpan> out;
  for (const auto& s : spans) {
    if (!out.empty() && s.data <= out.back().data + out.back().count) {
      float* stop = std::max(out.back().data + out.back().count, s.data + s.count);
      out.back().count = stop - out.back().data;
    } else {
      out.push_back(s);
    }
  }
  return out;
}

// One piece between its place in the forward's layout (`from`) and in the compacted one (`to`,
// never above `from`), in the waves of piece_waves. A dropped piece (nothing stored) does not move.
template <bool Pack, class P>
void move_piece(char* base, const P& p) {
  if (p.stored == 0 || p.count == 0) return;
  KEEL_CHECK(p.to <= p.from);
  const size_t elem = p.stored;
  const bool bf16 = elem == sizeof(uint16_t);
  auto run = [&](int64_t i0, int64_t i1) {
    char* wide = base + p.from + static_cast<size_t>(i0) * sizeof(float);
    char* narrow = base + p.to + static_cast<size_t>(i0) * elem;
    const int64_t m = i1 - i0;
    if (bf16 && Pack) kernels::pack_bf16(reinterpret_cast<const float*>(wide), reinterpret_cast<uint16_t*>(narrow), m);
    if (bf16 && !Pack) kernels::unpack_bf16(reinterpret_cast<const uint16_t*>(narrow), reinterpret_cast<float*>(wide), m);
    if (!bf16 && Pack) std::memmove(narrow, wide, static_cast<size_t>(m) * sizeof(float));
    if (!bf16 && !Pack) std::memmove(wide, narrow, static_cast<size_t>(m) * sizeof(float));
  };
  const int64_t gap = static_cast<int64_t>(p.from - p.to);
  if (gap == 0 && !bf16) return;  // an fp32 piece already in place
  constexpr int64_t kSlice = detail::kWaveSlice;
  for (const detail::Wave& w : detail::piece_waves(Pack, p.count, gap, elem)) {
    if (!w.split) {
      run(w.begin, w.end);
      continue;
    }
    const int64_t slices = (w.end - w.begin + kSlice - 1) / kSlice;
#pragma omp parallel for schedule(static)
    for (int64_t k = 0; k < slices; ++k) run(w.begin + k * kSlice, std::min(w.end, w.begin + (k + 1) * kSlice));
  }
}

}  // namespace

namespace detail {

// Where the two places overlap (the first pieces of a stretch: the gap grows by half of every
// bf16 piece before), values still to be read lie where others are to be written, so the piece
// moves in waves: all of a wave's values are read before any write of the wave can reach them,
// and the waves run in the order that reads every value before it is overwritten (packing front
// to back, expanding back to front). Inside a wave the team splits the work. With a gap of G
// bytes, a wave of bf16 values [c0, c1) may move at once when to + 2·c1 <= from + 4·c0, i.e.
// c1 <= 2·c0 + G/2: waves double in length, so a piece takes a few of them. fp32 pieces (a
// plain shift down by G) move in waves of G/4 values. One thread moving such a piece in order is
// always safe (pack_bf16, unpack_bf16, memmove): a wave too short to split runs that way.
// Measured before waves (Zen 5, qwen3_large bf16): 70% of a stretch's bytes moved on one thread.
std::vector<Wave> piece_waves(bool pack, int64_t count, int64_t gap, size_t elem) {
  const bool bf16 = elem == sizeof(uint16_t);
  // The longest wave starting at (packing) or ending at (expanding) value c.
  auto wave_after = [&](int64_t c0) { return bf16 ? 2 * c0 + gap / 2 : c0 + gap / 4; };
  auto wave_before = [&](int64_t c1) { return std::max<int64_t>(0, bf16 ? (c1 - gap / 2 + 1) / 2 : c1 - gap / 4); };
  constexpr int64_t kMinSplit = 2 * kWaveSlice;
  std::vector<Wave> waves;
  if (pack) {
    for (int64_t c = 0; c < count;) {
      const int64_t end = std::min(count, wave_after(c));
      if (end - c < kMinSplit) {
        const int64_t stop = std::min(count, c + kMinSplit);  // end is below it
        waves.push_back({c, stop, false});
        c = stop;
      } else {
        waves.push_back({c, end, true});
        c = end;
      }
    }
  } else {
    for (int64_t c = count; c > 0;) {
      const int64_t start = wave_before(c);
      if (c - start < kMinSplit) {
        const int64_t stop = std::max<int64_t>(0, c - kMinSplit);
        waves.push_back({stop, c, false});
        c = stop;
      } else {
        waves.push_back({start, c, true});
        c = start;
      }
    }
  }
  return waves;
}

}  // namespace detail

std::optional<Bf16Activations> parse_bf16_activations(std::string_view name) {
  if (name == "fp32") return Bf16Activations::Fp32;
  if (name == "packed") return Bf16Activations::Packed;
  if (name == "all") return Bf16Activations::All;
  return std::nullopt;
}

std::string_view bf16_activations_name(Bf16Activations a) {
  switch (a) {
    case Bf16Activations::Fp32: return "fp32";
    case Bf16Activations::Packed: return "packed";
    case Bf16Activations::All: return "all";
  }
  return "packed";
}

void PackedActivations::start(size_t blocks) {
  spans_.assign(blocks, {});
  unused_.assign(blocks, {});
  stretches_.assign(blocks, {});
  reach_ = nullptr;
  packed_fp32_bytes_ = dropped_bytes_ = compacted_bytes_ = 0;
}

std::vector<kernels::FloatSpan>* PackedActivations::capture(size_t block) { return &spans_[block]; }
std::vector<kernels::FloatSpan>* PackedActivations::unused(size_t block) { return &unused_[block]; }

void PackedActivations::pack(size_t block, Arena& arena, const Arena::Mark& since) {
  stage_timer::Scope stage_scope(stage_timer::Stage::Packing);
  std::vector<kernels::FloatSpan> spans = std::move(spans_[block]), unused = std::move(unused_[block]);
  spans_[block].clear();
  unused_[block].clear();
  float* end = arena.top();
  if (!arena.contiguous_since(since)) {
    // Not one run of memory: nothing moves, but what packing would have rounded is rounded in
    // place (a no-op for bf16 values; the residual copies of bf16_activations = "all"), so the
    // backward reads the same values whatever the arena's layout (a first step, a resume).
    for (const kernels::FloatSpan& sp : spans) {
      const bool dropped = std::any_of(unused.begin(), unused.end(), [&](const auto& u) {
        return sp.data < u.data + u.count && u.data < sp.data + sp.count;
      });
      if (!dropped) kernels::round_to_bf16(sp.data, sp.count);
    }
    return;
  }
  arena.release(since);
  float* begin = arena.top();
  Stretch st;
  st.base = reinterpret_cast<char*>(begin);
  st.bytes = static_cast<size_t>(end - begin) * sizeof(float);
  const std::vector<kernels::FloatSpan> rounded = inside(std::move(spans), begin, end);
  const std::vector<kernels::FloatSpan> dropped = inside(std::move(unused), begin, end);
  // Pieces in address order: between two consecutive span ends the stretch is wholly unused
  // (dropped, even where it was rounded too), wholly a bf16 tensor, or wholly something else.
  std::vector<const float*> cuts = {begin, end};
  for (const auto* list : {&rounded, &dropped}) {
    for (const auto& sp : *list) {
      cuts.push_back(sp.data);
      cuts.push_back(sp.data + sp.count);
    }
  }
  std::sort(cuts.begin(), cuts.end());
  cuts.erase(std::unique(cuts.begin(), cuts.end()), cuts.end());
  size_t to = 0, r = 0, d = 0;
  for (size_t c = 0; c + 1 < cuts.size(); ++c) {
    const float* at = cuts[c];
    const int64_t count = cuts[c + 1] - at;
    while (r < rounded.size() && rounded[r].data + rounded[r].count <= at) ++r;
    while (d < dropped.size() && dropped[d].data + dropped[d].count <= at) ++d;
    const size_t stored = d < dropped.size() && dropped[d].data <= at   ? 0
                          : r < rounded.size() && rounded[r].data <= at ? sizeof(uint16_t)
                                                                        : sizeof(float);
    const size_t bytes = static_cast<size_t>(count) * sizeof(float);
    if (stored == sizeof(uint16_t)) packed_fp32_bytes_ += bytes;
    if (stored == 0) dropped_bytes_ += bytes;
    if (!st.pieces.empty() && st.pieces.back().stored == stored) {
      st.pieces.back().count += count;  // the same kind again, right after the last piece
    } else {
      st.pieces.push_back({static_cast<size_t>(reinterpret_cast<const char*>(at) - st.base), to, count, stored});
    }
    to += static_cast<size_t>(count) * stored;
  }
  // Front to back: each piece moves down (to <= from), never onto a piece not yet moved.
  for (const Piece& p : st.pieces) move_piece<true>(st.base, p);
  compacted_bytes_ += to;
  // Stretches in an older arena block need no reserve: nothing is allocated there any more.
  reach_ = reach_block_ == since.blocks ? std::max<const char*>(reach_, st.base + st.bytes) : st.base + st.bytes;
  reach_block_ = since.blocks;
  arena.alloc((to + sizeof(float) - 1) / sizeof(float));  // the compacted copy; the next block follows
  stretches_[block] = std::move(st);
}

void PackedActivations::reserve(Arena& arena) const {
  if (reach_ != nullptr) arena.advance_to(reinterpret_cast<const float*>(reach_));
}

void PackedActivations::unpack(size_t block) {
  stage_timer::Scope stage_scope(stage_timer::Stage::Packing);
  Stretch& st = stretches_[block];
  // Back to front: each piece moves up (from >= to), never onto a piece not yet moved.
  for (auto p = st.pieces.rbegin(); p != st.pieces.rend(); ++p) move_piece<false>(st.base, *p);
  // Dropped tensors come back as NaN, not as whatever lay there: a tensor declared unused that
  // the backward does read poisons the gradients at once (about 0.3% of a step).
  for (const Piece& p : st.pieces) {
    if (p.stored != 0) continue;
    float* x = reinterpret_cast<float*>(st.base + p.from);
    constexpr int64_t kSlice = 1 << 16;
    const int64_t slices = (p.count + kSlice - 1) / kSlice;
#pragma omp parallel for schedule(static) if (slices > 1)
    for (int64_t k = 0; k < slices; ++k)
      std::fill(x + k * kSlice, x + std::min(p.count, (k + 1) * kSlice), std::numeric_limits<float>::quiet_NaN());
  }
  st = Stretch{};
}

}  // namespace keel::nn
