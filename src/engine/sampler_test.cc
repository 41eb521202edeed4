#include "engine/sampler.h"

#include <gtest/gtest.h>

#include <limits>
#include <random>

#include <cmath>
#include <cstdio>
#include <set>
#include <vector>

#include "engine/sampling_params.h"
#include "kernels/ops.h"

namespace peng {
namespace {

// Draws `n` tokens from fresh copies of `logits` (Sample modifies its input).
std::vector<int32_t> Draw(Sampler& s, const std::vector<float>& logits, int n,
                          const TokenHistory& h = TokenHistory()) {
  std::vector<int32_t> ids;
  ids.reserve(n);
  std::vector<float> row;
  for (int i = 0; i < n; ++i) {
    row = logits;
    ids.push_back(s.Sample(row.data(), static_cast<int64_t>(row.size()), h));
  }
  return ids;
}

std::vector<double> Frequencies(const std::vector<int32_t>& ids, size_t vocab) {
  std::vector<double> f(vocab, 0.0);
  for (int32_t id : ids) f[id] += 1.0;
  for (double& x : f) x /= static_cast<double>(ids.size());
  return f;
}

std::vector<float> LogsOf(const std::vector<double>& probs) {
  std::vector<float> l;
  for (double p : probs) l.push_back(static_cast<float>(std::log(p)));
  return l;
}

TEST(SamplerTest, GreedyIsArgmaxWithTiesToLowestId) {
  Sampler s(SamplingParams{.temperature = 0.0f});
  std::vector<float> logits = {1.0f, 5.0f, 3.0f, 5.0f, -2.0f};
  EXPECT_EQ(s.Sample(logits.data(), 5, TokenHistory()), 1);
  std::vector<float> all_equal(7, 0.25f);
  EXPECT_EQ(s.Sample(all_equal.data(), 7, TokenHistory()), 0);
  std::vector<float> last = {-1.0f, -1.0f, -0.5f};
  EXPECT_EQ(Sampler::Argmax(last.data(), 3), 2);
}

TEST(SamplerTest, TopKOneEqualsGreedyAtAnyTemperature) {
  std::vector<float> logits = {0.3f, 2.0f, -1.0f, 2.0f, 1.9f, 0.0f};
  for (float t : {0.5f, 1.0f, 7.0f, 100.0f}) {
    Sampler s(SamplingParams{.temperature = t, .top_k = 1, .seed = 7});
    for (int32_t id : Draw(s, logits, 200)) EXPECT_EQ(id, 1) << "temperature " << t;
  }
}

TEST(SamplerTest, TinyTopPKeepsOnlyTheMax) {
  std::vector<float> logits = {2.0f, 7.0f, 7.0f, 6.9f, 1.0f};
  Sampler s(SamplingParams{.temperature = 5.0f, .top_p = 1e-6f, .seed = 3});
  for (int32_t id : Draw(s, logits, 500)) EXPECT_EQ(id, 1);
}

TEST(SamplerTest, TopPNucleusIsTheExactPrefix) {
  // 1000 equal logits: the nucleus for top_p = 0.5 is exactly ids 0..499 (ties -> lower id),
  // which also crosses the first lazily sorted chunk.
  std::vector<float> logits(1000, 0.0f);
  Sampler s(SamplingParams{.top_p = 0.5f, .seed = 11});
  std::set<int32_t> seen;
  for (int32_t id : Draw(s, logits, 20000)) {
    ASSERT_LT(id, 500);
    seen.insert(id);
  }
  EXPECT_EQ(seen.size(), 500u);
}

TEST(SamplerTest, TopPRenormalisesOverTheNucleus) {
  const std::vector<float> logits = LogsOf({0.5, 0.3, 0.15, 0.05});
  Sampler s(SamplingParams{.top_p = 0.75f, .seed = 5});
  std::vector<double> f = Frequencies(Draw(s, logits, 100000), 4);
  EXPECT_EQ(f[2], 0.0);
  EXPECT_EQ(f[3], 0.0);
  EXPECT_NEAR(f[0], 0.5 / 0.8, 0.01);
}

TEST(SamplerTest, MinPDropsTokensBelowTheRatio) {
  const std::vector<float> logits = LogsOf({0.5, 0.3, 0.15, 0.05});
  // Keep p >= 0.5 * 0.5 = 0.25: ids 0 and 1.
  for (int top_k : {0, 3}) {  // the full-vocab and the top-k candidate paths
    Sampler s(SamplingParams{.top_k = top_k, .min_p = 0.5f, .seed = 9});
    std::vector<double> f = Frequencies(Draw(s, logits, 100000), 4);
    EXPECT_EQ(f[2], 0.0) << "top_k " << top_k;
    EXPECT_EQ(f[3], 0.0) << "top_k " << top_k;
    EXPECT_NEAR(f[0], 0.5 / 0.8, 0.01) << "top_k " << top_k;
  }
}

TEST(SamplerTest, TopKKeepsTheKLargest) {
  std::vector<float> logits = {1.0f, 4.0f, 3.0f, 4.0f, 0.0f, 2.0f};
  Sampler s(SamplingParams{.temperature = 50.0f, .top_k = 3, .seed = 1});
  std::vector<double> f = Frequencies(Draw(s, logits, 30000), 6);
  EXPECT_GT(f[1], 0.0);
  EXPECT_GT(f[2], 0.0);
  EXPECT_GT(f[3], 0.0);
  EXPECT_EQ(f[0] + f[4] + f[5], 0.0);
}

TEST(SamplerTest, RepetitionPenaltyDividesPositiveAndMultipliesNegative) {
  const float rep = 1.3f;
  Sampler s(SamplingParams{.repetition_penalty = rep});
  std::vector<int32_t> prompt = {0, 1};
  TokenHistory h(prompt);
  h.Append(2);
  std::vector<float> l = {2.0f, -1.0f, 0.5f, 3.0f, 0.0f};
  s.ApplyPenalties(l.data(), 5, h);
  EXPECT_EQ(l[0], 2.0f / rep);
  EXPECT_EQ(l[1], -1.0f * rep);
  EXPECT_EQ(l[2], 0.5f / rep);
  EXPECT_EQ(l[3], 3.0f);  // unseen
  EXPECT_EQ(l[4], 0.0f);  // unseen
}

TEST(SamplerTest, PresenceAndFrequencyPenaltiesCountOnlyOutput) {
  const float presence = 0.5f, frequency = 0.25f, rep = 1.3f;
  Sampler s(SamplingParams{.repetition_penalty = rep,
                           .presence_penalty = presence,
                           .frequency_penalty = frequency});
  std::vector<int32_t> prompt = {0, 1};
  TokenHistory h(prompt);
  h.Append(2);
  h.Append(2);
  h.Append(1);
  h.Append(4);
  std::vector<float> l = {2.0f, -1.0f, 0.5f, 3.0f, 1.5f};
  s.ApplyPenalties(l.data(), 5, h);
  EXPECT_EQ(l[0], 2.0f / rep);  // prompt only: repetition penalty, no presence/frequency
  EXPECT_EQ(l[1], -1.0f * rep - (presence + frequency * 1.0f));
  EXPECT_EQ(l[2], 0.5f / rep - (presence + frequency * 2.0f));
  EXPECT_EQ(l[3], 3.0f);
  EXPECT_EQ(l[4], 1.5f / rep - (presence + frequency * 1.0f));

  Sampler only_freq(SamplingParams{.frequency_penalty = -1.5f});
  std::vector<float> m = {2.0f, -1.0f, 0.5f, 3.0f, 1.5f};
  only_freq.ApplyPenalties(m.data(), 5, h);
  EXPECT_EQ(m[0], 2.0f);
  EXPECT_EQ(m[1], -1.0f + 1.5f);
  EXPECT_EQ(m[2], 0.5f + 3.0f);
  EXPECT_EQ(m[4], 1.5f + 1.5f);
}

TEST(SamplerTest, PenaltiesChangeTheGreedyChoice) {
  Sampler s(SamplingParams{.temperature = 0.0f, .presence_penalty = 2.0f});
  TokenHistory h;
  h.Append(0);
  std::vector<float> l = {3.0f, 2.0f};
  EXPECT_EQ(s.Sample(l.data(), 2, h), 1);
  EXPECT_EQ(l[0], 1.0f);
}

TEST(SamplerTest, TokenHistoryCounts) {
  std::vector<int32_t> prompt = {5, 6, 5};
  TokenHistory h(prompt);
  h.Append(6);
  h.Append(9);
  h.Append(6);
  EXPECT_EQ(h.prompt(), prompt);
  EXPECT_EQ(h.output(), (std::vector<int32_t>{6, 9, 6}));
  ASSERT_EQ(h.distinct().size(), 3u);
  EXPECT_EQ(h.distinct()[0].id, 5);
  EXPECT_EQ(h.distinct()[0].output_count, 0);
  EXPECT_EQ(h.distinct()[1].id, 6);
  EXPECT_EQ(h.distinct()[1].output_count, 2);
  EXPECT_EQ(h.distinct()[2].id, 9);
  EXPECT_EQ(h.OutputCount(9), 1);
  EXPECT_EQ(h.OutputCount(5), 0);
  EXPECT_EQ(h.OutputCount(1234), 0);
}

// SampleTop on a row's best logits (what a device returns instead of the row) draws the same
// tokens as Sample on the whole row, seed for seed, under every parameter set that needs no
// more than the list: greedy, top-k with and without top-p, min-p and temperature.
TEST(SamplerTest, SampleTopEqualsSampleOnTheWholeRow) {
  const int64_t vocab = 5000;
  const int kList = 128;
  std::mt19937 gen(7);
  std::normal_distribution<float> nd(0.f, 2.f);
  int compared = 0;
  for (int row_i = 0; row_i < 4; ++row_i) {
    std::vector<float> row(vocab);
    for (float& v : row) v = std::round(nd(gen) * 4.f) / 4.f;  // ties among the best
    std::vector<float> val(kList);
    std::vector<int32_t> id(kList);
    kernels::TopK(row.data(), vocab, kList, val.data(), id.data());
    for (float temp : {0.f, 0.7f, 1.f, 1.5f})
      for (int top_k : {0, 1, 2, 20, 64, 100})  // (past 64 the sampler takes nth_element)
        for (float top_p : {1.f, 0.9f, 0.3f})
          for (float min_p : {0.f, 0.05f}) {
            SamplingParams p;
            p.temperature = temp;
            p.top_k = top_k;
            p.top_p = top_p;
            p.min_p = min_p;
            p.seed = 100 + row_i;
            const int need = Sampler::TopNeeded(p);
            if (temp == 0.f || top_k == 1) {
              EXPECT_EQ(need, 1);
            } else {
              EXPECT_EQ(need, top_k);  // 0: random sampling over the whole row
            }
            if (need == 0) continue;
            Sampler whole(p), top(p);
            for (int i = 0; i < 30; ++i) {
              std::vector<float> r = row;
              ASSERT_EQ(top.SampleTop(val.data(), id.data(), kList),
                        whole.Sample(r.data(), vocab, TokenHistory()))
                  << "temp " << temp << " top_k " << top_k << " top_p " << top_p << " min_p "
                  << min_p << " draw " << i;
              ++compared;
            }
          }
  }
  EXPECT_EQ(compared, 4 * (3 * 5 * 3 * 2 + 1 * 6 * 3 * 2) * 30);
}

// With penalties, what a device returns is of the penalized row (it applies them first:
// Device::EditLogits, kernels::PenalizedLogit): SampleTop, SampleDrawn and SampleNucleus on
// that give Sample's tokens on the raw row and the history, seed for seed.
TEST(SamplerTest, ListsOfThePenalizedRowEqualSampleWithPenalties) {
  const int64_t vocab = 1000;
  std::mt19937 gen(5);
  std::normal_distribution<float> nd(0.f, 2.f);
  std::vector<float> row(vocab);
  for (float& v : row) v = nd(gen);
  TokenHistory history(std::vector<int32_t>{3, 17, 17, 400});
  std::vector<int32_t> best_ids(8);
  std::vector<float> best_vals(8);
  kernels::TopK(row.data(), vocab, 8, best_vals.data(), best_ids.data());
  for (int32_t id : best_ids) history.Append(id);  // (the best are penalized)
  history.Append(best_ids[0]);
  const int n = 64;
  int compared = 0;
  for (float temp : {0.f, 0.8f})
    for (int top_k : {0, 1, 20})
      for (float top_p : {1.f, 0.9f}) {
        const SamplingParams p{.temperature = temp, .top_k = top_k, .top_p = top_p,
                               .repetition_penalty = 1.3f, .presence_penalty = 0.5f,
                               .frequency_penalty = 0.7f, .seed = 21};
        Sampler ref(p), dev(p);
        std::vector<float> pen = row;
        ref.ApplyPenalties(pen.data(), vocab, history);
        std::vector<float> val(n);
        std::vector<int32_t> idx(n);
        kernels::TopK(pen.data(), vocab, n, val.data(), idx.data());
        const double total = kernels::TemperatureTotal(pen.data(), vocab, val[0], 1.f / 0.8f);
        for (int i = 0; i < 10; ++i) {
          SCOPED_TRACE(testing::Message() << "temp " << temp << " top_k " << top_k << " top_p "
                                          << top_p << " draw " << i);
          std::vector<float> r = row;
          const int32_t want = ref.Sample(r.data(), vocab, history);
          int32_t got;
          if (Sampler::DrawsInIdOrder(p, vocab)) {
            got = dev.SampleDrawn(val[0], idx[0],
                                  kernels::DrawInIdOrder(pen.data(), vocab, val[0], 1.f / temp,
                                                         dev.PendingUniform()));
          } else if (Sampler::SamplesNucleus(p, vocab)) {
            got = dev.SampleNucleus(val.data(), idx.data(), n, vocab, total);
            if (got < 0) {  // (the whole penalized row: Sample on it without the history)
              r = pen;
              got = dev.Sample(r.data(), vocab, TokenHistory());
            }
          } else {
            ASSERT_GT(Sampler::TopNeeded(p), 0);
            got = dev.SampleTop(val.data(), idx.data(), n);
          }
          ASSERT_EQ(got, want);
          ++compared;
        }
      }
  EXPECT_EQ(compared, 120);
}

// Plain temperature sampling drawn where the logits are (a device's DrawTokens, here
// kernels::DrawInIdOrder as the host device makes it): SampleDrawn on the row's best logit and
// the id drawn with PendingUniform gives Sample's tokens on the whole row, seed for seed, and
// leaves the generator where Sample does -- a row of -inf draws nothing, and the pending uniform
// goes to the next draw, whichever path takes it.
TEST(SamplerTest, SampleDrawnEqualsSampleOnTheWholeRow) {
  const int64_t vocab = 3000;
  std::mt19937 gen(11);
  std::normal_distribution<float> nd(0.f, 3.f);
  std::vector<float> row(vocab), masked(vocab, -std::numeric_limits<float>::infinity());
  for (float& v : row) v = std::round(nd(gen) * 4.f) / 4.f;
  float best;
  int32_t best_id;
  kernels::TopK(row.data(), vocab, 1, &best, &best_id);
  for (float temp : {0.3f, 1.f, 2.5f}) {
    const SamplingParams p{.temperature = temp, .seed = 5};
    ASSERT_TRUE(Sampler::DrawsInIdOrder(p, vocab));
    Sampler whole(p), drawn(p);
    for (int i = 0; i < 200; ++i) {
      SCOPED_TRACE(testing::Message() << "temp " << temp << " draw " << i);
      if (i % 7 == 3) {  // a row masked whole: no draw either way; its pending uniform waits
        std::vector<float> r = masked;
        const double u = drawn.PendingUniform();
        EXPECT_EQ(drawn.PendingUniform(), u);
        EXPECT_EQ(drawn.SampleDrawn(r[0], 0, -1), whole.Sample(r.data(), vocab, TokenHistory()));
        continue;
      }
      if (i % 5 == 1) {  // the whole-row path takes a pending uniform too
        drawn.PendingUniform();
        std::vector<float> r = row;
        EXPECT_EQ(drawn.Sample(r.data(), vocab, TokenHistory()),
                  whole.Sample(row.data(), vocab, TokenHistory()));
        continue;
      }
      const int32_t id =
          kernels::DrawInIdOrder(row.data(), vocab, best, 1.0f / temp, drawn.PendingUniform());
      std::vector<float> r = row;
      ASSERT_EQ(drawn.SampleDrawn(best, best_id, id),
                whole.Sample(r.data(), vocab, TokenHistory()));
    }
  }
  SamplingParams p;
  p.temperature = 1.f;
  p.top_k = static_cast<int>(vocab);  // (the whole vocabulary: no top-k)
  EXPECT_TRUE(Sampler::DrawsInIdOrder(p, vocab));
  for (auto change : std::initializer_list<void (*)(SamplingParams*)>{
           [](SamplingParams* q) { q->temperature = 0.f; },
           [](SamplingParams* q) { q->top_k = 1; },
           [](SamplingParams* q) { q->top_k = 50; },
           [](SamplingParams* q) { q->top_p = 0.9f; },
           [](SamplingParams* q) { q->min_p = 0.1f; }}) {
    SamplingParams q = p;
    change(&q);
    EXPECT_FALSE(Sampler::DrawsInIdOrder(q, vocab));
  }
}

// Top-p / min-p without top-k from a row's best logits and its softmax total (what a device
// returns: TopLogits, DrawTokens' total): SampleNucleus gives Sample's tokens on the whole row,
// seed for seed, wherever it answers; where the nucleus may reach past the list it answers -1
// and draws nothing, and Sample on the whole row then gives the next token of the same stream.
// Both happen here: peaked and flat rows, lists of 64 and of the whole row.
TEST(SamplerTest, SampleNucleusEqualsSampleOnTheWholeRow) {
  const int64_t vocab = 2000;
  std::mt19937 gen(3);
  int answered = 0, whole_needed = 0;
  for (float spread : {0.5f, 4.f}) {  // (flat: nuclei of hundreds; peaked: of a few)
    std::normal_distribution<float> nd(0.f, spread);
    std::vector<float> row(vocab);
    for (float& v : row) v = std::round(nd(gen) * 8.f) / 8.f;  // ties
    for (int n : {64, static_cast<int>(vocab)}) {
      std::vector<float> val(n);
      std::vector<int32_t> id(n);
      kernels::TopK(row.data(), vocab, n, val.data(), id.data());
      for (float temp : {0.5f, 1.f, 1.7f})
        for (float top_p : {1.f, 0.95f, 0.6f, 0.1f})
          for (float min_p : {0.f, 0.02f, 0.3f}) {
            const SamplingParams p{.temperature = temp, .top_p = top_p, .min_p = min_p,
                                   .seed = 9};
            if (top_p == 1.f && min_p == 0.f) {
              EXPECT_FALSE(Sampler::SamplesNucleus(p, vocab));
              continue;
            }
            ASSERT_TRUE(Sampler::SamplesNucleus(p, vocab));
            ASSERT_EQ(Sampler::TopNeeded(p), 0);
            const double total = kernels::TemperatureTotal(row.data(), vocab, val[0], 1.f / temp);
            Sampler whole(p), top(p);
            for (int i = 0; i < 20; ++i) {
              SCOPED_TRACE(testing::Message() << "spread " << spread << " n " << n << " temp "
                                              << temp << " top_p " << top_p << " min_p "
                                              << min_p << " draw " << i);
              std::vector<float> r = row;
              const int32_t want = whole.Sample(r.data(), vocab, TokenHistory());
              int32_t got = top.SampleNucleus(val.data(), id.data(), n, vocab, total);
              if (got < 0) {
                ASSERT_LT(n, vocab);  // (the whole row always answers)
                ++whole_needed;
                r = row;
                got = top.Sample(r.data(), vocab, TokenHistory());
              } else {
                ++answered;
              }
              ASSERT_EQ(got, want);
            }
          }
    }
  }
  EXPECT_GT(answered, 1000);
  EXPECT_GT(whole_needed, 100);
  std::printf("[sampler] %d tokens from the list, %d from the whole row\n", answered,
              whole_needed);
}

TEST(SamplerTest, SameSeedSameDrawsDifferentSeedDifferent) {
  std::vector<float> logits(50);
  for (int i = 0; i < 50; ++i) logits[i] = static_cast<float>((i * 37) % 11) * 0.3f;
  for (SamplingParams p : {SamplingParams{.seed = 42},
                           SamplingParams{.top_k = 20, .top_p = 0.9f, .min_p = 0.01f, .seed = 42}}) {
    Sampler a(p), b(p);
    p.seed = 43;
    Sampler c(p);
    std::vector<int32_t> da = Draw(a, logits, 1000);
    EXPECT_EQ(da, Draw(b, logits, 1000));
    EXPECT_NE(da, Draw(c, logits, 1000));
  }
}

TEST(SamplerTest, EmpiricalFrequenciesMatchTemperedSoftmax) {
  const std::vector<float> logits = {1.0f, 2.0f, 0.5f, 3.0f};
  const float t = 0.7f;
  std::vector<double> expected(4);
  double z = 0.0;
  for (int i = 0; i < 4; ++i) z += expected[i] = std::exp(logits[i] / t);
  for (double& e : expected) e /= z;
  // The plain full-vocab path, and the candidate path (a min_p that removes nothing).
  for (float min_p : {0.0f, 1e-6f}) {
    Sampler s(SamplingParams{.temperature = t, .min_p = min_p, .seed = 2024});
    std::vector<double> f = Frequencies(Draw(s, logits, 200000), 4);
    for (int i = 0; i < 4; ++i) EXPECT_NEAR(f[i], expected[i], 0.01) << "id " << i;
  }
}

TEST(SamplerTest, LargeVocabTopKTopP) {
  const int64_t vocab = 262144;
  std::vector<float> logits(vocab);
  for (int64_t i = 0; i < vocab; ++i) logits[i] = static_cast<float>((i * 7919) % 1000) * 0.01f;
  // The 50 largest logits are 9.99 (ids with i*7919 % 1000 == 999), lowest ids first.
  Sampler s(SamplingParams{.top_k = 50, .top_p = 0.95f, .seed = 1});
  for (int32_t id : Draw(s, logits, 20)) EXPECT_EQ((int64_t{id} * 7919) % 1000, 999);
  Sampler g(SamplingParams{.temperature = 0.0f});
  std::vector<float> row = logits;
  EXPECT_EQ((int64_t{g.Sample(row.data(), vocab, TokenHistory())} * 7919) % 1000, 999);
}

TEST(SamplerTest, TopLogprobsAndLogProb) {
  const std::vector<float> logits = {0.0f, 2.0f, 2.0f, 1.0f};
  const double lse = std::log(1.0 + 2.0 * std::exp(2.0) + std::exp(1.0));
  std::vector<std::pair<int32_t, float>> top;
  Sampler::TopLogprobs(logits.data(), 4, 3, &top);
  ASSERT_EQ(top.size(), 3u);
  EXPECT_EQ(top[0].first, 1);
  EXPECT_EQ(top[1].first, 2);
  EXPECT_EQ(top[2].first, 3);
  EXPECT_FLOAT_EQ(top[0].second, static_cast<float>(2.0 - lse));
  EXPECT_FLOAT_EQ(top[1].second, static_cast<float>(2.0 - lse));
  EXPECT_FLOAT_EQ(top[2].second, static_cast<float>(1.0 - lse));
  EXPECT_FLOAT_EQ(Sampler::LogProb(logits.data(), 4, 0), static_cast<float>(-lse));
  Sampler::TopLogprobs(logits.data(), 4, 10, &top);
  EXPECT_EQ(top.size(), 4u);
  EXPECT_EQ(top[3].first, 0);
  Sampler::TopLogprobs(logits.data(), 4, 0, &top);
  EXPECT_TRUE(top.empty());
}

TEST(SamplerTest, RawLogprobIgnoresPenalties) {
  const std::vector<float> logits = {3.0f, 2.0f, 1.0f};
  Sampler s(SamplingParams{.temperature = 0.0f, .presence_penalty = 2.0f});
  TokenHistory h;
  h.Append(0);
  std::vector<float> row = logits;
  float lp = 0.0f;
  EXPECT_EQ(s.Sample(row.data(), 3, h, &lp), 1);
  EXPECT_FLOAT_EQ(lp, Sampler::LogProb(logits.data(), 3, 1));
}

TEST(SamplingParamsTest, ValidateNamesTheField) {
  EXPECT_TRUE(SamplingParams{}.Validate().ok());
  EXPECT_TRUE((SamplingParams{.temperature = 0.0f, .top_k = -1, .min_p = 1.0f}.Validate().ok()));
  struct Case {
    SamplingParams p;
    const char* field;
  };
  const Case cases[] = {
      {{.temperature = -0.1f}, "temperature"},
      {{.temperature = 101.0f}, "temperature"},
      {{.temperature = NAN}, "temperature"},
      {{.top_k = -2}, "top_k"},
      {{.top_p = 0.0f}, "top_p"},
      {{.top_p = 1.5f}, "top_p"},
      {{.min_p = -0.1f}, "min_p"},
      {{.min_p = 1.1f}, "min_p"},
      {{.repetition_penalty = 0.0f}, "repetition_penalty"},
      {{.presence_penalty = 2.5f}, "presence_penalty"},
      {{.frequency_penalty = -2.5f}, "frequency_penalty"},
      {{.seed = -2}, "seed"},
      {{.max_tokens = 0}, "max_tokens"},
      {{.max_tokens = 4, .min_tokens = 5}, "min_tokens"},
      {{.stop = {"ok", ""}}, "stop"},
      {{.stop_token_ids = {3, -1}}, "stop_token_ids"},
      {{.logprobs = 21}, "logprobs"},
      {{.logprobs = -1}, "logprobs"},
  };
  for (const Case& c : cases) {
    Status st = c.p.Validate();
    EXPECT_EQ(st.code(), StatusCode::kInvalidArgument) << c.field;
    EXPECT_EQ(st.message().rfind(std::string(c.field) + " = ", 0), 0u) << st.message();
  }
  EXPECT_EQ(SamplingParams{.top_p = 1.5f}.Validate().message(), "top_p = 1.500000: must be in (0, 1]");
}

// Non-finite logits never abort or corrupt memory: NaN counts as -inf, +inf wins outright,
// and temperatures too small to divide by act as greedy.
TEST(SamplerTest, NonFiniteLogitsAndTinyTemperatures) {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const float inf = std::numeric_limits<float>::infinity();
  TokenHistory history(std::vector<int32_t>{0, 1});
  for (float t : {1.0f, 2.0f}) {
    for (float top_p : {1.0f, 1e-30f, 0.5f}) {
      for (float min_p : {0.0f, 1.0f}) {
        for (int top_k : {0, 2}) {
          SamplingParams p{.temperature = t, .top_k = top_k, .top_p = top_p, .min_p = min_p,
                           .repetition_penalty = 100.0f, .presence_penalty = -2.0f,
                           .frequency_penalty = 2.0f, .seed = 3};
          Sampler s(p);
          std::vector<float> nans = {nan, 1.0f, nan, 3.0f, nan};
          EXPECT_EQ(s.Sample(nans.data(), 5, history), 3);  // the only finite max left (3.0)
          std::vector<float> all_nan(5, nan);
          const int32_t id = s.Sample(all_nan.data(), 5, history);
          EXPECT_TRUE(id >= 0 && id < 5);
          std::vector<float> pinf = {1.0f, 2.0f, inf, 0.0f, inf};
          EXPECT_EQ(s.Sample(pinf.data(), 5, history), 2);
        }
      }
    }
  }
  for (float t : {1e-40f, 1e-30f, 9e-6f}) {
    Sampler s(SamplingParams{.temperature = t, .top_p = 0.5f, .seed = 1});
    std::vector<float> row = {0.5f, 2.0f, 1.9999f, -1.0f};
    EXPECT_EQ(s.Sample(row.data(), 4, TokenHistory()), 1) << t;
  }
}

}  // namespace
}  // namespace peng
