#include "keel/kernels/linear.hpp"

#include <algorithm>

#include "keel/kernels/gemm.hpp"
#include "keel/kernels/precision.hpp"

namespace keel::kernels {

// x: (n, in), w: (out, in) | (in, out), b: (out) -> y: (n, out)
void linear_forward(const float* x, const float* w, const float* b, float* y, int64_t n, int64_t in, int64_t out,
                    bool w_in_out, int64_t ldw) {
  if (ldw == 0) ldw = w_in_out ? out : in;
  // The bias goes in as each panel of y is finished (gemm_bias), not as a seed that the product
  // reads back: a write and a read of y fewer.
  if (w_in_out)
    gemm_mixed(false, false, n, out, in, 1.f, x, in, w, ldw, 0.f, y, out, b);
  else
    gemm_mixed(false, true, n, out, in, 1.f, x, in, w, ldw, 0.f, y, out, b);
  // bf16 mixed precision: the output is a bf16 activation, as a bf16 nn.Linear under
  // torch.autocast returns one (the bias is added in fp32 before the rounding).
  round_activation(y, n * out);
}

namespace {

// db += the column sums of dy: (n, out). Each thread owns a slice of columns and sums rows in
// order: no races, the same result for any thread count.
void add_column_sums(const float* dy, int64_t n, int64_t out, float* db) {
  constexpr int64_t kCols = 64;
  const int64_t slices = (out + kCols - 1) / kCols;
#pragma omp parallel for schedule(static)
  for (int64_t s = 0; s < slices; ++s) {
    const int64_t j0 = s * kCols, j1 = std::min(out, j0 + kCols);
    float acc[kCols] = {};
    for (int64_t i = 0; i < n; ++i) {
      const float* row = dy + i * out;
      for (int64_t j = j0; j < j1; ++j) acc[j - j0] += row[j];
    }
    for (int64_t j = j0; j < j1; ++j) db[j] += acc[j - j0];
  }
}

}  // namespace

// x: (n, in), dy: (n, out); accumulates dx: (n, in), dw: w's layout, db: (out)
void linear_backward(const float* x, const float* w, const float* dy, float* dx, float* dw, float* db, int64_t n,
                     int64_t in, int64_t out, bool w_in_out, int64_t ldw, GradWrite dx_write) {
  if (ldw == 0) ldw = w_in_out ? out : in;
  // Both products read dy: under native bf16 it is made bf16 words once for the two.
  const SharedBf16Operand shared_dy(dx != nullptr && dw != nullptr ? dy : nullptr, n, out);
  if (dx != nullptr) {
    const float beta = dx_write == GradWrite::Accumulate ? 1.f : 0.f;  // 0: C is never read
    if (w_in_out)
      gemm_mixed(false, true, n, in, out, 1.f, dy, out, w, ldw, beta, dx, in);  // dx += dy·Wᵀ, W: (in, out)
    else
      gemm_mixed(false, false, n, in, out, 1.f, dy, out, w, ldw, beta, dx, in);  // dx += dy·W, W: (out, in)
  }
  if (dw != nullptr) {
    if (w_in_out)
      gemm_mixed(true, false, in, out, n, 1.f, x, in, dy, out, 1.f, dw, ldw);  // dW += xᵀ·dy
    else
      gemm_mixed(true, false, out, in, n, 1.f, dy, out, x, in, 1.f, dw, ldw);  // dW += dyᵀ·x
  }
  if (db != nullptr) add_column_sums(dy, n, out, db);
}

void linear_backward_spent(const float* x, const float* w, float* dy, float* dx, float* dw, float* db, int64_t n,
                           int64_t in, int64_t out, bool w_in_out, int64_t ldw, GradWrite dx_write) {
  if (matmul_precision() == Precision::Bf16 && bf16_gemm_path() == Bf16GemmPath::Portable &&
      (dx != nullptr || dw != nullptr)) {
    if (db != nullptr) add_column_sums(dy, n, out, db);  // the fp32 values, as linear_backward sums them
    db = nullptr;
    round_to_bf16(dy, n * out);  // what every product would round it to
  }
  linear_backward(x, w, dy, dx, dw, db, n, in, out, w_in_out, ldw, dx_write);
}

}  // namespace keel::kernels
