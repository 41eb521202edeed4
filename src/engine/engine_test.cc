// Engine tests on the tiny random HF models (token ids only) and, when present, SmolLM2
// (tokenizer, stop strings). Greedy outputs must not depend on what else runs in the batch.
#include "engine/engine.h"

#include <gtest/gtest.h>

#include "core/test_paths.h"
#include <sys/stat.h>

#include <cmath>
#include <cstdlib>
#include <random>
#include <thread>

#include "engine/engine_test_util.h"
#include "engine/llm.h"
#include "model/registry.h"

namespace peng {
namespace {

using Ids = std::vector<int32_t>;

using ::peng::test_util::SourceDir;
std::string TinyModel(const std::string& arch) { return SourceDir() + "/tests/data/hf_tiny/" + arch; }
std::string SmolLm() { return test_util::ModelFile("smollm2-135m-instruct-q4_1.gguf"); }

using test_util::Collect;
using test_util::Greedy;
using test_util::Result;
using test_util::RunBatch;
using test_util::RunOne;

// `count` greedy requests with prompts of 1..max_prompt random tokens and 1..24 new tokens.
std::vector<GenerateRequest> MixedRequests(int count, int max_prompt, int vocab, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::vector<GenerateRequest> reqs(count);
  for (int i = 0; i < count; ++i) {
    reqs[i].id = "r" + std::to_string(i);
    const int len = 1 + static_cast<int>(rng() % max_prompt);
    for (int t = 0; t < len; ++t) reqs[i].prompt.push_back(static_cast<int32_t>(rng() % vocab));
    reqs[i].params.temperature = 0;
    reqs[i].params.ignore_eos = true;
    reqs[i].params.max_tokens = 1 + static_cast<int>(rng() % 24);
  }
  return reqs;
}

std::unique_ptr<Engine> MakeEngine(EngineOptions o) {
  if (o.threads == 0) o.threads = 2;
  auto e = Engine::Create(o);
  EXPECT_TRUE(e.ok()) << e.status().ToString();
  return e.ok() ? std::move(*e) : nullptr;
}

// Bytes of a KV cache of `blocks` blocks of 16 tokens for `path`.
int64_t KvBytes(const std::string& path, int64_t blocks) {
  auto m = LoadModel(path);
  EXPECT_TRUE(m.ok());
  return (*m)->kv_spec().BytesPerToken(DType::kF16) * 16 * blocks;
}

void ExpectAllFreed(Engine* e) { test_util::ExpectIdleAndFreed(e); }

class TinyEngineTest : public ::testing::TestWithParam<std::string> {};

// Alone vs a batch of 64 vs a pool too small (preemption) vs small chunks: same tokens.
TEST_P(TinyEngineTest, GreedyOutputDoesNotDependOnTheBatch) {
  const std::string path = TinyModel(GetParam());
  auto reqs = MixedRequests(64, 60, 256, 7);
  auto alone_engine = MakeEngine({.model_path = path, .max_model_len = 256});
  ASSERT_TRUE(alone_engine);
  std::vector<Result> alone;
  for (const GenerateRequest& r : reqs) alone.push_back(RunOne(alone_engine.get(), r));
  ExpectAllFreed(alone_engine.get());

  auto batched = MakeEngine({.model_path = path, .max_model_len = 256});
  std::vector<Result> got = RunBatch(batched.get(), reqs);
  for (size_t i = 0; i < reqs.size(); ++i) {
    EXPECT_EQ(got[i].tokens[0], alone[i].tokens[0]) << "request " << i << " in a batch of 64";
    EXPECT_EQ(got[i].finish[0], "length");
    EXPECT_EQ(got[i].tokens[0].size(), static_cast<size_t>(reqs[i].params.max_tokens));
  }
  ExpectAllFreed(batched.get());
  EngineStats st = batched->GetStats();
  EXPECT_GT(st.steps_total, 0);
  EXPECT_LT(st.steps_total, 200);  // batched: far fewer steps than tokens
  EXPECT_EQ(st.requests_finished_total, 64);

  // 24 blocks of 16 tokens for 64 requests of up to 84 tokens: preemption must kick in.
  auto small = MakeEngine({.model_path = path, .max_model_len = 256,
                           .kv_cache_bytes = KvBytes(path, 24)});
  got = RunBatch(small.get(), reqs);
  for (size_t i = 0; i < reqs.size(); ++i)
    EXPECT_EQ(got[i].tokens[0], alone[i].tokens[0]) << "request " << i << " with preemption";
  EXPECT_GT(small->GetStats().num_preemptions_total, 0);
  EXPECT_EQ(small->GetStats().kv_blocks_total, 24);
  ExpectAllFreed(small.get());

  auto chunked = MakeEngine({.model_path = path, .max_model_len = 256,
                             .max_num_batched_tokens = 7, .enable_prefix_caching = false});
  got = RunBatch(chunked.get(), reqs);
  for (size_t i = 0; i < reqs.size(); ++i)
    EXPECT_EQ(got[i].tokens[0], alone[i].tokens[0]) << "request " << i << " in chunks of 7";
  ExpectAllFreed(chunked.get());
}

// Seeded random sampling (temperature, top-p, min-p, top-k past the one-pass limit, logprobs,
// penalties, logit_bias, a request that forks) alone vs in a batch of 32: the same tokens and
// logprobs -- a step's rows are chosen on the pool's threads, each from its own row and sampler.
TEST(EngineTest, SeededSamplingDoesNotDependOnTheBatch) {
  auto reqs = MixedRequests(32, 30, 256, 11);
  for (size_t i = 0; i < reqs.size(); ++i) {
    SamplingParams& p = reqs[i].params;
    p.temperature = 0.6f + 0.05f * static_cast<float>(i % 8);
    p.seed = 1000 + static_cast<int64_t>(i);
    p.top_p = i % 3 == 0 ? 0.9f : 1.f;
    p.min_p = i % 5 == 0 ? 0.02f : 0.f;
    p.top_k = i % 4 == 1 ? 100 : 0;
    p.want_logprobs = i % 6 == 2;
    p.logprobs = p.want_logprobs ? 2 : 0;
    if (i % 7 == 3) p.presence_penalty = 0.5f;
    if (i % 9 == 4) p.logit_bias = {{5, 2.f}};
  }
  reqs[5].n = 2;
  auto alone_engine = MakeEngine({.model_path = TinyModel("llama"), .max_model_len = 256});
  ASSERT_TRUE(alone_engine);
  std::vector<Result> alone;
  for (const GenerateRequest& r : reqs) alone.push_back(RunOne(alone_engine.get(), r));
  auto batched = MakeEngine({.model_path = TinyModel("llama"), .max_model_len = 256});
  const std::vector<Result> got = RunBatch(batched.get(), reqs);
  for (size_t i = 0; i < reqs.size(); ++i) {
    SCOPED_TRACE(i);
    EXPECT_EQ(got[i].error, "");
    ASSERT_EQ(got[i].tokens.size(), alone[i].tokens.size());
    for (size_t j = 0; j < got[i].tokens.size(); ++j) {
      EXPECT_EQ(got[i].tokens[j], alone[i].tokens[j]);
      ASSERT_EQ(got[i].logprobs[j].size(), alone[i].logprobs[j].size());
      for (size_t t = 0; t < got[i].logprobs[j].size(); ++t) {
        // (a batch's matrix products may round the logits otherwise than one row's)
        EXPECT_NEAR(got[i].logprobs[j][t].logprob, alone[i].logprobs[j][t].logprob, 1e-4);
        ASSERT_EQ(got[i].logprobs[j][t].top.size(), alone[i].logprobs[j][t].top.size());
        for (size_t u = 0; u < got[i].logprobs[j][t].top.size(); ++u) {
          EXPECT_EQ(got[i].logprobs[j][t].top[u].first, alone[i].logprobs[j][t].top[u].first);
          EXPECT_NEAR(got[i].logprobs[j][t].top[u].second, alone[i].logprobs[j][t].top[u].second,
                      1e-4);
        }
      }
    }
  }
  EXPECT_EQ(got[2].logprobs[0].size(), got[2].tokens[0].size());
  ExpectAllFreed(batched.get());
}

INSTANTIATE_TEST_SUITE_P(Archs, TinyEngineTest, ::testing::Values("llama", "qwen2", "gemma3"));

Ids Prompt(int n, int32_t first) {
  Ids p;
  for (int i = 0; i < n; ++i) p.push_back((first + 37 * i) % 256);
  return p;
}

TEST(EngineTest, PrefixCacheHitGivesTheSameOutput) {
  auto e = MakeEngine({.model_path = TinyModel("llama")});
  const Ids p = Prompt(40, 3);
  Result a = RunOne(e.get(), Greedy("a", p, 8));
  EXPECT_EQ(e->GetStats().prefix_cache_hits, 0);
  Result b = RunOne(e.get(), Greedy("b", p, 8));
  EXPECT_EQ(b.tokens[0], a.tokens[0]);
  EngineStats st = e->GetStats();
  EXPECT_EQ(st.prefix_cache_queries, 80);
  EXPECT_EQ(st.prefix_cache_hits, 32);  // two full blocks of 16; the rest is recomputed
  ExpectAllFreed(e.get());
}

TEST(EngineTest, NCompletionsShareThePromptAndUseSeedPlusIndex) {
  auto e = MakeEngine({.model_path = TinyModel("qwen2")});
  GenerateRequest r = Greedy("n2", Prompt(21, 5), 12);  // 21: the last prompt block is shared
  r.params.temperature = 1.0f;
  r.params.seed = 5;
  r.n = 2;
  Result two = RunOne(e.get(), r);
  r.n = 1;
  r.id = "s5";
  Result s5 = RunOne(e.get(), r);
  r.params.seed = 6;
  r.id = "s6";
  Result s6 = RunOne(e.get(), r);
  EXPECT_EQ(two.tokens[0], s5.tokens[0]);
  EXPECT_EQ(two.tokens[1], s6.tokens[0]);
  EXPECT_NE(two.tokens[0], two.tokens[1]);
  EXPECT_EQ(two.finish, (std::vector<std::string>{"length", "length"}));
  ExpectAllFreed(e.get());
}

// The aborted request must still be running when Abort arrives: the tiny DeepSeek "serve"
// fixture allows a 4096-token context, so 3 x 4000 tokens cannot finish within the 1 ms poll
// (with the 128-token hf_tiny models, faster kernels let 3 x 98 tokens finish before the abort
// landed and the test failed by timing).
TEST(EngineTest, AbortMidGenerationFreesBlocks) {
  auto e = MakeEngine({.model_path = SourceDir() + "/tests/data/deepseek_tiny/serve"});
  GenerateRequest r = Greedy("long", Prompt(30, 1), 4000);
  r.n = 3;
  r.params.temperature = 0.8f;
  auto s = e->Submit(r);
  ASSERT_TRUE(s.ok());
  auto other = e->Submit(Greedy("short", Prompt(5, 2), 4));
  ASSERT_TRUE(other.ok());
  while (e->GetStats().generation_tokens_total < 6) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  EXPECT_GT(e->GetStats().kv_blocks_used, 0);
  e->Abort("long");
  e->Abort("unknown-id");
  Result rest = Collect(s->get(), 3);
  for (int i = 0; i < 3; ++i) {
    EXPECT_EQ(rest.finish[i], "abort");
    EXPECT_LT(rest.tokens[i].size(), 4000u);
  }
  EXPECT_EQ(Collect(other->get(), 1).finish[0], "length");
  ExpectAllFreed(e.get());
  EXPECT_EQ(e->GetStats().requests_finished_total, 2);
}

TEST(EngineTest, StopTokenIdsAndSubmitErrors) {
  auto e = MakeEngine({.model_path = TinyModel("gemma3"), .max_model_len = 64});
  Result full = RunOne(e.get(), Greedy("full", Prompt(9, 4), 10));
  ASSERT_EQ(full.tokens[0].size(), 10u);
  GenerateRequest r = Greedy("stop", Prompt(9, 4), 10);
  const int32_t stop_id = full.tokens[0][4];
  r.params.stop_token_ids = {stop_id};
  Result stopped = RunOne(e.get(), r);
  const size_t first = std::find(full.tokens[0].begin(), full.tokens[0].end(), stop_id) -
                       full.tokens[0].begin();
  EXPECT_EQ(stopped.tokens[0], Ids(full.tokens[0].begin(), full.tokens[0].begin() + first + 1));
  EXPECT_EQ(stopped.finish[0], "stop");
  // max_model_len ends generation with "length".
  Result capped = RunOne(e.get(), Greedy("cap", Prompt(60, 4), 10));
  EXPECT_EQ(capped.tokens[0].size(), 4u);
  EXPECT_EQ(capped.finish[0], "length");

  EXPECT_EQ(e->Submit(Greedy("x", {}, 4)).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(e->Submit(Greedy("x", {1, 256}, 4)).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(e->Submit(Greedy("x", Prompt(64, 1), 4)).status().code(), StatusCode::kOutOfRange);
  GenerateRequest bad = Greedy("x", {1}, 4);
  bad.params.top_p = 2;
  EXPECT_EQ(e->Submit(bad).status().code(), StatusCode::kInvalidArgument);
  e->Drain();
  EXPECT_EQ(e->Submit(Greedy("late", {1}, 4)).status().code(), StatusCode::kResourceExhausted);
}

TEST(EngineTest, LogprobsAreLogSoftmaxOfTheLogits) {
  const std::string path = TinyModel("llama");
  auto llm = Llm::Load({.model_path = path, .threads = 2});
  ASSERT_TRUE(llm.ok());
  const Ids p = Prompt(11, 9);
  auto logits = (*llm)->PromptLogits(p);
  ASSERT_TRUE(logits.ok());
  const int64_t V = 256;
  const float* last = logits->data() + (p.size() - 1) * V;
  double lse = 0, mx = *std::max_element(last, last + V);
  for (int64_t i = 0; i < V; ++i) lse += std::exp(double(last[i]) - mx);
  lse = mx + std::log(lse);

  auto e = MakeEngine({.model_path = path});
  GenerateRequest r = Greedy("lp", p, 3);
  r.params.want_logprobs = true;
  r.params.logprobs = 5;
  Result got = RunOne(e.get(), r);
  ASSERT_EQ(got.logprobs[0].size(), 3u);
  const TokenLogprob& lp = got.logprobs[0][0];
  EXPECT_EQ(lp.id, got.tokens[0][0]);
  EXPECT_NEAR(lp.logprob, last[lp.id] - lse, 1e-4);
  ASSERT_EQ(lp.top.size(), 5u);
  EXPECT_EQ(lp.top[0].first, lp.id);  // greedy picks the most likely
  for (const auto& [id, v] : lp.top) EXPECT_NEAR(v, last[id] - lse, 1e-4);
  for (size_t i = 1; i < 5; ++i) EXPECT_LE(lp.top[i].second, lp.top[i - 1].second);
  std::string joined;
  for (const TokenLogprob& l : got.logprobs[0]) joined += l.text;
  EXPECT_EQ(joined, got.text[0]);  // each token's share of the text
}

// A random model with a byte-level vocabulary emits tokens that end mid-character: the
// per-token texts (what logprobs report) still concatenate to the output, all valid UTF-8.
TEST(EngineTest, LogprobTextsConcatenateToTheOutput) {
  const std::string path = SourceDir() + "/tests/data/deepseek_tiny/serve";
  auto e = MakeEngine({.model_path = path});
  ASSERT_TRUE(e->tokenizer());
  int partial = 0;
  for (int i = 0; i < 8; ++i) {
    GenerateRequest r = Greedy("lp" + std::to_string(i), {600, 39 + i, 68, 75}, 24);
    r.params.want_logprobs = true;
    Result got = RunOne(e.get(), r);
    ASSERT_EQ(got.logprobs[0].size(), 24u);
    std::string joined;
    for (const TokenLogprob& l : got.logprobs[0]) {
      joined += l.text;
      partial += l.text.empty();
    }
    EXPECT_EQ(joined, got.text[0]);
  }
  std::printf("tokens that ended mid-character: %d of 192\n", partial);
}

// Llm (`peng generate`) and the serving engine are one generation loop (EngineCore): the same
// request gives the same token ids, text and finish reason through both -- with min_tokens
// holding back a stop id, stop strings, seeded sampling, and a byte-level vocabulary whose
// tokens end mid-character (the text flushed at the end is not lost).
TEST(EngineTest, LlmGeneratesExactlyWhatTheEngineDoes) {
  const std::string path = SourceDir() + "/tests/data/deepseek_tiny/serve";
  auto llm = Llm::Load({.model_path = path, .threads = 2, .max_model_len = 256});
  ASSERT_TRUE(llm.ok()) << llm.status().ToString();
  auto e = MakeEngine({.model_path = path, .max_model_len = 256});
  const Ids prompt = {600, 41, 68, 75};
  GenerateRequest base = Greedy("base", prompt, 24);
  const Result free_run = RunOne(e.get(), base);
  ASSERT_EQ(free_run.tokens[0].size(), 24u);
  std::vector<GenerateRequest> cases;
  GenerateRequest r = base;
  r.id = "min";  // the 3rd greedy token is a stop id, but at least 6 tokens must come
  r.params.stop_token_ids = {free_run.tokens[0][2]};
  r.params.min_tokens = 6;
  cases.push_back(r);
  r = base;
  r.id = "stopid";
  r.params.stop_token_ids = {free_run.tokens[0][5]};
  cases.push_back(r);
  r = base;
  r.id = "stopstr";
  if (free_run.text[0].size() > 8) r.params.stop = {free_run.text[0].substr(4, 3)};
  cases.push_back(r);
  r = base;
  r.id = "sampled";
  r.params.temperature = 0.9f;
  r.params.top_k = 20;
  r.params.seed = 7;
  cases.push_back(r);
  for (const GenerateRequest& c : cases) {
    SCOPED_TRACE(c.id);
    const Result want = RunOne(e.get(), c);
    std::string text;
    Ids ids;
    GenerateStats st;
    ASSERT_TRUE((*llm)->Generate(c.prompt, c.params, [&](int32_t, const std::string& t) {
      text += t;
      return true;
    }, &st, &ids).ok());
    EXPECT_EQ(ids, want.tokens[0]);
    EXPECT_EQ(text, want.text[0]);
    EXPECT_EQ(st.finish_reason, want.finish[0]);
    EXPECT_EQ(st.generated_tokens, static_cast<int64_t>(want.tokens[0].size()));
  }
  // min_tokens really held the stop id back.
  EXPECT_GE(RunOne(e.get(), cases[0]).tokens[0].size(), 6u);
}

// A scoring request (prompt logits) computes every prompt position even when the prefix cache
// holds the prompt's blocks, and its rows equal Llm::PromptLogits' (a fresh sequence).
TEST(EngineTest, PromptLogitsBypassThePrefixCache) {
  const std::string path = TinyModel("llama");
  auto e = MakeEngine({.model_path = path, .block_size = 4, .enable_prefix_caching = true});
  const Ids p = Prompt(18, 5);
  RunOne(e.get(), Greedy("warm", p, 2));  // caches the prompt's four full blocks
  GenerateRequest r = Greedy("score", p, 1);
  r.return_prompt_logits = true;
  auto stream = e->Submit(r);
  ASSERT_TRUE(stream.ok());
  std::vector<float> rows;
  RequestOutput ev;
  bool timed_out = false;
  std::string finish;
  while ((*stream)->Next(&ev, test_util::Patience(), &timed_out) && !timed_out) {
    rows.insert(rows.end(), ev.prompt_logits.begin(), ev.prompt_logits.end());
    EXPECT_TRUE(ev.token_ids.empty());  // nothing is sampled
    if (ev.finish_reason) finish = *ev.finish_reason;
  }
  EXPECT_EQ(finish, "length");
  auto llm = Llm::Load({.model_path = path, .threads = 2, .block_size = 4});
  ASSERT_TRUE(llm.ok());
  auto want = (*llm)->PromptLogits(p);
  ASSERT_TRUE(want.ok());
  ASSERT_EQ(rows.size(), p.size() * 256);
  EXPECT_EQ(rows, *want);
}

TEST(EngineTest, SmolLmBatchOf16AndStopStrings) {
  const std::string path = SmolLm();
  if (path.empty()) GTEST_SKIP() << "smollm2-135m-instruct-q4_1.gguf not found";
  auto e = MakeEngine({.model_path = path, .max_model_len = 512});
  ASSERT_TRUE(e->tokenizer());
  auto reqs = MixedRequests(16, 40, 49152, 11);
  for (GenerateRequest& r : reqs) r.params.max_tokens = std::min(r.params.max_tokens, 12);
  std::vector<Result> alone;
  for (const GenerateRequest& r : reqs) alone.push_back(RunOne(e.get(), r));
  std::vector<Result> got = RunBatch(e.get(), reqs);
  for (size_t i = 0; i < reqs.size(); ++i)
    EXPECT_EQ(got[i].tokens[0], alone[i].tokens[0]) << "request " << i << " in a batch of 16";

  auto prompt = e->tokenizer()->Encode("The capital of France is", true);
  GenerateRequest r = Greedy("text", prompt, 24);
  Result full = RunOne(e.get(), r);
  const std::string& text = full.text[0];
  ASSERT_GT(text.size(), 12u) << text;
  const std::string stop = text.substr(6, 4);
  const size_t at = text.find(stop);
  r.id = "stop";
  r.params.stop = {stop, "never-appears-zz"};
  Result s = RunOne(e.get(), r);
  EXPECT_EQ(s.text[0], text.substr(0, at));
  EXPECT_EQ(s.finish[0], "stop");
  r.id = "stop-incl";
  r.params.include_stop_str_in_output = true;
  EXPECT_EQ(RunOne(e.get(), r).text[0], text.substr(0, at + stop.size()));
  ExpectAllFreed(e.get());
}

// Weights read into huge pages (`--huge-pages`) give exactly the logits of weights mapped in
// place, for a GGUF file and a safetensors folder; WeightsInHugePages() keeps the mapping by
// default, on a device, and for a path it cannot size.
TEST(EngineTest, HugePageWeightsGiveTheMappedLogits) {
  const std::string folder = SourceDir() + "/tests/data/deepseek_tiny/serve";
  EXPECT_TRUE(WeightsInHugePages({.model_path = folder, .huge_pages = true}));
  EXPECT_FALSE(WeightsInHugePages({.model_path = folder}));
  EXPECT_FALSE(WeightsInHugePages({.model_path = folder, .device = "cuda", .huge_pages = true}));
  EXPECT_FALSE(WeightsInHugePages({.model_path = folder + "/no_such_model.gguf",
                                   .huge_pages = true}));
  for (const std::string& path : {folder, SmolLm()}) {
    if (path.empty()) continue;
    SCOPED_TRACE(path);
    const Ids prompt = {1, 41, 68, 75, 600, 12};
    std::vector<float> logits[2];
    for (const bool huge : {false, true}) {
      auto llm = Llm::Load({.model_path = path, .threads = 2, .max_model_len = 64,
                            .huge_pages = huge});
      ASSERT_TRUE(llm.ok()) << llm.status().ToString();
      auto l = (*llm)->PromptLogits(prompt);
      ASSERT_TRUE(l.ok()) << l.status().ToString();
      logits[huge] = std::move(*l);
    }
    ASSERT_FALSE(logits[0].empty());
    EXPECT_EQ(logits[0], logits[1]);
  }
}

}  // namespace
}  // namespace peng
