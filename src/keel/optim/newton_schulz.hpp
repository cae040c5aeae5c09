#pragma once
// Quintic Newton–Schulz orthogonalization, the core of Muon (Keller Jordan, KellerJordan/Muon
// `zeropower_via_newtonschulz5`; Moonlight arXiv:2502.16982 eq. 2). For G = U S Vᵀ it returns
// approximately U S' Vᵀ with S' roughly in [0.5, 1.5]: the coefficients maximise the slope at 0
// rather than converge to exactly U Vᵀ, which KJ reports does not hurt training.
//
// keel computes it in fp32; the reference runs it in bf16. Same iteration, fewer rounding errors.
#include <cstdint>

namespace keel::optim {

inline constexpr float kNewtonSchulzA = 3.4445f;
inline constexpr float kNewtonSchulzB = -4.7750f;
inline constexpr float kNewtonSchulzC = 2.0315f;
inline constexpr float kNewtonSchulzEps = 1e-7f;  // X / (‖X‖_F + eps)
inline constexpr int kNewtonSchulzSteps = 5;

// Floats of scratch newton_schulz5 needs for a (rows, cols) matrix: 2·r·c + 2·r² with r = min.
int64_t newton_schulz_workspace_floats(int64_t rows, int64_t cols);

// g, out: (rows, cols) row-major; out may not alias g. workspace: newton_schulz_workspace_floats.
// Tall matrices are transposed first so the Gram matrix X Xᵀ is the small one (min(rows, cols)²).
// Each step: A = X Xᵀ, B = b·A + c·A², X ← a·X + B·X (three GEMMs through kernels::gemm).
void newton_schulz5(const float* g, float* out, int64_t rows, int64_t cols, float* workspace,
                    int steps = kNewtonSchulzSteps);

}  // namespace keel::optim
