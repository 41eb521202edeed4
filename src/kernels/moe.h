// Mixture-of-experts routing (DeepSeek-V2/V3 style): from each token's router logits to its
// top-k experts and their weights. One definition for the CPU model (model/deepseek2) and the
// host device; the accelerator backends implement the same arithmetic (backend/device.h).
//
//   scores = softmax(logits) (double precision) or sigmoid(logits)
//   choice = scores + bias (V3's e_score_correction_bias; none for V2)
//   group-limited methods (n_group > 1): experts in n_group contiguous groups, each scored by its
//     largest choice (kGroupLimitedGreedy) or the sum of its top two (kNoauxTc); the topk_group
//     best groups are kept, every other expert's choice set to 0
//   ids = the k largest choices (ties: lower index first), in descending order
//   w[j] = scores[ids[j]] (normalised to sum 1 when kNoauxTc and norm_topk_prob; HF DeepseekV2
//     ignores norm_topk_prob) * routed_scaling_factor
#pragma once

#include <cstdint>

namespace peng::kernels {

struct MoeRouting {
  enum class Method { kGreedy, kGroupLimitedGreedy, kNoauxTc };
  int n_experts = 0;
  int k = 0;
  int n_group = 1;
  int topk_group = 1;
  Method method = Method::kGreedy;
  bool sigmoid = false;  // scoring function (else softmax)
  bool norm_topk_prob = false;
  float routed_scaling_factor = 1.f;
};

inline constexpr int kMaxRoutedExperts = 512;

// logits [T, n_experts] -> ids [T, k], w [T, k]. bias: n_experts values or null.
void MoeRoute(const float* logits, const float* bias, int64_t T, const MoeRouting& p,
              int32_t* ids, float* w);

}  // namespace peng::kernels
