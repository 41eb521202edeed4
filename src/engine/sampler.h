// Sampler: turns one row of logits into the next token id for one request, following that
// request's SamplingParams; TokenHistory: the token ids a request has seen so far, kept in the
// form the penalties need.
//
// Algorithm of Sample(), for a row of `vocab` logits:
//   1. Penalties, in place, touching only tokens in the history (O(distinct seen tokens)):
//      repetition penalty over prompt + output, then presence/frequency over the output.
//   2. temperature == 0 or top_k == 1: one argmax pass, ties -> lowest id. No randomness used.
//   3. Otherwise, with m = max logit and s_i = (l_i - m) / temperature:
//      top-k   keep the k largest, sorted (logit desc, ties -> lower id);
//      softmax p_i = exp(s_i) / sum over the kept set (sums in double);
//      top-p   keep the smallest prefix, in (logit desc, id asc) order, whose cumulative p is
//              >= top_p (the prefix is sorted lazily in growing chunks, so a peaked
//              distribution costs O(vocab), not O(vocab log vocab));
//      min-p   keep p_i >= min_p * p_max, i.e. s_i >= log(min_p);
//      draw    u = 53 random bits of the request's mt19937_64 as a double in [0, 1); walk the
//              kept set accumulating exp(s_i) until it exceeds u * total.
//   The draw uses only mt19937_64 (fully specified by the C++ standard), never a
//   std::*_distribution, so a given seed yields the same tokens on every platform.
//
// NaN logits are taken as -inf (the engine fails a request with NaN logits before sampling;
// this keeps every other caller memory-safe), a +inf logit wins outright.
//
// Logprobs are of the raw logits: call TopLogprobs()/LogProb() before Sample() (which
// modifies the logits), or pass `raw_logprob` to Sample().
//
// Cost: greedy is one pass; random sampling is O(vocab) plus O(k log k) for the sorted part.
// Scratch buffers live in the Sampler and are reused, so steady-state sampling does not
// allocate. Not thread-safe: one Sampler per request, used by the engine thread.
#pragma once

#include <cstdint>
#include <random>
#include <span>
#include <unordered_map>
#include <utility>
#include <vector>

#include "engine/sampling_params.h"

namespace peng {

// Prompt ids, generated ids, and per-distinct-token counts of generated occurrences.
// Append() is O(1) amortized.
class TokenHistory {
 public:
  struct Entry {
    int32_t id;
    int32_t output_count;  // occurrences among generated tokens; 0 = seen in the prompt only
  };

  TokenHistory() = default;
  explicit TokenHistory(std::span<const int32_t> prompt);

  // Appends one generated token.
  void Append(int32_t id);

  const std::vector<int32_t>& prompt() const { return prompt_; }
  const std::vector<int32_t>& output() const { return output_; }
  // Every distinct id in prompt + output, in order of first appearance.
  const std::vector<Entry>& distinct() const { return distinct_; }
  // Number of times `id` was generated.
  int32_t OutputCount(int32_t id) const;

 private:
  Entry& Find(int32_t id);  // inserts a zero-count entry if absent

  std::vector<int32_t> prompt_;
  std::vector<int32_t> output_;
  std::vector<Entry> distinct_;
  std::unordered_map<int32_t, int32_t> index_;  // id -> position in distinct_
};

class Sampler {
 public:
  // `params` must be valid (Validate() OK). Seed -1 draws a seed from std::random_device.
  explicit Sampler(const SamplingParams& params);

  // Applies penalties to `logits` in place and returns the chosen id in [0, vocab).
  // Every id in `history` must be < vocab. If `raw_logprob` is non-null it receives the
  // log-softmax of the chosen id under the logits as they were passed in.
  int32_t Sample(float* logits, int64_t vocab, const TokenHistory& history,
                 float* raw_logprob = nullptr);

  // How many of a row's best logits Sample() reads under `p` once the row's penalties are
  // applied: 1 (greedy), top_k, or 0 -- the whole row (random sampling without top-k).
  //
  // SampleTop, SampleDrawn and SampleNucleus take what a device returns of a row (its best
  // logits, its totals, its draw) in place of the row. Where `p` has penalties, that row must
  // be the penalized row (a device applies them first: LogitEdits, Device::EditLogits); these
  // functions apply none.
  static int TopNeeded(const SamplingParams& p);
  // Sample() of a row of which only its n best logits are at hand (val / id best first, as
  // kernels::TopK and Device::TopLogits give them; TopNeeded(params()) in [1, n], the row's
  // vocabulary larger than top_k): the same id, and the same draws of the generator, as Sample()
  // on the whole row would give (a row without NaN).
  int32_t SampleTop(const float* val, const int32_t* id, int n);

  // Plain temperature sampling over the whole row in id order (temperature > 0; no top-k below
  // the vocabulary, top-p or min-p): a draw a device can make where the logits are
  // (Device::DrawTokens), from the row's largest logit and a uniform drawn before the step.
  static bool DrawsInIdOrder(const SamplingParams& p, int64_t vocab);
  // Temperature sampling with top-p or min-p but no top-k below the vocabulary: SampleNucleus'
  // rows.
  static bool SamplesNucleus(const SamplingParams& p, int64_t vocab);
  // Sample() of a SamplesNucleus row of which only its n best logits (val / id, best first, as
  // kernels::TopK gives them) and its softmax denominator at the request's temperature
  // (kernels::TemperatureTotal, Device::DrawTokens' total) are at hand: the same id, and the
  // same draws of the generator, as Sample() on the whole row (a row without NaN or +inf) where
  // the n hold the nucleus -- top-p's is reached within them, or min-p leaves none past them;
  // -1, drawing nothing, where they may not (the whole row is needed).
  int32_t SampleNucleus(const float* val, const int32_t* id, int n, int64_t vocab, double total);
  // The uniform the next draw takes (the generator's next), drawn now and kept for that draw:
  // the same value however often it is asked for before a draw takes it.
  double PendingUniform();
  // Sample() of a DrawsInIdOrder row of which only its best logit and index are at hand, and
  // the id the device drew with PendingUniform() (kernels::DrawInIdOrder's): the same id, and
  // the same draws of the generator, as Sample() on the whole row (a row without NaN or +inf).
  int32_t SampleDrawn(float best, int32_t best_id, int32_t drawn);

  // Applies the repetition, presence and frequency penalties in place (step 1 above).
  void ApplyPenalties(float* logits, int64_t vocab, const TokenHistory& history) const;

  // The `n` most likely tokens as (id, log-softmax), most likely first, ties -> lower id.
  static void TopLogprobs(const float* logits, int64_t vocab, int n,
                          std::vector<std::pair<int32_t, float>>* out);
  // log-softmax of `id`.
  static float LogProb(const float* logits, int64_t vocab, int32_t id);
  // log(sum(exp(logits))), computed stably in double.
  static double LogSumExp(const float* logits, int64_t vocab);
  // LogSumExp from the row's largest value m and kernels::LogSoftmaxTotal (a device's sum).
  static double LogSumExpOf(float m, double total);
  // TopLogprobs from a row's n best (val / idx, best first) and its LogSumExp.
  static void ListLogprobs(const float* val, const int32_t* idx, int n, double lse,
                           std::vector<std::pair<int32_t, float>>* out);
  // Index of the largest logit, ties -> lowest id; NaN is skipped (0 when every logit is NaN).
  static int32_t Argmax(const float* logits, int64_t vocab);

  const SamplingParams& params() const { return params_; }
  uint64_t seed() const { return seed_; }

 private:
  struct Candidate {
    float logit;
    int32_t id;
  };

  int32_t SampleRandom(const float* logits, int64_t vocab);
  int32_t DrawFromTop(const float* val, const int32_t* id, int k);
  // Top-p and min-p over cand_ (the top-k set, best first), then Draw(); m: the row's max.
  int32_t DrawTopK(float m);
  // Draws from cand_ (not empty) with weights exp((logit - m) / temperature), in its order.
  int32_t Draw(float m);
  // Truncates cand_ to the top-p nucleus; `denom` is sum(exp(s_i)) over cand_. Whether the
  // share was reached (false: every candidate kept, sorted; or top_p = 1, nothing done).
  bool ApplyTopP(float max_logit, float inv_t, double denom);
  double NextUniform();  // [0, 1): the pending one (PendingUniform) if any, else the next

  // Top-k up to here takes kernels::TopK's one pass over the row (a value that enters the list
  // moves up to k entries); a larger k, nth_element over the row and a sort of the k.
  static constexpr int64_t kScanTopK = 64;

  SamplingParams params_;
  uint64_t seed_;
  std::mt19937_64 rng_;
  bool has_pending_ = false;
  double pending_ = 0.0;
  std::vector<Candidate> cand_;  // scratch, reused across calls
  std::vector<float> saved_;     // scratch: raw logits of history tokens, for raw_logprob
  std::vector<float> top_val_;   // scratch: kernels::TopK's list
  std::vector<int32_t> top_idx_;
};

}  // namespace peng
