#include "engine/eval.h"

#include <algorithm>
#include <cassert>
#include <cmath>
#include <string>

namespace peng::eval {
namespace {

double LogSumExp(std::span<const float> row) {
  float mx = row[0];
  for (float v : row) mx = std::max(mx, v);
  double sum = 0;
  for (float v : row) sum += std::exp(static_cast<double>(v) - mx);
  return mx + std::log(sum);
}

Status CheckLogits(const StatusOr<std::vector<float>>& logits, size_t n, int64_t vocab,
                   const char* what) {
  if (!logits.ok()) return logits.status();
  if (logits->size() != n * static_cast<size_t>(vocab)) {
    return Internal(std::string(what) + " returned " + std::to_string(logits->size()) +
                    " logits for " + std::to_string(n) + " tokens x vocab " +
                    std::to_string(vocab));
  }
  return OkStatus();
}

}  // namespace

std::vector<Window> PlanWindows(int64_t n_tokens, int64_t ctx, int64_t stride) {
  assert(ctx >= 2 && stride >= 1);
  stride = std::min(stride, ctx - 1);
  std::vector<Window> windows;
  int64_t scored_end = 1;  // token 0 is never scored
  for (int64_t begin = 0; scored_end < n_tokens; begin += stride) {
    const int64_t end = std::min(begin + ctx, n_tokens);
    windows.push_back({begin, end, scored_end});
    scored_end = end;
  }
  return windows;
}

double TokenNll(std::span<const float> row, int32_t target) {
  return LogSumExp(row) - static_cast<double>(row[target]);
}

double KlDivergence(std::span<const float> ref, std::span<const float> model) {
  const double lse_r = LogSumExp(ref), lse_m = LogSumExp(model);
  double kl = 0;
  for (size_t i = 0; i < ref.size(); ++i) {
    const double lr = ref[i] - lse_r, lm = model[i] - lse_m;
    kl += std::exp(lr) * (lr - lm);
  }
  return std::max(kl, 0.0);  // rounding can leave a tiny negative for identical rows
}

double RelativeLogitDeviation(std::span<const float> ref, std::span<const float> model,
                              int32_t* worst_id) {
  double mean_d = 0;
  float lo = ref[0], hi = ref[0];
  for (size_t i = 0; i < ref.size(); ++i) {
    mean_d += static_cast<double>(model[i]) - ref[i];
    lo = std::min(lo, ref[i]);
    hi = std::max(hi, ref[i]);
  }
  mean_d /= static_cast<double>(ref.size());
  double worst = -1;
  int32_t arg = 0;
  for (size_t i = 0; i < ref.size(); ++i) {
    const double d = std::fabs(static_cast<double>(model[i]) - ref[i] - mean_d);
    if (d > worst) worst = d, arg = static_cast<int32_t>(i);
  }
  if (worst_id) *worst_id = arg;
  return worst / (hi > lo ? static_cast<double>(hi) - lo : 1.0);
}

int32_t ArgMax(std::span<const float> row) {
  return static_cast<int32_t>(std::max_element(row.begin(), row.end()) - row.begin());
}

double PplResult::MeanNll() const { return tokens_scored ? total_nll / tokens_scored : 0; }
double PplResult::Ppl() const { return std::exp(MeanNll()); }

double CompareResult::MeanKl() const { return tokens_scored ? kl_sum / tokens_scored : 0; }
double CompareResult::Top1Agreement() const {
  return tokens_scored ? static_cast<double>(top1_agree) / tokens_scored : 0;
}
double CompareResult::PplModel() const {
  return std::exp(tokens_scored ? nll_model / tokens_scored : 0);
}
double CompareResult::PplRef() const {
  return std::exp(tokens_scored ? nll_ref / tokens_scored : 0);
}
double CompareResult::PplRatio() const { return PplModel() / PplRef(); }
double CompareResult::MeanDeviation() const {
  return tokens_scored ? dev_sum / tokens_scored : 0;
}

void CompareResult::Add(std::span<const float> ref, std::span<const float> model,
                        int64_t position, int32_t target) {
  ++tokens_scored;
  nll_ref += TokenNll(ref, target);
  nll_model += TokenNll(model, target);
  kl_sum += KlDivergence(ref, model);
  if (ArgMax(ref) == ArgMax(model)) ++top1_agree;
  int32_t vocab_id = -1;
  const double dev = RelativeLogitDeviation(ref, model, &vocab_id);
  dev_sum += dev;
  if (worst_position < 0 || dev > max_deviation) {
    max_deviation = dev;
    worst_position = position;
    worst_target = target;
    worst_vocab = vocab_id;
  }
}

StatusOr<PplResult> Perplexity(std::span<const int32_t> tokens, int64_t ctx, int64_t stride,
                               int64_t vocab, const LogitsFn& logits) {
  if (ctx < 2 || stride < 1) return InvalidArgument("eval: ctx must be >= 2 and stride >= 1");
  PplResult r;
  for (const Window& w : PlanWindows(static_cast<int64_t>(tokens.size()), ctx, stride)) {
    const auto span = tokens.subspan(w.begin, w.end - w.begin);
    auto out = logits(span);
    if (Status s = CheckLogits(out, span.size(), vocab, "model"); !s.ok()) return s;
    for (int64_t t = w.score_begin; t < w.end; ++t) {
      const float* row = out->data() + (t - 1 - w.begin) * vocab;
      r.total_nll += TokenNll({row, static_cast<size_t>(vocab)}, tokens[t]);
      ++r.tokens_scored;
    }
  }
  return r;
}

StatusOr<CompareResult> Compare(std::span<const int32_t> tokens, int64_t ctx, int64_t stride,
                                int64_t vocab, const LogitsFn& model, const LogitsFn& ref) {
  if (ctx < 2 || stride < 1) return InvalidArgument("eval: ctx must be >= 2 and stride >= 1");
  CompareResult r;
  for (const Window& w : PlanWindows(static_cast<int64_t>(tokens.size()), ctx, stride)) {
    const auto span = tokens.subspan(w.begin, w.end - w.begin);
    auto ref_out = ref(span);
    if (Status s = CheckLogits(ref_out, span.size(), vocab, "reference"); !s.ok()) return s;
    auto model_out = model(span);
    if (Status s = CheckLogits(model_out, span.size(), vocab, "model"); !s.ok()) return s;
    for (int64_t t = w.score_begin; t < w.end; ++t) {
      const int64_t off = (t - 1 - w.begin) * vocab;
      r.Add({ref_out->data() + off, static_cast<size_t>(vocab)},
            {model_out->data() + off, static_cast<size_t>(vocab)}, t, tokens[t]);
    }
  }
  return r;
}

}  // namespace peng::eval
