#include "engine/eval.h"

#include <gtest/gtest.h>

#include "core/test_paths.h"
#include <sys/stat.h>

#include <cmath>
#include <cstdlib>
#include <fstream>
#include <sstream>

#include "engine/llm.h"
#include "kernels/ops.h"

namespace peng::eval {
namespace {

using Ids = std::vector<int32_t>;

using ::peng::test_util::SourceDir;

std::string SmolLm() { return test_util::ModelFile("smollm2-135m-instruct-q4_1.gguf"); }

TEST(PlanWindows, MatchesTheStridedScheme) {
  const std::vector<Window> w = PlanWindows(10, 4, 2);
  ASSERT_EQ(w.size(), 4u);
  const int64_t want[4][3] = {{0, 4, 1}, {2, 6, 4}, {4, 8, 6}, {6, 10, 8}};
  for (int i = 0; i < 4; ++i) {
    EXPECT_EQ(w[i].begin, want[i][0]);
    EXPECT_EQ(w[i].end, want[i][1]);
    EXPECT_EQ(w[i].score_begin, want[i][2]);
  }
  EXPECT_TRUE(PlanWindows(1, 4, 2).empty());
  ASSERT_EQ(PlanWindows(3, 512, 256).size(), 1u);  // shorter than one window
}

TEST(PlanWindows, ScoresEveryTokenButTheFirstExactlyOnce) {
  for (int64_t n : {2, 3, 7, 64, 100, 513, 1000}) {
    for (int64_t ctx : {2, 3, 8, 16, 512}) {
      for (int64_t stride : {1, 2, 5, 8, 16, 256, 512, 600}) {
        std::vector<int> count(n, 0);
        for (const Window& w : PlanWindows(n, ctx, stride)) {
          ASSERT_LE(w.end - w.begin, ctx);
          ASSERT_GT(w.score_begin, w.begin);  // the first target has context in the window
          for (int64_t t = w.score_begin; t < w.end; ++t) ++count[t];
        }
        EXPECT_EQ(count[0], 0);
        for (int64_t t = 1; t < n; ++t) {
          ASSERT_EQ(count[t], 1) << "n=" << n << " ctx=" << ctx << " stride=" << stride
                                 << " t=" << t;
        }
      }
    }
  }
}

TEST(Math, TokenNllAndKl) {
  // Logits log(p): softmax gives p back.
  const std::vector<float> p = {std::log(0.5f), std::log(0.25f), std::log(0.25f)};
  const std::vector<float> q = {std::log(0.25f), std::log(0.5f), std::log(0.25f)};
  EXPECT_NEAR(TokenNll(p, 0), std::log(2.0), 1e-6);
  EXPECT_NEAR(TokenNll(p, 2), std::log(4.0), 1e-6);
  EXPECT_EQ(KlDivergence(p, p), 0.0);
  // KL(p||q) = 0.5 ln(0.5/0.25) + 0.25 ln(0.25/0.5) + 0.25 ln 1 = 0.25 ln 2.
  EXPECT_NEAR(KlDivergence(p, q), 0.25 * std::log(2.0), 1e-6);
  // Shifting a row by a constant does not change its distribution.
  std::vector<float> shifted = p;
  for (float& v : shifted) v += 7.0f;
  EXPECT_NEAR(KlDivergence(p, shifted), 0.0, 1e-6);
  EXPECT_EQ(ArgMax(p), 0);
  EXPECT_EQ(ArgMax(q), 1);
}

TEST(Math, RelativeLogitDeviation) {
  const std::vector<float> ref = {0, 1, 2, 3, 4};  // range 4
  std::vector<float> model = ref;
  int32_t worst = -1;
  EXPECT_EQ(RelativeLogitDeviation(ref, model, &worst), 0.0);
  for (float& v : model) v += 3.f;  // a constant shift is no deviation
  EXPECT_NEAR(RelativeLogitDeviation(ref, model, &worst), 0.0, 1e-7);
  model = ref;
  model[2] += 0.2f;
  model[4] -= 0.1f;
  // d - mean(d) = {-.02, -.02, .18, -.02, -.12}: 0.18 / 4.
  EXPECT_NEAR(RelativeLogitDeviation(ref, model, &worst), 0.045, 1e-6);
  EXPECT_EQ(worst, 2);
}

// Vocabulary of 4, token at position i is i % 4; the logits of position i give the next token
// logit ln 3 and the others 0, so p = 1/2 at every scored position and PPL is exactly 2.
TEST(Perplexity, KnownValueAndBookkeeping) {
  Ids tokens(50);
  for (int i = 0; i < 50; ++i) tokens[i] = i % 4;
  std::vector<int> scored_rows(50, 0);
  int windows = 0;
  auto fn = [&](std::span<const int32_t> ids) -> StatusOr<std::vector<float>> {
    const int64_t begin = ids.data() - tokens.data();  // windows are views into `tokens`
    std::vector<float> out(ids.size() * 4, 0.0f);
    for (size_t i = 0; i < ids.size(); ++i) out[i * 4 + (begin + i + 1) % 4] = std::log(3.0f);
    ++windows;
    return out;
  };
  auto r = Perplexity(tokens, 8, 3, 4, fn);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->tokens_scored, 49);
  EXPECT_NEAR(r->MeanNll(), std::log(2.0), 1e-6);
  EXPECT_NEAR(r->Ppl(), 2.0, 1e-5);
  EXPECT_EQ(windows, static_cast<int>(PlanWindows(50, 8, 3).size()));
}

TEST(Compare, IdenticalAndPerturbed) {
  Ids tokens = {0, 1, 2, 0, 1, 2, 0, 1, 2, 0};
  auto ref = [](std::span<const int32_t> ids) -> StatusOr<std::vector<float>> {
    std::vector<float> out(ids.size() * 3);
    for (size_t i = 0; i < ids.size(); ++i) {
      out[i * 3 + 0] = std::log(0.5f);
      out[i * 3 + 1] = std::log(0.25f);
      out[i * 3 + 2] = std::log(0.25f);
    }
    return out;
  };
  auto same = Compare(tokens, 4, 2, 3, ref, ref);
  ASSERT_TRUE(same.ok());
  EXPECT_EQ(same->tokens_scored, 9);
  EXPECT_EQ(same->MeanKl(), 0.0);
  EXPECT_EQ(same->Top1Agreement(), 1.0);
  EXPECT_DOUBLE_EQ(same->PplRatio(), 1.0);
  EXPECT_EQ(same->max_deviation, 0.0);

  // The model swaps the first two probabilities only at position 5 (predicting token 6).
  auto model = [&](std::span<const int32_t> ids) -> StatusOr<std::vector<float>> {
    auto out = ref(ids);
    const int64_t begin = ids.data() - tokens.data();
    for (size_t i = 0; i < ids.size(); ++i) {
      if (begin + static_cast<int64_t>(i) == 5) std::swap((*out)[i * 3], (*out)[i * 3 + 1]);
    }
    return out;
  };
  auto diff = Compare(tokens, 4, 2, 3, model, ref);
  ASSERT_TRUE(diff.ok());
  EXPECT_NEAR(diff->MeanKl(), 0.25 * std::log(2.0) / 9, 1e-7);
  EXPECT_NEAR(diff->Top1Agreement(), 8.0 / 9, 1e-12);
  EXPECT_EQ(diff->worst_position, 6);
  EXPECT_EQ(diff->worst_target, tokens[6]);
  // d = ln2 {-1, 1, 0} (mean 0) against the range ln .5 - ln .25 = ln2: 1 at that position.
  EXPECT_NEAR(diff->max_deviation, 1.0, 1e-6);
  EXPECT_NEAR(diff->MeanDeviation(), 1.0 / 9, 1e-6);
  // Token 6 is 0: the model gives it 1/4 instead of 1/2.
  EXPECT_NEAR(diff->nll_model - diff->nll_ref, std::log(2.0), 1e-6);
}

TEST(Compare, WrongLogitCountIsAnError) {
  Ids tokens = {0, 1, 2};
  auto bad = [](std::span<const int32_t>) -> StatusOr<std::vector<float>> {
    return std::vector<float>(5);
  };
  EXPECT_FALSE(Compare(tokens, 4, 2, 3, bad, bad).ok());
  EXPECT_FALSE(Perplexity(tokens, 4, 2, 3, bad).ok());
}

// SmolLM2 with 8-bit activations against itself with FP32 activations (what
// `peng eval compare -m M --reference M --exact-reference` runs), on 256 tokens.
TEST(CompareRealModel, SmolLm2Int8ActivationsVsExact) {
  const std::string path = SmolLm();
  if (path.empty()) GTEST_SKIP() << "models/smollm2-135m-instruct-q4_1.gguf not present";
  LlmOptions o;
  o.model_path = path;
  o.max_model_len = 128;
  auto model = Llm::Load(o);
  ASSERT_TRUE(model.ok()) << model.status().ToString();
  o.kv_dtype = DType::kF32;
  auto ref = Llm::Load(o);
  ASSERT_TRUE(ref.ok()) << ref.status().ToString();
  std::ifstream f(SourceDir() + "/tests/data/eval/gpl3_excerpt.txt");
  std::stringstream ss;
  ss << f.rdbuf();
  auto ids = (*model)->Encode(ss.str());
  ASSERT_TRUE(ids.ok());
  ASSERT_GE(ids->size(), 256u);
  ids->resize(256);
  auto run = [](Llm& llm, bool exact) {
    return [&llm, exact](std::span<const int32_t> w) {
      kernels::SetExactActivations(exact);
      auto out = llm.PromptLogits(w);
      kernels::SetExactActivations(false);
      return out;
    };
  };
  const int64_t vocab = (*model)->model().config().vocab_size;
  auto r = Compare(*ids, 128, 64, vocab, run(**model, false), run(**ref, true));
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  std::printf("tokens %lld  KL %.5f  top1 %.4f  ppl %.4f / %.4f  ratio %.5f  dev %.4f\n",
              static_cast<long long>(r->tokens_scored), r->MeanKl(), r->Top1Agreement(),
              r->PplModel(), r->PplRef(), r->PplRatio(), r->max_deviation);
  EXPECT_EQ(r->tokens_scored, 255);
  // Measured (x86 AVX2, 2 threads): KL 0.0059, top-1 96.5%, PPL 25.70 vs 25.96 (ratio 0.9899),
  // max deviation 0.064. On 255 tokens the ratio sits just past 1% (the whole excerpt, 2262
  // tokens at ctx 512, gives 1.0034), so the bound here is 2%.
  EXPECT_NEAR(r->PplRatio(), 1.0, 0.02);
  EXPECT_LT(r->MeanKl(), 0.02);
  EXPECT_GE(r->Top1Agreement(), 0.90);
}

}  // namespace
}  // namespace peng::eval
