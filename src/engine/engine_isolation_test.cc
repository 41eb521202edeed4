// Failure isolation: an error that belongs to one request finishes that request with
// finish_reason "error" and frees its blocks; the engine and every other request go on, with
// exactly the tokens they would have produced alone. Runs the tiny random llama model behind
// a wrapper that fails on purpose.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>

#include "core/test_paths.h"
#include "engine/engine.h"
#include "engine/engine_test_util.h"
#include "model/model.h"
#include "model/registry.h"
#include "tokenizer/tokenizer.h"

namespace peng {
namespace {

using Ids = std::vector<int32_t>;

constexpr int32_t kFailForward = 3;  // a batch holding this token fails its Forward()
constexpr int32_t kNanLogits = 5;    // a sequence whose last token is this gets a NaN row
constexpr int32_t kThrow = 6;        // a batch holding this token throws from Forward()

class FaultyModel : public Model {
 public:
  explicit FaultyModel(std::unique_ptr<Model> inner) : inner_(std::move(inner)) {}
  const ModelConfig& config() const override { return inner_->config(); }
  KvCacheSpec kv_spec() const override { return inner_->kv_spec(); }
  Status Forward(const ForwardBatch& batch, KvCache* kv, float* logits,
                 ThreadPool* pool) override {
    for (int32_t t : batch.tokens) {
      if (t == kFailForward) return Internal("injected forward failure");
      if (t == kThrow) throw std::runtime_error("injected exception");
    }
    PENG_RETURN_IF_ERROR(inner_->Forward(batch, kv, logits, pool));
    const int64_t vocab = config().vocab_size;
    int64_t first = 0, row = 0;
    for (const SeqBatchEntry& e : batch.seqs) {
      if (e.want_logits) {
        if (batch.tokens[first + e.n_tokens - 1] == kNanLogits) {
          logits[row * vocab + 1] = std::numeric_limits<float>::quiet_NaN();
        }
        ++row;
      }
      first += e.n_tokens;
    }
    return OkStatus();
  }
  WeightTraffic WeightsPerToken() const override { return inner_->WeightsPerToken(); }
  std::string WeightSummary() const override { return inner_->WeightSummary(); }
  std::vector<const Linear*> Linears() const override { return inner_->Linears(); }

 private:
  std::unique_ptr<Model> inner_;
};

std::unique_ptr<Engine> MakeFaultyEngine() {
  auto m = LoadModel(test_util::SourceDir() + "/tests/data/hf_tiny/llama");
  EXPECT_TRUE(m.ok()) << m.status().ToString();
  EngineOptions o;
  o.threads = 2;
  o.max_model_len = 128;
  o.max_num_seqs = 8;
  auto e = Engine::Create(o, std::make_unique<FaultyModel>(std::move(*m)), nullptr);
  EXPECT_TRUE(e.ok()) << e.status().ToString();
  return std::move(*e);
}

using test_util::Greedy;
using Outcome = test_util::Result;
using test_util::ExpectIdleAndFreed;

std::vector<Outcome> RunAll(Engine* e, const std::vector<GenerateRequest>& reqs) {
  return test_util::RunBatch(e, reqs);
}

TEST(EngineIsolation, ForwardFailureFailsOnlyThatBatchsRequests) {
  auto e = MakeFaultyEngine();
  const Ids good = {10, 11, 12, 13};
  const Ids alone = RunAll(e.get(), {Greedy("alone", good, 6)})[0].tokens[0];
  ASSERT_EQ(alone.size(), 6u);
  // Alone in its step, the poisoned prompt fails by itself; the engine then serves others.
  auto bad = RunAll(e.get(), {Greedy("bad", {7, kFailForward, 8}, 4, /*n=*/3)})[0];
  EXPECT_EQ(bad.finish, (std::vector<std::string>{"error", "error", "error"}));
  EXPECT_EQ(bad.error, "model forward pass failed: injected forward failure");
  auto thrown = RunAll(e.get(), {Greedy("throw", {kThrow, 8}, 4)})[0];
  EXPECT_EQ(thrown.finish[0], "error");
  EXPECT_EQ(thrown.error, "model forward pass failed: exception in the forward pass: injected exception");
  auto after = RunAll(e.get(), {Greedy("after", good, 6)})[0];
  EXPECT_EQ(after.finish[0], "length");
  EXPECT_EQ(after.tokens[0], alone);
  EXPECT_EQ(e->GetStats().requests_failed_total, 2);
  ExpectIdleAndFreed(e.get());
}

TEST(EngineIsolation, NonFiniteLogitsFailOneRequestAndSpareItsBatch) {
  auto e = MakeFaultyEngine();
  const Ids good = {20, 21, 22};
  const Ids alone = RunAll(e.get(), {Greedy("alone", good, 8)})[0].tokens[0];
  // Both in one step: the request whose row is NaN fails, the other is untouched.
  auto out = RunAll(e.get(), {Greedy("nan", {9, kNanLogits}, 8), Greedy("good", good, 8)});
  EXPECT_EQ(out[0].finish[0], "error");
  EXPECT_EQ(out[0].error, "the model produced a non-finite logit (token 1)");
  EXPECT_TRUE(out[0].tokens[0].empty());
  EXPECT_EQ(out[1].finish[0], "length");
  EXPECT_EQ(out[1].tokens[0], alone);
  ExpectIdleAndFreed(e.get());
}

TEST(EngineIsolation, SamplingEdgeValuesNeitherCrashNorFail) {
  auto e = MakeFaultyEngine();
  const Ids prompt = {30, 31, 32, 33};
  const Ids greedy = RunAll(e.get(), {Greedy("greedy", prompt, 6)})[0].tokens[0];
  std::vector<GenerateRequest> reqs;
  for (float t : {1e-40f, 1e-30f, 1e-6f}) {  // denormal and tiny temperatures act as greedy
    GenerateRequest r = Greedy("t" + std::to_string(reqs.size()), prompt, 6);
    r.params.temperature = t;
    r.params.top_p = 0.5f;
    r.params.seed = 1;
    reqs.push_back(r);
  }
  for (float rep : {0.01f, 100.0f}) {  // the extremes of repetition_penalty
    GenerateRequest r = Greedy("rep" + std::to_string(reqs.size()), prompt, 6);
    r.params.temperature = 1.5f;
    r.params.repetition_penalty = rep;
    r.params.top_k = 3;
    r.params.min_p = 0.9f;
    r.params.seed = std::numeric_limits<int64_t>::max() - 1;
    r.n = 2;
    reqs.push_back(r);
  }
  auto out = RunAll(e.get(), reqs);
  for (int i = 0; i < 3; ++i) EXPECT_EQ(out[i].tokens[0], greedy) << i;
  for (size_t i = 3; i < out.size(); ++i) {
    EXPECT_EQ(out[i].finish, (std::vector<std::string>{"length", "length"})) << i;
  }
  // seed + n - 1 past int64 is refused up front.
  GenerateRequest over = Greedy("over", prompt, 2, /*n=*/3);
  over.params.seed = std::numeric_limits<int64_t>::max() - 1;
  auto s = e->Submit(over);
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.status().message().find("seed + n - 1"), std::string::npos);
  ExpectIdleAndFreed(e.get());
}

}  // namespace
}  // namespace peng
