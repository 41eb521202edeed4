// Model-quality evaluation: perplexity over a token stream with strided sliding windows, and a
// comparison of a model against a reference run over the same windows (KL divergence, top-1
// agreement, perplexity ratio, largest relative logit deviation). The math here is pure; the
// model is reached through a LogitsFn callback, so `peng eval` passes Llm::PromptLogits (with
// exact mode toggled around the reference) and the tests pass synthetic logits.
//
// Windows (the Hugging Face "strided perplexity" scheme): windows of `ctx` tokens start at
// 0, stride, 2*stride, ...; each window scores only the tokens that no earlier window scored,
// so every token but the first is scored exactly once, each with at least ctx - stride tokens
// of context (except near the start). Token t is scored with the logits row of position t - 1
// in its window. A stride >= ctx is clamped to ctx - 1 so every window's first scored token
// still has one token of context inside the window.
//
// Relative logit deviation of one position (our definition of "deviation" for
// --max-deviation):
//     max_i |d_i - mean(d)| / (max_i l_ref[i] - min_i l_ref[i]),    d = l_model - l_ref
// the largest logit error over the vocabulary as a fraction of the reference row's logit
// range, after removing a constant shift (which softmax ignores). It is invariant to scaling
// both rows; 0.03 means "no logit moved by more than 3% of the spread the reference uses".
// --max-deviation bounds the MEAN over scored positions: single positions are outliers even
// for honest 8-bit arithmetic (SmolLM2's exact-vs-8-bit-activation maximum is ~13%), whereas a
// broken tensor moves every position. The maximum is reported too.
// Not thread-safe state; all functions are reentrant.
#pragma once

#include <cstdint>
#include <functional>
#include <span>
#include <vector>

#include "core/status.h"

namespace peng::eval {

struct Window {
  int64_t begin = 0;        // first token of the window
  int64_t end = 0;          // one past the last token
  int64_t score_begin = 0;  // targets scored are tokens [score_begin, end); score_begin > begin
};

// Windows over n_tokens tokens; empty when n_tokens < 2. ctx >= 2 and stride >= 1 required.
std::vector<Window> PlanWindows(int64_t n_tokens, int64_t ctx, int64_t stride);

// -log softmax(row)[target], computed in double.
double TokenNll(std::span<const float> row, int32_t target);

// KL(ref || model) = sum_i p_ref(i) * (log p_ref(i) - log p_model(i)) over softmax of the rows.
double KlDivergence(std::span<const float> ref, std::span<const float> model);

// See the header comment; *worst_id (optional) receives the vocabulary index of the largest
// |d - mean(d)|. A constant reference row counts its range as 1.
double RelativeLogitDeviation(std::span<const float> ref, std::span<const float> model,
                              int32_t* worst_id = nullptr);

// Index of the largest logit (the first one on ties).
int32_t ArgMax(std::span<const float> row);

// Logits [n, vocab] (row-major) of a sequence of n tokens run as a fresh sequence.
using LogitsFn = std::function<StatusOr<std::vector<float>>(std::span<const int32_t>)>;

struct PplResult {
  int64_t tokens_scored = 0;
  double total_nll = 0;
  double MeanNll() const;
  double Ppl() const;  // exp(mean NLL)
};

struct CompareResult {
  int64_t tokens_scored = 0;
  double nll_model = 0, nll_ref = 0;  // sums
  double kl_sum = 0;
  int64_t top1_agree = 0;
  double dev_sum = 0;
  double max_deviation = 0;
  int64_t worst_position = -1;  // token index whose prediction deviated most
  int32_t worst_target = -1;    // the token at worst_position
  int32_t worst_vocab = -1;     // vocabulary index of the largest logit difference there

  double MeanKl() const;
  double Top1Agreement() const;  // fraction in [0, 1]
  double PplModel() const;
  double PplRef() const;
  double PplRatio() const;  // PplModel / PplRef
  double MeanDeviation() const;
  // Accumulates one scored position from its two logits rows.
  void Add(std::span<const float> ref, std::span<const float> model, int64_t position,
           int32_t target);
};

// Perplexity of `tokens` under `logits`, windows as above.
StatusOr<PplResult> Perplexity(std::span<const int32_t> tokens, int64_t ctx, int64_t stride,
                               int64_t vocab, const LogitsFn& logits);

// Runs `ref` then `model` on each window (one window of logits of each in memory at a time).
StatusOr<CompareResult> Compare(std::span<const int32_t> tokens, int64_t ctx, int64_t stride,
                                int64_t vocab, const LogitsFn& model, const LogitsFn& ref);

}  // namespace peng::eval
