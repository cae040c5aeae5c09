#include "keel/kernels/router.hpp"

#include <algorithm>
#include <cmath>
#include <vector>

namespace keel::kernels {

namespace {

// The k largest of v (E) into out, decreasing; ties to the lower index. taken: (E) scratch.
void top_k(const float* v, int64_t e_count, int64_t k, int32_t* out, std::vector<char>& taken) {
  std::fill(taken.begin(), taken.end(), 0);
  for (int64_t j = 0; j < k; ++j) {
    int64_t best = -1;
    for (int64_t e = 0; e < e_count; ++e) {
      if (!taken[static_cast<size_t>(e)] && (best < 0 || v[e] > v[best])) best = e;
    }
    taken[static_cast<size_t>(best)] = 1;
    out[j] = static_cast<int32_t>(best);
  }
}

// Sigmoid routers' choice: (s + bias), restricted to the topk_group groups with the largest sum
// of their two best choices (HF DeepseekV3TopkRouter.get_topk_indices).
void grouped_choice(const RouterConfig& c, const float* s, const float* bias, float* choice, std::vector<float>& group,
                    std::vector<int32_t>& keep, std::vector<char>& taken) {
  const int64_t E = c.experts, per = E / c.n_group;
  for (int64_t e = 0; e < E; ++e) choice[e] = s[e] + (bias ? bias[e] : 0.0f);
  if (c.n_group <= 1 || c.topk_group >= c.n_group) return;
  for (int64_t g = 0; g < c.n_group; ++g) {
    const float* v = choice + g * per;
    float a = -INFINITY, b = -INFINITY;  // best and second best of the group
    for (int64_t i = 0; i < per; ++i) {
      if (v[i] > a) {
        b = a;
        a = v[i];
      } else if (v[i] > b) {
        b = v[i];
      }
    }
    group[static_cast<size_t>(g)] = per >= 2 ? a + b : a;
  }
  std::vector<char> group_taken(static_cast<size_t>(c.n_group));
  top_k(group.data(), c.n_group, c.topk_group, keep.data(), group_taken);
  std::fill(taken.begin(), taken.end(), 0);
  for (int64_t j = 0; j < c.topk_group; ++j) {
    for (int64_t i = 0; i < per; ++i) taken[static_cast<size_t>(keep[static_cast<size_t>(j)] * per + i)] = 1;
  }
  // HF fills the other groups with 0.0 (not -inf); with sigmoid scores and a small bias they lose.
  for (int64_t e = 0; e < E; ++e) {
    if (!taken[static_cast<size_t>(e)]) choice[e] = 0.0f;
  }
}

// DeepSeek-V2's group_limited_greedy: groups ranked by their best probability
// (HF DeepseekV2Moe: probs.view(n, n_group, -1).max(-1)), the others' experts set to 0.0.
void softmax_group_choice(const RouterConfig& c, const float* p, float* choice, std::vector<float>& group,
                          std::vector<int32_t>& keep, std::vector<char>& taken) {
  const int64_t E = c.experts, per = E / c.n_group;
  for (int64_t g = 0; g < c.n_group; ++g) group[static_cast<size_t>(g)] = *std::max_element(p + g * per, p + (g + 1) * per);
  std::vector<char> group_taken(static_cast<size_t>(c.n_group));
  top_k(group.data(), c.n_group, c.topk_group, keep.data(), group_taken);
  std::fill(taken.begin(), taken.end(), 0);
  for (int64_t j = 0; j < c.topk_group; ++j) {
    for (int64_t i = 0; i < per; ++i) taken[static_cast<size_t>(keep[static_cast<size_t>(j)] * per + i)] = 1;
  }
  for (int64_t e = 0; e < E; ++e) choice[e] = taken[static_cast<size_t>(e)] ? p[e] : 0.0f;
}

}  // namespace

// logits: (n, E) -> probs: (n, E), indices: (n, k), weights: (n, k)
void router_forward(const RouterConfig& c, const float* logits, const float* bias, float* probs, int32_t* indices,
                    float* weights, int64_t n) {
  const int64_t E = c.experts, k = c.top_k;
#pragma omp parallel
  {
    std::vector<char> taken(static_cast<size_t>(E));
    std::vector<float> choice(static_cast<size_t>(E)), group(static_cast<size_t>(c.n_group));
    std::vector<int32_t> keep(static_cast<size_t>(c.n_group));
#pragma omp for schedule(static)
    for (int64_t t = 0; t < n; ++t) {
      const float* z = logits + t * E;
      float* p = probs + t * E;
      int32_t* idx = indices + t * k;
      float* w = weights + t * k;
      switch (c.score) {
        case RouterScore::Softmax: {
          const float m = *std::max_element(z, z + E);
          double sum = 0;
          for (int64_t e = 0; e < E; ++e) {
            p[e] = std::exp(z[e] - m);
            sum += p[e];
          }
          const float inv = static_cast<float>(1.0 / sum);
          for (int64_t e = 0; e < E; ++e) p[e] *= inv;
          if (c.n_group > 1 && c.topk_group < c.n_group) {
            softmax_group_choice(c, p, choice.data(), group, keep, taken);
            top_k(choice.data(), E, k, idx, taken);
          } else {
            top_k(p, E, k, idx, taken);
          }
          break;
        }
        case RouterScore::Sigmoid: {
          for (int64_t e = 0; e < E; ++e) p[e] = 1.0f / (1.0f + std::exp(-z[e]));
          grouped_choice(c, p, bias, choice.data(), group, keep, taken);
          top_k(choice.data(), E, k, idx, taken);
          break;
        }
      }
      float sel = 0;
      for (int64_t j = 0; j < k; ++j) {
        w[j] = p[idx[j]];
        sel += w[j];
      }
      const float eps = c.score == RouterScore::Sigmoid ? 1e-20f : 0.0f;
      const float scale = (c.normalize ? 1.0f / (sel + eps) : 1.0f) * c.scaling;
      for (int64_t j = 0; j < k; ++j) w[j] *= scale;
    }
  }
}

// Accumulates dlogits (n, E) from dweights (n, k).
void router_backward(const RouterConfig& c, const float* probs, const int32_t* indices, const float* weights,
                     const float* dweights, float* dlogits, int64_t n) {
  const int64_t E = c.experts, k = c.top_k;
#pragma omp parallel
  {
    std::vector<float> dp(static_cast<size_t>(E));
#pragma omp for schedule(static)
    for (int64_t t = 0; t < n; ++t) {
      const float* p = probs + t * E;
      const int32_t* idx = indices + t * k;
      const float* w = weights + t * k;
      const float* dw = dweights + t * k;
      float* dz = dlogits + t * E;
      std::fill(dp.begin(), dp.end(), 0.0f);
      // w_j = scale·p_j/S with S = Σ_sel p (+eps): dp_m = scale·(dw_m − Σ_j dw_j·u_j)/S, u = w/scale.
      if (c.normalize) {
        float sel = 0, dot = 0;
        for (int64_t j = 0; j < k; ++j) {
          sel += p[idx[j]];
          dot += dw[j] * w[j];
        }
        const float eps = c.score == RouterScore::Sigmoid ? 1e-20f : 0.0f;
        const float inv = 1.0f / (sel + eps);
        for (int64_t j = 0; j < k; ++j) dp[static_cast<size_t>(idx[j])] += (c.scaling * dw[j] - dot) * inv;
      } else {
        for (int64_t j = 0; j < k; ++j) dp[static_cast<size_t>(idx[j])] += c.scaling * dw[j];
      }
      switch (c.score) {
        case RouterScore::Softmax: {
          float dot = 0;
          for (int64_t j = 0; j < k; ++j) dot += p[idx[j]] * dp[static_cast<size_t>(idx[j])];
          for (int64_t e = 0; e < E; ++e) dz[e] += p[e] * (dp[static_cast<size_t>(e)] - dot);
          break;
        }
        case RouterScore::Sigmoid:
          for (int64_t j = 0; j < k; ++j) {
            const int32_t e = idx[j];
            dz[e] += dp[static_cast<size_t>(e)] * p[e] * (1.0f - p[e]);
          }
          break;
      }
    }
  }
}

double router_entropy(const RouterConfig& c, const float* probs, int64_t n) {
  const int64_t E = c.experts;
  double total = 0;
  for (int64_t t = 0; t < n; ++t) {
    const float* p = probs + t * E;
    double sum = 1.0;
    if (c.score == RouterScore::Sigmoid) {
      sum = 0;
      for (int64_t e = 0; e < E; ++e) sum += p[e];
    }
    double h = 0;
    for (int64_t e = 0; e < E; ++e) {
      const double q = p[e] / sum;
      if (q > 0) h -= q * std::log(q);
    }
    total += h;
  }
  return n ? total / static_cast<double>(n) : 0.0;
}

}  // namespace keel::kernels
