#include "kernels/moe.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <vector>

namespace peng::kernels {
namespace {

// Indices of the k largest values of v[0..n) (ties: lower index first), in descending order.
void TopK(const float* v, int64_t n, int64_t k, int32_t* out, std::vector<int32_t>* idx) {
  idx->resize(n);
  std::iota(idx->begin(), idx->end(), 0);
  std::partial_sort(idx->begin(), idx->begin() + k, idx->end(),
                    [v](int32_t a, int32_t b) { return v[a] > v[b] || (v[a] == v[b] && a < b); });
  std::copy_n(idx->begin(), k, out);
}

}  // namespace

void MoeRoute(const float* logits, const float* bias, int64_t T, const MoeRouting& p,
              int32_t* ids_out, float* w_out) {
  using Method = MoeRouting::Method;
  const int64_t E = p.n_experts, k = p.k, G = std::max(p.n_group, 1);
  // Per-thread scratch, reused across calls.
  thread_local std::vector<float> s, choice, group_score;
  thread_local std::vector<int32_t> idx, groups;
  thread_local std::vector<uint8_t> keep;
  s.resize(E);
  choice.resize(E);
  group_score.resize(G);
  groups.resize(G);
  keep.resize(G);
  for (int64_t t = 0; t < T; ++t) {
    const float* lg = logits + t * E;
    if (p.sigmoid) {
      for (int64_t e = 0; e < E; ++e)
        s[e] = static_cast<float>(1.0 / (1.0 + std::exp(-double{lg[e]})));
    } else {
      double m = lg[0], sum = 0;
      for (int64_t e = 1; e < E; ++e) m = std::max(m, double{lg[e]});
      for (int64_t e = 0; e < E; ++e) sum += std::exp(lg[e] - m);
      for (int64_t e = 0; e < E; ++e) s[e] = static_cast<float>(std::exp(lg[e] - m) / sum);
    }
    for (int64_t e = 0; e < E; ++e) choice[e] = s[e] + (bias ? bias[e] : 0.f);
    if (p.method != Method::kGreedy && G > 1) {
      const int64_t per = E / G;
      for (int64_t g = 0; g < G; ++g) {
        const float* v = choice.data() + g * per;
        if (p.method == Method::kNoauxTc) {  // sum of the group's top-2
          float a = -INFINITY, b = -INFINITY;
          for (int64_t e = 0; e < per; ++e) {
            if (v[e] > a) {
              b = a;
              a = v[e];
            } else if (v[e] > b) {
              b = v[e];
            }
          }
          group_score[g] = per >= 2 ? a + b : a;
        } else {
          group_score[g] = *std::max_element(v, v + per);
        }
      }
      TopK(group_score.data(), G, p.topk_group, groups.data(), &idx);
      std::fill(keep.begin(), keep.end(), 0);
      for (int64_t j = 0; j < p.topk_group; ++j) keep[groups[j]] = 1;
      for (int64_t e = 0; e < E; ++e)
        if (!keep[e / per]) choice[e] = 0.f;
    }
    int32_t* ids = ids_out + t * k;
    float* w = w_out + t * k;
    TopK(choice.data(), E, k, ids, &idx);
    double sum = 0;
    for (int64_t j = 0; j < k; ++j) sum += w[j] = s[ids[j]];
    const bool norm = p.method == Method::kNoauxTc && p.norm_topk_prob;
    for (int64_t j = 0; j < k; ++j) {
      const double v = norm ? w[j] / (sum + 1e-20) : w[j];
      w[j] = static_cast<float>(v * p.routed_scaling_factor);
    }
  }
}

}  // namespace peng::kernels
