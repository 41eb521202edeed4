#include "engine/sampler.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "core/check.h"
#include "kernels/ops.h"

namespace peng {
namespace {

constexpr float kNegInf = -std::numeric_limits<float>::infinity();

uint64_t ResolveSeed(int64_t seed) {
  if (seed >= 0) return static_cast<uint64_t>(seed);
  std::random_device rd;
  return (static_cast<uint64_t>(rd()) << 32) ^ rd();
}

float MaxLogit(const float* logits, int64_t vocab) {
  float m = kNegInf;
  for (int64_t i = 0; i < vocab; ++i) m = std::max(m, logits[i]);
  return m;
}

}  // namespace

// ---------------------------------------------------------------------------------------------
// TokenHistory

TokenHistory::TokenHistory(std::span<const int32_t> prompt)
    : prompt_(prompt.begin(), prompt.end()) {
  for (int32_t id : prompt_) Find(id);
}

TokenHistory::Entry& TokenHistory::Find(int32_t id) {
  auto [it, inserted] = index_.try_emplace(id, static_cast<int32_t>(distinct_.size()));
  if (inserted) distinct_.push_back({id, 0});
  return distinct_[it->second];
}

void TokenHistory::Append(int32_t id) {
  output_.push_back(id);
  ++Find(id).output_count;
}

int32_t TokenHistory::OutputCount(int32_t id) const {
  auto it = index_.find(id);
  return it == index_.end() ? 0 : distinct_[it->second].output_count;
}

// ---------------------------------------------------------------------------------------------
// Sampler

Sampler::Sampler(const SamplingParams& params)
    : params_(params), seed_(ResolveSeed(params.seed)), rng_(seed_) {
  PENG_CHECK_MSG(params.Validate().ok(), "Sampler needs validated SamplingParams");
}

void Sampler::ApplyPenalties(float* logits, int64_t vocab, const TokenHistory& history) const {
  if (!params_.penalized()) return;
  const float rep = params_.repetition_penalty;
  const float presence = params_.presence_penalty;
  const float frequency = params_.frequency_penalty;
  for (const TokenHistory::Entry& e : history.distinct()) {
    PENG_CHECK_MSG(e.id >= 0 && e.id < vocab, "token id in history outside the vocabulary");
    // (A penalty may push a large logit past the float range: kept finite, so that the
    // softmax's (l - max) never meets inf - inf.)
    logits[e.id] = kernels::PenalizedLogit(logits[e.id], rep, presence, frequency,
                                           static_cast<float>(e.output_count));
  }
}

int32_t Sampler::Sample(float* logits, int64_t vocab, const TokenHistory& history,
                        float* raw_logprob) {
  PENG_CHECK(vocab > 0 && vocab <= std::numeric_limits<int32_t>::max());
  double raw_lse = 0.0;
  if (raw_logprob != nullptr) {  // remember what the penalties are about to overwrite
    raw_lse = LogSumExp(logits, vocab);
    saved_.clear();
    for (const TokenHistory::Entry& e : history.distinct()) saved_.push_back(logits[e.id]);
  }

  ApplyPenalties(logits, vocab, history);
  // NaN has no place in an order: sorting or selecting over it is undefined behaviour. The
  // engine fails a request whose logits hold NaN before it gets here; any other caller gets
  // NaN treated as "never" (Argmax skips it; random sampling first turns it into -inf).
  int32_t id;
  if (params_.greedy() || params_.top_k == 1) {
    id = Argmax(logits, vocab);
  } else {
    if (kernels::FindNanOrPosInf(logits, vocab) >= 0) {
      for (int64_t i = 0; i < vocab; ++i) {
        if (std::isnan(logits[i])) logits[i] = kNegInf;
      }
    }
    id = SampleRandom(logits, vocab);
  }

  if (raw_logprob != nullptr) {
    float raw = logits[id];
    const auto& distinct = history.distinct();
    for (size_t i = 0; i < distinct.size(); ++i) {
      if (distinct[i].id == id) raw = saved_[i];
    }
    *raw_logprob = static_cast<float>(raw - raw_lse);
  }
  return id;
}

int32_t Sampler::SampleRandom(const float* logits, int64_t vocab) {
  const int64_t k = (params_.top_k > 0 && params_.top_k < vocab) ? params_.top_k : 0;
  if (k > 0 && k <= kScanTopK) {  // one pass for the sorted top-k (the same list as below)
    top_val_.resize(k);
    top_idx_.resize(k);
    kernels::TopK(logits, vocab, static_cast<int>(k), top_val_.data(), top_idx_.data());
    return DrawFromTop(top_val_.data(), top_idx_.data(), static_cast<int>(k));
  }
  const float m = MaxLogit(logits, vocab);
  if (!(m > kNegInf)) return Argmax(logits, vocab);  // everything masked (or NaN)
  if (std::isinf(m)) return Argmax(logits, vocab);   // +inf: that token is certain
  const float inv_t = 1.0f / params_.temperature;
  const float log_min_p = params_.min_p > 0.0f ? std::log(params_.min_p) : kNegInf;
  auto scaled = [&](float l) { return (l - m) * inv_t; };

  // Fast path: plain temperature sampling over the whole vocabulary, in id order.
  if (k == 0 && params_.top_p >= 1.0f && params_.min_p == 0.0f)
    return kernels::DrawInIdOrder(logits, vocab, m, inv_t, NextUniform());

  // Top-k: the k best, sorted -- the order the draw walks them in, the same on every platform
  // and the order a device's TopLogits returns them in (SampleTop).
  cand_.clear();
  if (k > 0) {
    cand_.resize(vocab);
    for (int64_t i = 0; i < vocab; ++i) cand_[i] = {logits[i], static_cast<int32_t>(i)};
    auto better = [](const Candidate& a, const Candidate& b) {
      return a.logit > b.logit || (a.logit == b.logit && a.id < b.id);
    };
    std::nth_element(cand_.begin(), cand_.begin() + (k - 1), cand_.end(), better);
    cand_.resize(k);
    std::sort(cand_.begin(), cand_.end(), better);
    return DrawTopK(m);
  }
  // No top-k: min-p can be applied while filling (its survivors are a prefix of the sorted
  // order, so it commutes with top-p), but the denominator spans the full vocab.
  double denom = 0.0;
  for (int64_t i = 0; i < vocab; ++i) {
    const float s = scaled(logits[i]);
    denom += std::exp(s);
    if (s >= log_min_p) cand_.push_back({logits[i], static_cast<int32_t>(i)});
  }
  ApplyTopP(m, inv_t, denom);
  // The max token survives every filter (its scaled logit is 0, the largest): never empty.
  if (cand_.empty()) return Argmax(logits, vocab);
  return Draw(m);
}

int Sampler::TopNeeded(const SamplingParams& p) {
  if (p.greedy() || p.top_k == 1) return 1;
  return std::max(p.top_k, 0);
}

int32_t Sampler::SampleTop(const float* val, const int32_t* id, int n) {
  const int k = TopNeeded(params_);
  PENG_CHECK_MSG(k > 0 && k <= n, "SampleTop: the params need more of the row");
  return k == 1 ? id[0] : DrawFromTop(val, id, k);
}

// A row's k best (val / id, best first; no NaN): the top-k draw, or Argmax's answer.
int32_t Sampler::DrawFromTop(const float* val, const int32_t* id, int k) {
  const float m = val[0];
  // Everything masked, or a +inf logit: Sample()'s Argmax, the first of the list.
  if (!(m > kNegInf) || std::isinf(m)) return id[0];
  cand_.clear();
  for (int i = 0; i < k; ++i) cand_.push_back({val[i], id[i]});
  return DrawTopK(m);
}

// cand_: the top-k set, best first; m: the row's largest logit.
int32_t Sampler::DrawTopK(float m) {
  const float inv_t = 1.0f / params_.temperature;
  double denom = 0.0;
  for (const Candidate& c : cand_) denom += std::exp((c.logit - m) * inv_t);
  ApplyTopP(m, inv_t, denom);
  if (params_.min_p > 0.0f) {
    const float log_min_p = std::log(params_.min_p);
    std::erase_if(cand_, [&](const Candidate& c) { return (c.logit - m) * inv_t < log_min_p; });
  }
  return Draw(m);  // (the first candidate survives both filters)
}

int32_t Sampler::Draw(float m) {
  const float inv_t = 1.0f / params_.temperature;
  double total = 0.0;
  for (const Candidate& c : cand_) total += std::exp((c.logit - m) * inv_t);
  const double u = NextUniform() * total;
  double acc = 0.0;
  for (const Candidate& c : cand_) {
    acc += std::exp((c.logit - m) * inv_t);
    if (u < acc) return c.id;
  }
  return cand_.back().id;
}

bool Sampler::ApplyTopP(float max_logit, float inv_t, double denom) {
  if (params_.top_p >= 1.0f) return false;
  auto better = [](const Candidate& a, const Candidate& b) {
    return a.logit > b.logit || (a.logit == b.logit && a.id < b.id);
  };
  const double target = static_cast<double>(params_.top_p) * denom;
  const size_t n = cand_.size();
  size_t sorted = 0;
  size_t chunk = 256;
  double cum = 0.0;
  while (sorted < n) {
    // Bring the next `chunk` best candidates into [sorted, end), in order.
    const size_t end = std::min(n, sorted + chunk);
    if (end < n) std::nth_element(cand_.begin() + sorted, cand_.begin() + end, cand_.end(), better);
    std::sort(cand_.begin() + sorted, cand_.begin() + end, better);
    for (size_t i = sorted; i < end; ++i) {
      cum += std::exp((cand_[i].logit - max_logit) * inv_t);
      if (cum >= target) {
        cand_.resize(i + 1);
        return true;
      }
    }
    sorted = end;
    chunk *= 4;
  }
  return false;
}

double Sampler::NextUniform() {
  if (has_pending_) {
    has_pending_ = false;
    return pending_;
  }
  return static_cast<double>(rng_() >> 11) * 0x1.0p-53;
}

double Sampler::PendingUniform() {
  if (!has_pending_) {
    pending_ = NextUniform();
    has_pending_ = true;
  }
  return pending_;
}

namespace {

// Temperature sampling without a top-k below the vocabulary.
bool TemperatureWithoutTopK(const SamplingParams& p, int64_t vocab) {
  return Sampler::TopNeeded(p) != 1 && (p.top_k <= 0 || p.top_k >= vocab);
}

}  // namespace

bool Sampler::DrawsInIdOrder(const SamplingParams& p, int64_t vocab) {
  return TemperatureWithoutTopK(p, vocab) && p.top_p >= 1.0f && p.min_p == 0.0f;
}

bool Sampler::SamplesNucleus(const SamplingParams& p, int64_t vocab) {
  return TemperatureWithoutTopK(p, vocab) && (p.top_p < 1.0f || p.min_p > 0.0f);
}

int32_t Sampler::SampleNucleus(const float* val, const int32_t* id, int n, int64_t vocab,
                               double total) {
  const float m = val[0];
  // Everything masked, or a +inf logit: Sample()'s Argmax, the first of the list.
  if (!(m > kNegInf) || std::isinf(m)) return id[0];
  const float inv_t = 1.0f / params_.temperature;
  const float log_min_p = params_.min_p > 0.0f ? std::log(params_.min_p) : kNegInf;
  // The candidates (min-p's survivors) the list holds: a prefix of it; all of them where an
  // entry fails min-p (every value after it does too) or the list is the row.
  cand_.clear();
  for (int i = 0; i < n && (val[i] - m) * inv_t >= log_min_p; ++i) cand_.push_back({val[i], id[i]});
  const bool all = static_cast<int64_t>(cand_.size()) < n || n == vocab;
  if (params_.top_p < 1.0f)  // (the list is in ApplyTopP's order: its prefix the same)
    return (ApplyTopP(m, inv_t, total) || all) ? Draw(m) : -1;
  if (!all) return -1;
  // Min-p alone: the draw walks the candidates in id order, as SampleRandom leaves them.
  std::sort(cand_.begin(), cand_.end(),
            [](const Candidate& a, const Candidate& b) { return a.id < b.id; });
  return Draw(m);
}

int32_t Sampler::SampleDrawn(float best, int32_t best_id, int32_t drawn) {
  // Everything masked: Sample()'s Argmax (no draw; the pending uniform stays for the next).
  if (!(best > kNegInf)) return best_id;
  PENG_CHECK_MSG(has_pending_ && !std::isinf(best) && drawn >= 0,
                 "SampleDrawn: no draw with the pending uniform for a finite row");
  NextUniform();  // (the pending one, which the device drew with)
  return drawn;
}

// ---------------------------------------------------------------------------------------------
// Static helpers on raw logits

int32_t Sampler::Argmax(const float* logits, int64_t vocab) {
  PENG_CHECK(vocab > 0);
  return static_cast<int32_t>(kernels::ArgMax(logits, vocab));  // ties keep the lowest id
}

double Sampler::LogSumExp(const float* logits, int64_t vocab) {
  const float m = MaxLogit(logits, vocab);
  return LogSumExpOf(m, m > kNegInf ? kernels::LogSoftmaxTotal(logits, vocab, m) : 0.0);
}

double Sampler::LogSumExpOf(float m, double total) {
  return m > kNegInf ? static_cast<double>(m) + std::log(total) : m;
}

void Sampler::ListLogprobs(const float* val, const int32_t* idx, int n, double lse,
                           std::vector<std::pair<int32_t, float>>* out) {
  out->clear();
  for (int i = 0; i < n; ++i) out->push_back({idx[i], static_cast<float>(val[i] - lse)});
}

float Sampler::LogProb(const float* logits, int64_t vocab, int32_t id) {
  PENG_CHECK(id >= 0 && id < vocab);
  return static_cast<float>(logits[id] - LogSumExp(logits, vocab));
}

void Sampler::TopLogprobs(const float* logits, int64_t vocab, int n,
                          std::vector<std::pair<int32_t, float>>* out) {
  out->clear();
  const int want = static_cast<int>(std::clamp<int64_t>(n, 0, vocab));
  if (want == 0) return;
  std::vector<float> val(want);
  std::vector<int32_t> idx(want);
  kernels::TopK(logits, vocab, want, val.data(), idx.data());
  ListLogprobs(val.data(), idx.data(), want, LogSumExp(logits, vocab), out);
}

}  // namespace peng
