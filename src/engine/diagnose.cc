#include "engine/diagnose.h"

#include <algorithm>
#include <cmath>
#include <map>
#include <mutex>

#include "kernels/ops.h"

namespace peng::eval {

std::vector<TensorDeviation> CompareWeights(const Model& model, const Model& ref,
                                            ThreadPool* pool) {
  std::map<std::string, const Linear*> by_name;
  for (const Linear* l : ref.Linears()) by_name[l->name()] = l;
  std::vector<std::pair<const Linear*, const Linear*>> pairs;
  for (const Linear* l : model.Linears()) {
    auto it = by_name.find(l->name());
    if (it != by_name.end() && it->second->rows() == l->rows() && it->second->cols() == l->cols())
      pairs.emplace_back(l, it->second);
  }
  // A llama GGUF (interleaved RoPE) stores Q/K rows permuted relative to an HF checkpoint.
  const ModelConfig& cm = model.config();
  const bool permuted = cm.rope.style != ref.config().rope.style;
  std::vector<TensorDeviation> out(pairs.size());
  for (size_t i = 0; i < pairs.size(); ++i) {
    const Linear& m = *pairs[i].first;
    const Linear& r = *pairs[i].second;
    const bool qk = permuted && (m.name().ends_with(".attn_q.weight") ||
                                 m.name().ends_with(".attn_k.weight"));
    auto ref_row = [&](int64_t row) {
      if (!qk) return row;
      return cm.rope.style == kernels::RopeStyle::kNeox ? NeoxToInterleavedRow(row, cm.head_dim)
                                                        : InterleavedToNeoxRow(row, cm.head_dim);
    };
    std::mutex mu;
    double err = 0, norm = 0;
    pool->ParallelFor(m.rows(), [&](int64_t b, int64_t e) {
      std::vector<float> wm(m.cols()), wr(m.cols());
      double le = 0, ln = 0;
      for (int64_t row = b; row < e; ++row) {
        m.DequantizeRow(row, wm.data());
        r.DequantizeRow(ref_row(row), wr.data());
        for (int64_t c = 0; c < m.cols(); ++c) {
          const double d = static_cast<double>(wm[c]) - wr[c];
          le += d * d;
          ln += static_cast<double>(wr[c]) * wr[c];
        }
      }
      std::lock_guard<std::mutex> lock(mu);
      err += le;
      norm += ln;
    });
    out[i] = {m.name(), std::sqrt(err) / (norm > 0 ? std::sqrt(norm) : 1.0)};
  }
  std::sort(out.begin(), out.end(),
            [](const TensorDeviation& a, const TensorDeviation& b) { return a.rel > b.rel; });
  return out;
}

StatusOr<Diagnosis> DiagnoseLayers(Llm& model, Llm& ref, std::span<const int32_t> window,
                                   bool exact_ref) {
  Diagnosis d;
  PENG_ASSIGN_OR_RETURN(std::vector<float> hm, model.PromptHiddenStates(window));
  kernels::SetExactActivations(exact_ref);
  auto hr = ref.PromptHiddenStates(window);
  kernels::SetExactActivations(false);
  if (!hr.ok()) return hr.status();
  const ModelConfig& cm = model.model().config();
  const ModelConfig& cr = ref.model().config();
  if (cm.n_layers == cr.n_layers && cm.hidden_size == cr.hidden_size && hm.size() == hr->size()) {
    const int64_t block = static_cast<int64_t>(window.size()) * cm.hidden_size;
    for (int64_t l = 0; l <= cm.n_layers; ++l) {
      double err = 0, norm = 0;
      for (int64_t i = l * block; i < (l + 1) * block; ++i) {
        const double diff = static_cast<double>(hm[i]) - (*hr)[i];
        err += diff * diff;
        norm += static_cast<double>((*hr)[i]) * (*hr)[i];
      }
      d.layer_rel.push_back(std::sqrt(err) / (norm > 0 ? std::sqrt(norm) : 1.0));
    }
    for (int64_t l = 0; l < cm.n_layers; ++l) {
      const double growth = d.layer_rel[l + 1] - d.layer_rel[l];
      if (d.worst_layer < 0 || growth > d.worst_layer_growth) {
        d.worst_layer = static_cast<int>(l);
        d.worst_layer_growth = growth;
      }
    }
  }
  return d;
}

}  // namespace peng::eval
