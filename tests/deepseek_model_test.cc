// DeepSeek-V2 (MLA + DeepSeekMoE) against transformers' own DeepseekV2ForCausalLM in float64:
// tiny random folders written by tools/gen_deepseek_fixtures.py under tests/data/deepseek_tiny/
//   lite       -- F32, q_lora_rank null, greedy top-2 of 8, 1 shared expert, default RoPE,
//                 v_head_dim 12 != qk_nope 16, rms_norm_eps 1e-5 (q_a/kv_a norms use 1e-6)
//   lite_fused -- the same weights with fused 3-D experts (gate_up_proj [E, 2I, D], down_proj
//                 [E, D, I]); scored against lite's reference
//   v2         -- BF16 sharded, q LoRA, group_limited_greedy (4 groups, keep 2), routed scale 16,
//                 YaRN with mscale == mscale_all_dim (RoPE amplitude 1, softmax x mscale^2)
//   mscale     -- F16, mscale 1.0 != mscale_all_dim 0.5 (RoPE amplitude 1.0648), attention bias
// With an F32 KV cache: prompt logits (every position, whole vocabulary), the residual stream
// after every layer (positions 0 and 11) and the logits of 8 cached decode steps all within
// 1e-4 of the reference; greedy continuation identical. The same through the batched Engine
// (mixed lengths, chunked prefill, prefix-cache hits), both MLA forms (absorbed / expanded),
// and the grouped MoE against a per-token loop. Token ids only (no tokenizer in the folders).
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <nlohmann/json.hpp>
#include <numeric>
#include <tuple>

#include "core/test_paths.h"
#include "engine/engine.h"
#include "engine/engine_test_util.h"
#include "engine/llm.h"
#include "formats/gguf_writer.h"
#include "formats/safetensors.h"
#include "kernels/ops.h"
#include "model/deepseek2/deepseek2.h"
#include "model/kv_cache.h"
#include "model/model_files.h"
#include "model/registry.h"

namespace peng {
namespace {

namespace fs = std::filesystem;
using ::peng::test_util::SourceDir;

constexpr double kBound = 1e-4;       // F32 KV cache vs the float64 reference
constexpr double kF16KvBound = 2e-2;  // F16 KV cache

std::string DataDir() { return SourceDir() + "/tests/data/deepseek_tiny"; }
std::string Folder(const std::string& name) { return DataDir() + "/" + name; }
// lite_fused holds lite's weights: it is scored against lite's reference.
std::string GoldenName(const std::string& name) { return name == "lite_fused" ? "lite" : name; }

const nlohmann::json& Golden(const std::string& name) {
  static std::map<std::string, nlohmann::json> cache;
  const std::string g = GoldenName(name);
  auto it = cache.find(g);
  if (it == cache.end()) {
    std::ifstream in(DataDir() + "/" + g + ".golden.json");
    EXPECT_TRUE(in.good()) << g;
    it = cache.emplace(g, nlohmann::json::parse(in)).first;
  }
  return it->second;
}

std::vector<int32_t> Tokens(const std::string& name) {
  return Golden(name)["tokens"].get<std::vector<int32_t>>();
}
std::vector<int32_t> GreedyIds(const std::string& name) {
  return Golden(name)["greedy"].get<std::vector<int32_t>>();
}

// max |a - b| over a row of the reference.
double RowDiff(const float* ours, const nlohmann::json& ref, int64_t n) {
  EXPECT_EQ(static_cast<int64_t>(ref.size()), n);
  double worst = 0;
  for (int64_t i = 0; i < n; ++i) {
    const double d = std::abs(static_cast<double>(ours[i]) - ref[i].get<double>());
    worst = std::isnan(d) ? INFINITY : std::max(worst, d);
  }
  return worst;
}

int64_t Argmax(const float* v, int64_t n) { return std::max_element(v, v + n) - v; }

StatusOr<std::unique_ptr<Llm>> LoadLlm(const std::string& path, DType kv, int max_num_batched_tokens = 512) {
  LlmOptions o;
  o.model_path = path;
  o.threads = 2;
  o.max_model_len = 128;
  o.kv_dtype = kv;
  o.max_num_batched_tokens = max_num_batched_tokens;
  return Llm::Load(o);
}

// Drives a Model directly over its own KV cache with a scrambled block table (blocks of 4
// tokens), so decode steps and hidden states are visible.
class Runner {
 public:
  explicit Runner(const std::string& path, DType kv = DType::kF32) : pool_(2) {
    auto m = LoadModel(path);
    EXPECT_TRUE(m.ok()) << m.status().ToString();
    if (!m.ok()) return;
    model_ = std::move(*m);
    auto kvc = KvCache::Create(model_->kv_spec(), kBlocks, 4, kv);
    EXPECT_TRUE(kvc.ok()) << kvc.status().ToString();
    kv_ = std::move(*kvc);
    table_.resize(kBlocks);
    for (int i = 0; i < kBlocks; ++i) table_[i] = (i * 7 + 3) % kBlocks;  // 7 is prime to 40
  }
  bool ok() const { return model_ && kv_; }
  Model& model() { return *model_; }
  DeepseekV2Model& ds() { return dynamic_cast<DeepseekV2Model&>(*model_); }
  int64_t vocab() const { return model_->config().vocab_size; }

  // Tokens at positions pos0 ...; logits for every token (all) or the last one.
  Status Step(const std::vector<int32_t>& tokens, int64_t pos0, bool all,
              std::vector<float>* logits, std::vector<float>* hidden = nullptr) {
    ForwardBatch b;
    b.tokens = tokens;
    SeqBatchEntry e;
    e.n_tokens = static_cast<int64_t>(tokens.size());
    e.pos0 = pos0;
    e.block_table = table_.data();
    e.n_blocks = kBlocks;
    e.all_logits = all;
    b.seqs.push_back(e);
    b.capture_hidden = hidden;
    logits->assign(b.NumLogitRows() * vocab(), 0.f);
    return model_->Forward(b, kv_.get(), logits->data(), &pool_);
  }
  // Prompt logits, chunk tokens at a time.
  StatusOr<std::vector<float>> Prompt(const std::vector<int32_t>& tokens, int chunk = 1 << 20) {
    std::vector<float> out, part;
    for (size_t p = 0; p < tokens.size(); p += chunk) {
      const size_t n = std::min<size_t>(chunk, tokens.size() - p);
      PENG_RETURN_IF_ERROR(
          Step({tokens.begin() + p, tokens.begin() + p + n}, static_cast<int64_t>(p), true, &part));
      out.insert(out.end(), part.begin(), part.end());
    }
    return out;
  }

 private:
  static constexpr int kBlocks = 40;
  ThreadPool pool_;
  std::unique_ptr<Model> model_;
  std::unique_ptr<KvCache> kv_;
  std::vector<int32_t> table_;
};

double MaxDiff(const std::vector<float>& a, const std::vector<float>& b) {
  EXPECT_EQ(a.size(), b.size());
  double worst = 0;
  for (size_t i = 0; i < std::min(a.size(), b.size()); ++i) {
    const double d = std::abs(static_cast<double>(a[i]) - b[i]);
    worst = std::isnan(d) ? INFINITY : std::max(worst, d);
  }
  return worst;
}

// Prompt logits vs the reference at every position; returns the worst |dlogit|.
double CheckPromptLogits(const std::string& name, const std::vector<float>& logits, double bound) {
  const nlohmann::json& g = Golden(name);
  const int64_t V = 256;
  const auto& ref = g["logits"];
  EXPECT_EQ(logits.size(), ref.size() * V);
  double worst = 0;
  for (size_t pos = 0; pos < ref.size() && (pos + 1) * V <= logits.size(); ++pos) {
    const float* row = logits.data() + pos * V;
    const double d = RowDiff(row, ref[pos], V);
    EXPECT_LE(d, bound) << name << " position " << pos;
    worst = std::max(worst, d);
    const std::vector<double> r = ref[pos].get<std::vector<double>>();
    EXPECT_EQ(Argmax(row, V), std::max_element(r.begin(), r.end()) - r.begin())
        << name << " top-1 at position " << pos;
  }
  return worst;
}

class DeepseekGoldenTest : public ::testing::TestWithParam<std::string> {};

// Prompt logits and the greedy continuation through Llm (the single-sequence runner that
// `peng generate` uses): prefill in one chunk, then cached decode steps.
TEST_P(DeepseekGoldenTest, LlmPromptLogitsAndGreedy) {
  const std::string name = GetParam();
  auto llm = LoadLlm(Folder(name), DType::kF32);
  ASSERT_TRUE(llm.ok()) << llm.status().ToString();
  Llm& m = **llm;
  EXPECT_EQ(m.tokenizer(), nullptr);
  EXPECT_EQ(m.model().config().arch, "deepseek2");
  ASSERT_EQ(m.model().config().vocab_size, 256);
  auto logits = m.PromptLogits(Tokens(name));
  ASSERT_TRUE(logits.ok()) << logits.status().ToString();
  const double worst = CheckPromptLogits(name, *logits, kBound);
  std::printf("[deepseek] %s: prompt max |dlogit| = %.3g\n", name.c_str(), worst);

  SamplingParams sp;
  sp.temperature = 0;
  sp.ignore_eos = true;
  sp.max_tokens = static_cast<int>(GreedyIds(name).size());
  std::vector<int32_t> ids;
  GenerateStats st;
  Status s = m.Generate(
      Tokens(name), sp, [](int32_t, const std::string&) { return true; }, &st, &ids);
  ASSERT_TRUE(s.ok()) << s.ToString();
  EXPECT_EQ(ids, GreedyIds(name)) << "greedy continuation";
}

// Hidden states after every layer (HF hidden_states[i+1]; the last against the raw output of
// the last layer, HF's last entry being post-norm), then the 8 cached decode steps.
TEST_P(DeepseekGoldenTest, HiddenStatesAndDecodeSteps) {
  const std::string name = GetParam();
  const nlohmann::json& g = Golden(name);
  Runner run(Folder(name));
  ASSERT_TRUE(run.ok());
  const std::vector<int32_t> tokens = Tokens(name);
  const int64_t n = static_cast<int64_t>(tokens.size());
  const int64_t D = run.model().config().hidden_size, L = run.model().config().n_layers;
  std::vector<float> logits, hidden;
  ASSERT_TRUE(run.Step(tokens, 0, true, &logits, &hidden).ok());
  ASSERT_EQ(static_cast<int64_t>(hidden.size()), (L + 1) * n * D);
  CheckPromptLogits(name, logits, kBound);
  auto rel = [&](const float* ours, const nlohmann::json& ref) {
    double scale = 1;
    for (const auto& v : ref) scale = std::max(scale, std::abs(v.get<double>()));
    return RowDiff(ours, ref, D) / scale;
  };
  EXPECT_LE(rel(hidden.data() + (n - 1) * D, g["embeddings_last"]), 1e-6) << "embeddings";
  double worst_hidden = 0;
  for (int64_t l = 0; l < L; ++l) {
    const float* layer = hidden.data() + (l + 1) * n * D;
    const bool last = l == L - 1;
    const nlohmann::json& r0 =
        last ? g["final_layer_pre_norm"]["pos0"] : g["hidden_states"]["pos0"][l];
    const nlohmann::json& rn =
        last ? g["final_layer_pre_norm"]["last"] : g["hidden_states"]["last"][l];
    const double d0 = rel(layer, r0), dn = rel(layer + (n - 1) * D, rn);
    EXPECT_LE(d0, kBound) << name << " layer " << l << " position 0";
    EXPECT_LE(dn, kBound) << name << " layer " << l << " last position";
    worst_hidden = std::max({worst_hidden, d0, dn});
  }
  // Decode: feed greedy[i] at position n + i; its logits are decode_logits[i].
  const std::vector<int32_t> greedy = GreedyIds(name);
  const auto& ref = g["decode_logits"];
  ASSERT_EQ(ref.size(), greedy.size());
  EXPECT_EQ(Argmax(logits.data() + (n - 1) * 256, 256), greedy[0]);
  double worst = 0;
  for (size_t i = 0; i < greedy.size(); ++i) {
    ASSERT_TRUE(run.Step({greedy[i]}, n + static_cast<int64_t>(i), false, &logits).ok());
    const double d = RowDiff(logits.data(), ref[i], 256);
    EXPECT_LE(d, kBound) << name << " decode step " << i;
    worst = std::max(worst, d);
    if (i + 1 < greedy.size()) {
      EXPECT_EQ(Argmax(logits.data(), 256), greedy[i + 1]) << i;
    }
  }
  std::printf("[deepseek] %s: hidden max rel diff %.3g, decode max |dlogit| = %.3g\n", name.c_str(),
              worst_hidden, worst);
}

// The softmax scale, RoPE frequencies / amplitude and the latent KV cache size.
TEST_P(DeepseekGoldenTest, ScaleRopeAndCacheSize) {
  const std::string name = GetParam();
  const nlohmann::json& meta = Golden(name)["meta"];
  auto m = LoadModel(Folder(name));
  ASSERT_TRUE(m.ok()) << m.status().ToString();
  auto* ds = dynamic_cast<DeepseekV2Model*>(m->get());
  ASSERT_NE(ds, nullptr);
  EXPECT_NEAR(ds->softmax_scale(), meta["hf_softmax_scaling"].get<double>(), 1e-6);
  EXPECT_NEAR(ds->config().AttentionScale(), meta["hf_softmax_scaling"].get<double>(), 1e-6);
  const kernels::RopeConfig& rope = ds->config().rope;
  EXPECT_EQ(rope.style, kernels::RopeStyle::kInterleaved);
  EXPECT_NEAR(rope.attention_factor, meta["rope_attention_scaling"].get<double>(), 1e-6);
  const std::vector<double> inv = meta["inv_freq"].get<std::vector<double>>();
  ASSERT_EQ(static_cast<int>(inv.size()) * 2, rope.rot_dim);
  std::vector<float> ours(inv.size());
  kernels::ComputeRopeInvFreq(rope, ours.data());
  for (size_t i = 0; i < inv.size(); ++i) EXPECT_NEAR(ours[i], inv[i], 1e-7 * inv[i]) << i;

  const DeepseekV2Config& c = ds->ds_config();
  const int64_t row = c.kv_lora_rank + c.qk_rope_head_dim;
  EXPECT_EQ(ds->kv_spec().BytesPerToken(DType::kF32), ds->config().n_layers * row * 4);
  EXPECT_EQ(ds->kv_spec().BytesPerToken(DType::kF16), ds->config().n_layers * row * 2);
  EXPECT_EQ(ds->config().head_dim, meta["qk_head_dim"].get<int64_t>());
}

// F16 KV cache (the engine's default): same top-1 and greedy ids, logits within 2e-2.
TEST_P(DeepseekGoldenTest, F16KvCache) {
  const std::string name = GetParam();
  auto llm = LoadLlm(Folder(name), DType::kF16);
  ASSERT_TRUE(llm.ok()) << llm.status().ToString();
  auto logits = (*llm)->PromptLogits(Tokens(name));
  ASSERT_TRUE(logits.ok()) << logits.status().ToString();
  const double worst = CheckPromptLogits(name, *logits, kF16KvBound);
  std::printf("[deepseek] %s (F16 KV): prompt max |dlogit| = %.3g\n", name.c_str(), worst);
  SamplingParams sp;
  sp.temperature = 0;
  sp.ignore_eos = true;
  sp.max_tokens = static_cast<int>(GreedyIds(name).size());
  std::vector<int32_t> ids;
  GenerateStats st;
  ASSERT_TRUE((*llm)
                  ->Generate(
                      Tokens(name), sp, [](int32_t, const std::string&) { return true; }, &st, &ids)
                  .ok());
  EXPECT_EQ(ids, GreedyIds(name));
}

// Prefill chunking is invisible: chunks of 1, 3 and 5 tokens (decode-sized steps run the
// absorbed form, bigger ones may run the expanded form) give the reference logits.
TEST_P(DeepseekGoldenTest, ChunkedPrefill) {
  const std::string name = GetParam();
  for (int chunk : {1, 3, 5}) {
    auto llm = LoadLlm(Folder(name), DType::kF32, chunk);
    ASSERT_TRUE(llm.ok()) << llm.status().ToString();
    auto logits = (*llm)->PromptLogits(Tokens(name));
    ASSERT_TRUE(logits.ok()) << logits.status().ToString();
    SCOPED_TRACE("max_num_batched_tokens " + std::to_string(chunk));
    CheckPromptLogits(name, *logits, kBound);
  }
}

// Absorbed (latent) and expanded (per-head K/V) attention agree, for a whole prompt and for
// chunks that continue a cached prefix.
TEST_P(DeepseekGoldenTest, AbsorbedAndExpandedAttentionAgree) {
  const std::string name = GetParam();
  std::vector<std::vector<float>> results;
  for (auto mode :
       {DeepseekV2Model::AttentionMode::kAbsorbed, DeepseekV2Model::AttentionMode::kExpanded}) {
    for (int chunk : {12, 5}) {
      Runner run(Folder(name));
      ASSERT_TRUE(run.ok());
      run.ds().set_attention_mode(mode);
      auto logits = run.Prompt(Tokens(name), chunk);
      ASSERT_TRUE(logits.ok()) << logits.status().ToString();
      CheckPromptLogits(name, *logits, kBound);
      results.push_back(*logits);
    }
  }
  for (size_t i = 1; i < results.size(); ++i)
    EXPECT_LE(MaxDiff(results[0], results[i]), 5e-5) << "variant " << i;
}

// Grouping the batch's tokens by expert gives what a plain per-token loop gives.
TEST_P(DeepseekGoldenTest, GroupedMoeMatchesPerTokenLoop) {
  const std::string name = GetParam();
  std::vector<float> grouped, reference;
  for (bool ref : {false, true}) {
    Runner run(Folder(name));
    ASSERT_TRUE(run.ok());
    run.ds().set_moe_reference(ref);
    auto logits = run.Prompt(Tokens(name));
    ASSERT_TRUE(logits.ok()) << logits.status().ToString();
    (ref ? reference : grouped) = *logits;
  }
  EXPECT_LE(MaxDiff(grouped, reference), 1e-5);
  CheckPromptLogits(name, reference, kBound);
}

INSTANTIATE_TEST_SUITE_P(Fixtures, DeepseekGoldenTest,
                         ::testing::Values("lite", "lite_fused", "v2", "mscale"),
                         [](const auto& info) { return info.param; });

// ---------------------------------------------------------------------------------------------
// Loading details

// The fused 3-D expert tensors slice into exactly the per-expert matrices.
TEST(DeepseekLoadTest, FusedExpertsMatchPerExpertTensors) {
  auto a = LoadModel(Folder("lite"));
  auto b = LoadModel(Folder("lite_fused"));
  ASSERT_TRUE(a.ok() && b.ok());
  std::map<std::string, const Linear*> fused;
  for (const Linear* l : (*b)->Linears()) fused[l->name()] = l;
  int experts = 0;
  for (const Linear* l : (*a)->Linears()) {
    auto it = fused.find(l->name());
    ASSERT_NE(it, fused.end()) << l->name();
    ASSERT_EQ(l->rows(), it->second->rows()) << l->name();
    ASSERT_EQ(l->cols(), it->second->cols()) << l->name();
    std::vector<float> x(l->cols()), y(l->cols());
    for (int64_t r = 0; r < l->rows(); ++r) {
      l->DequantizeRow(r, x.data());
      it->second->DequantizeRow(r, y.data());
      ASSERT_EQ(x, y) << l->name() << " row " << r;
    }
    experts += l->name().find("_exps.weight[") != std::string::npos;
  }
  EXPECT_EQ(experts, 2 * 8 * 3);  // 2 MoE layers x 8 experts x gate/up/down
  EXPECT_EQ((*a)->Linears().size(), (*b)->Linears().size());
}

// Weight bytes per token of a tiny fixture model (2 MoE layers, 8 experts of which 2 are used
// per token): every matrix but the embedding once, the top-k routed experts only; a whole
// attn_kv_b (older files) as the FP32 copy attention reads, per-head attn_k_b / attn_v_b
// (newer files) in their stored type, as decode multiplies by them.
void ExpectWeightBytesPerToken(const Model& m, const std::string& name) {
  const ModelConfig& c = m.config();
  const DeepseekV2Config& dc = dynamic_cast<const DeepseekV2Model&>(m).ds_config();
  int64_t all = c.hidden_size * 4, expert = 0;
  for (const Linear* l : m.Linears()) {
    if (l->name() == "token_embd.weight") continue;
    const bool kvb = l->name().ends_with(".attn_kv_b.weight");
    all += kvb ? l->rows() * l->cols() * 4 : l->bytes();
    if (l->name() == "blk.1.ffn_gate_exps.weight[0]" ||
        l->name() == "blk.1.ffn_up_exps.weight[0]" || l->name() == "blk.1.ffn_down_exps.weight[0]")
      expert += l->bytes();
  }
  const int64_t elem = name == "lite" ? 4 : 2;  // F32 / BF16
  EXPECT_EQ(expert, 3 * dc.moe_intermediate_size * c.hidden_size * elem) << name;
  EXPECT_EQ(m.WeightBytesPerToken(), all - 2 * (8 - 2) * expert) << name;
  std::printf("[deepseek] %s: %s, %lld weight bytes per token\n", name.c_str(),
              m.WeightSummary().c_str(), static_cast<long long>(m.WeightBytesPerToken()));
}

TEST(DeepseekLoadTest, WeightBytesPerTokenCountsActiveExperts) {
  for (const std::string name : {"lite", "v2"}) {
    auto m = LoadModel(Folder(name));
    ASSERT_TRUE(m.ok());
    ExpectWeightBytesPerToken(**m, name);
  }
}

// ---------------------------------------------------------------------------------------------
// The continuous-batching engine

struct Out {
  std::vector<int32_t> ids;
  std::string finish;
};

Out Collect(RequestStream* s) {
  Out o;
  RequestOutput ev;
  bool timed_out = false;
  while (s->Next(&ev, test_util::Patience(), &timed_out)) {
    EXPECT_FALSE(timed_out);
    if (timed_out) break;
    o.ids.insert(o.ids.end(), ev.token_ids.begin(), ev.token_ids.end());
    if (ev.finish_reason) o.finish = *ev.finish_reason;
  }
  return o;
}

std::vector<Out> RunAll(Engine* e, const std::vector<GenerateRequest>& reqs) {
  std::vector<std::shared_ptr<RequestStream>> streams;
  for (const GenerateRequest& r : reqs) {
    auto s = e->Submit(r);
    EXPECT_TRUE(s.ok()) << s.status().ToString();
    if (s.ok()) streams.push_back(*s);
  }
  std::vector<Out> out;
  for (auto& s : streams) out.push_back(Collect(s.get()));
  return out;
}

using test_util::Greedy;

// Single-sequence greedy ids (Llm, F16 KV cache like the engine).
std::vector<int32_t> LlmGreedy(Llm* m, const std::vector<int32_t>& prompt, int n) {
  SamplingParams sp;
  sp.temperature = 0;
  sp.ignore_eos = true;
  sp.max_tokens = n;
  std::vector<int32_t> ids;
  GenerateStats st;
  Status s = m->Generate(
      prompt, sp, [](int32_t, const std::string&) { return true; }, &st, &ids);
  EXPECT_TRUE(s.ok()) << s.ToString();
  return ids;
}

class DeepseekEngineTest : public ::testing::TestWithParam<std::string> {};

// Several requests of mixed lengths at once, prefill chunked by a 5-token step budget, blocks
// of 4 tokens, and requests sharing the golden prompt's prefix after it is cached: every
// request's greedy ids equal the single-sequence run, the golden prompt's the reference.
TEST_P(DeepseekEngineTest, BatchedChunkedPrefixCachedGreedy) {
  const std::string name = GetParam();
  const std::vector<int32_t> golden = Tokens(name);
  EngineOptions o;
  o.model_path = Folder(name);
  o.threads = 2;
  o.max_model_len = 64;
  o.max_num_seqs = 8;
  o.max_num_batched_tokens = 5;
  o.block_size = 4;
  o.enable_prefix_caching = true;
  auto engine = Engine::Create(o);
  ASSERT_TRUE(engine.ok()) << engine.status().ToString();
  Engine& e = **engine;

  // First the golden prompt alone: its full blocks enter the prefix cache.
  std::vector<Out> first = RunAll(&e, {Greedy("golden", golden, 8)});
  ASSERT_EQ(first.size(), 1u);
  EXPECT_EQ(first[0].ids, GreedyIds(name));

  std::vector<GenerateRequest> reqs;
  reqs.push_back(Greedy("again", golden, 8));  // whole prompt cached but the last block
  std::vector<int32_t> shared(golden.begin(), golden.begin() + 9);
  shared.insert(shared.end(), {5, 6, 7, 8, 9, 10});
  reqs.push_back(Greedy("shared", shared, 6));  // 8 cached tokens, then its own tail
  reqs.push_back(Greedy("one", {42}, 10));
  reqs.push_back(Greedy("two", {3, 250}, 7));
  reqs.push_back(Greedy("seven", {9, 8, 7, 6, 5, 4, 3}, 9));
  std::vector<int32_t> longer;
  for (int i = 0; i < 20; ++i) longer.push_back((i * 37 + 11) % 256);
  reqs.push_back(Greedy("twenty", longer, 5));
  std::vector<Out> outs = RunAll(&e, reqs);
  e.Drain();
  const EngineStats st = e.GetStats();
  // The first request found nothing cached; "again" and "shared" find at least 8 tokens each.
  EXPECT_GE(st.prefix_cache_hits, 8 + 8) << "prefix cache hits";
  EXPECT_EQ(st.kv_blocks_used, 0);

  auto llm = LoadLlm(Folder(name), DType::kF16);
  ASSERT_TRUE(llm.ok()) << llm.status().ToString();
  ASSERT_EQ(outs.size(), reqs.size());
  for (size_t i = 0; i < reqs.size(); ++i) {
    EXPECT_EQ(outs[i].finish, "length") << reqs[i].id;
    EXPECT_EQ(outs[i].ids, LlmGreedy(llm->get(), reqs[i].prompt, reqs[i].params.max_tokens))
        << reqs[i].id;
  }
  EXPECT_EQ(outs[0].ids, GreedyIds(name));
  std::printf("[deepseek] %s engine: prefix cache hits %lld tokens, %lld steps\n", name.c_str(),
              static_cast<long long>(st.prefix_cache_hits), static_cast<long long>(st.steps_total));
}

INSTANTIATE_TEST_SUITE_P(Fixtures, DeepseekEngineTest, ::testing::Values("lite", "v2", "mscale"),
                         [](const auto& info) { return info.param; });

// ---------------------------------------------------------------------------------------------
// Broken folders: a copy of lite with one thing changed; the load fails naming the problem.

class TempFolder {
 public:
  explicit TempFolder(const std::string& from) {
    path_ = fs::temp_directory_path() /
            ("peng_ds_" + std::to_string(::getpid()) + "_" + std::to_string(counter_++));
    fs::remove_all(path_);
    fs::create_directories(path_);
    for (const auto& e : fs::directory_iterator(from))
      fs::copy(e.path(), path_ / e.path().filename());
  }
  ~TempFolder() {
    std::error_code ec;
    fs::remove_all(path_, ec);
  }
  std::string path() const { return path_.string(); }
  void EditConfig(const std::function<void(nlohmann::json*)>& edit) {
    const std::string p = path() + "/config.json";
    nlohmann::json cfg = nlohmann::json::parse(std::ifstream(p));
    edit(&cfg);
    std::ofstream(p) << cfg.dump(2);
  }
  // Replaces `from` by `to` (same length) in the safetensors JSON header.
  void EditHeader(const std::string& from, const std::string& to,
                  const std::string& file = "model.safetensors") {
    ASSERT_EQ(from.size(), to.size());
    const std::string p = path() + "/" + file;
    std::fstream f(p, std::ios::in | std::ios::out | std::ios::binary);
    uint64_t n = 0;
    f.read(reinterpret_cast<char*>(&n), 8);
    std::string header(n, '\0');
    f.read(header.data(), static_cast<std::streamsize>(n));
    const size_t at = header.find(from);
    ASSERT_NE(at, std::string::npos) << from;
    header.replace(at, from.size(), to);
    f.seekp(8);
    f.write(header.data(), static_cast<std::streamsize>(n));
  }

 private:
  static inline int counter_ = 0;
  fs::path path_;
};

std::string LoadError(const std::string& path) {
  auto m = LoadModel(path);
  if (m.ok()) return "";
  std::printf("[deepseek] %s\n", m.status().ToString().c_str());
  return m.status().ToString();
}

TEST(DeepseekErrorTest, ConfigWithoutKvLoraRank) {
  TempFolder d(Folder("lite"));
  d.EditConfig([](nlohmann::json* c) { c->erase("kv_lora_rank"); });
  const std::string msg = LoadError(d.path());
  EXPECT_NE(msg.find("kv_lora_rank"), std::string::npos) << msg;
  EXPECT_NE(msg.find("config.json"), std::string::npos) << msg;
}

TEST(DeepseekErrorTest, UnknownTopkMethod) {
  TempFolder d(Folder("lite"));
  d.EditConfig([](nlohmann::json* c) { (*c)["topk_method"] = "bogus_method"; });
  const std::string msg = LoadError(d.path());
  EXPECT_NE(msg.find("topk_method"), std::string::npos) << msg;
  EXPECT_NE(msg.find("bogus_method"), std::string::npos) << msg;
}

TEST(DeepseekErrorTest, GroupsThatDoNotDivideTheExperts) {
  TempFolder d(Folder("lite"));
  d.EditConfig([](nlohmann::json* c) {
    (*c)["topk_method"] = "group_limited_greedy";
    (*c)["n_group"] = 3;
  });
  const std::string msg = LoadError(d.path());
  EXPECT_NE(msg.find("n_group"), std::string::npos) << msg;
}

TEST(DeepseekErrorTest, SigmoidScoringNeedsNoauxTc) {
  TempFolder d(Folder("lite"));
  d.EditConfig([](nlohmann::json* c) { (*c)["scoring_func"] = "sigmoid"; });
  const std::string msg = LoadError(d.path());
  EXPECT_NE(msg.find("scoring_func"), std::string::npos) << msg;
}

TEST(DeepseekErrorTest, NoauxTcNeedsCorrectionBias) {
  TempFolder d(Folder("lite"));
  d.EditConfig([](nlohmann::json* c) { (*c)["topk_method"] = "noaux_tc"; });
  const std::string msg = LoadError(d.path());
  EXPECT_NE(msg.find("e_score_correction_bias"), std::string::npos) << msg;
  EXPECT_NE(msg.find("missing"), std::string::npos) << msg;
}

TEST(DeepseekErrorTest, MissingExpertTensor) {
  TempFolder d(Folder("lite"));
  d.EditHeader("model.layers.1.mlp.experts.3.up_proj.weight",
               "model.layers.1.mlp.experts.3.up_proX.weight");
  const std::string msg = LoadError(d.path());
  EXPECT_NE(msg.find("missing"), std::string::npos) << msg;
  EXPECT_NE(msg.find("model.layers.1.mlp.experts.3.up_proj.weight"), std::string::npos) << msg;
}

TEST(DeepseekErrorTest, KvBWithWrongShape) {
  TempFolder d(Folder("lite"));
  d.EditHeader(
      "\"model.layers.2.self_attn.kv_b_proj.weight\":{\"dtype\":\"F32\",\"shape\":[112,32]",
      "\"model.layers.2.self_attn.kv_b_proj.weight\":{\"dtype\":\"F32\",\"shape\":[32,112]");
  const std::string msg = LoadError(d.path());
  EXPECT_NE(msg.find("model.layers.2.self_attn.kv_b_proj.weight"), std::string::npos) << msg;
  EXPECT_NE(msg.find("[32, 112]"), std::string::npos) << msg;
  EXPECT_NE(msg.find("[112, 32]"), std::string::npos) << msg;
}

TEST(DeepseekErrorTest, MissingLatentNormInShard) {
  TempFolder d(Folder("v2"));
  // v2 is sharded: rename the tensor in its shard and in the index.
  const std::string name = "model.layers.0.self_attn.q_a_layernorm.weight";
  const std::string renamed = "model.layers.0.self_attn.q_a_layernorX.weight";
  const std::string p = d.path() + "/model.safetensors.index.json";
  nlohmann::json idx = nlohmann::json::parse(std::ifstream(p));
  ASSERT_TRUE(idx["weight_map"].contains(name));
  const std::string shard = idx["weight_map"][name].get<std::string>();
  idx["weight_map"][renamed] = shard;
  idx["weight_map"].erase(name);
  std::ofstream(p) << idx.dump(2);
  d.EditHeader(name, renamed, shard);
  const std::string msg = LoadError(d.path());
  EXPECT_NE(msg.find("missing"), std::string::npos) << msg;
  EXPECT_NE(msg.find(name), std::string::npos) << msg;
}

// ---------------------------------------------------------------------------------------------
// GGUF (llama.cpp's deepseek2 layout): the HF fixtures rewritten with the converter's tensor
// names, shapes and metadata -- experts stacked into 3-D ffn_{gate,up,down}_exps, q/k rope
// dims NOT permuted (deepseek2 uses interleaved "normal" RoPE), kv_b either whole (older files)
// or split into attn_k_b = W_UK^T [H, r, d_n] and attn_v_b = W_UV [H, d_v, r] (newer files,
// which also store the MQA view key_length = r + d_r / value_length = r and the real head
// sizes under key_length_mla / value_length_mla).

class GgufFromHf {
 public:
  // Builds the GGUF of fixture `name` at `out`.
  // noaux: DeepSeek-V3-style routing instead (sigmoid gating, exp_probs_b correction bias,
  // normalised top-k weights), for a smoke test of that path.
  static Status Write(const std::string& name, const std::string& out, bool split_kv_b,
                      bool noaux = false) {
    GgufFromHf g;
    g.noaux_ = noaux;
    return g.Run(name, out, split_kv_b);
  }

 private:
  Status Run(const std::string& name, const std::string& out, bool split) {
    const nlohmann::json cfg = nlohmann::json::parse(std::ifstream(Folder(name) + "/config.json"));
    PENG_ASSIGN_OR_RETURN(st_, SafetensorsModel::Open(Folder(name)));
    const int64_t L = cfg["num_hidden_layers"], H = cfg["num_attention_heads"];
    const int64_t D = cfg["hidden_size"], E = cfg["n_routed_experts"];
    const int64_t dn = cfg["qk_nope_head_dim"], dr = cfg["qk_rope_head_dim"];
    const int64_t dv = cfg["v_head_dim"], r = cfg["kv_lora_rank"];
    const int64_t I = cfg["moe_intermediate_size"], dense = cfg["first_k_dense_replace"];
    const std::string a = "deepseek2.";
    w_.AddString("general.architecture", "deepseek2");
    w_.AddString("general.name", "deepseek tiny " + name);
    w_.AddU32(a + "block_count", static_cast<uint32_t>(L));
    w_.AddU32(a + "context_length", cfg["max_position_embeddings"].get<uint32_t>());
    w_.AddU32(a + "embedding_length", static_cast<uint32_t>(D));
    w_.AddU32(a + "feed_forward_length", cfg["intermediate_size"].get<uint32_t>());
    w_.AddU32(a + "attention.head_count", static_cast<uint32_t>(H));
    w_.AddU32(a + "attention.head_count_kv", split ? 1u : static_cast<uint32_t>(H));
    w_.AddF32(a + "attention.layer_norm_rms_epsilon", cfg["rms_norm_eps"].get<float>());
    w_.AddF32(a + "rope.freq_base", cfg["rope_parameters"]["rope_theta"].get<float>());
    w_.AddU32(a + "rope.dimension_count", static_cast<uint32_t>(dr));
    w_.AddU32(a + "vocab_size", cfg["vocab_size"].get<uint32_t>());
    if (!cfg["q_lora_rank"].is_null())
      w_.AddU32(a + "attention.q_lora_rank", cfg["q_lora_rank"].get<uint32_t>());
    w_.AddU32(a + "attention.kv_lora_rank", static_cast<uint32_t>(r));
    if (split) {
      w_.AddU32(a + "attention.key_length", static_cast<uint32_t>(r + dr));
      w_.AddU32(a + "attention.value_length", static_cast<uint32_t>(r));
      w_.AddU32(a + "attention.key_length_mla", static_cast<uint32_t>(dn + dr));
      w_.AddU32(a + "attention.value_length_mla", static_cast<uint32_t>(dv));
    } else {
      w_.AddU32(a + "attention.key_length", static_cast<uint32_t>(dn + dr));
      w_.AddU32(a + "attention.value_length", static_cast<uint32_t>(dv));
    }
    w_.AddU32(a + "leading_dense_block_count", static_cast<uint32_t>(dense));
    w_.AddU32(a + "expert_feed_forward_length", static_cast<uint32_t>(I));
    w_.AddU32(a + "expert_count", static_cast<uint32_t>(E));
    w_.AddU32(a + "expert_used_count", cfg["num_experts_per_tok"].get<uint32_t>());
    w_.AddU32(a + "expert_shared_count", cfg["n_shared_experts"].get<uint32_t>());
    w_.AddF32(a + "expert_weights_scale", cfg["routed_scaling_factor"].get<float>());
    if (cfg["topk_method"] == "group_limited_greedy") {
      w_.AddU32(a + "expert_group_count", cfg["n_group"].get<uint32_t>());
      w_.AddU32(a + "expert_group_used_count", cfg["topk_group"].get<uint32_t>());
    }
    if (noaux_) {
      w_.AddU32(a + "expert_gating_func", 2);
      w_.AddBool(a + "expert_weights_norm", true);
    }
    const nlohmann::json& rp = cfg["rope_parameters"];
    if (rp["rope_type"] == "yarn") {
      w_.AddString(a + "rope.scaling.type", "yarn");
      w_.AddF32(a + "rope.scaling.factor", rp["factor"].get<float>());
      w_.AddU32(a + "rope.scaling.original_context_length",
                rp["original_max_position_embeddings"].get<uint32_t>());
      w_.AddF32(a + "rope.scaling.yarn_log_multiplier", 0.1f * rp["mscale_all_dim"].get<float>());
    }
    PENG_RETURN_IF_ERROR(Copy("model.embed_tokens.weight", "token_embd.weight"));
    PENG_RETURN_IF_ERROR(Copy("model.norm.weight", "output_norm.weight"));
    PENG_RETURN_IF_ERROR(Copy("lm_head.weight", "output.weight"));
    const std::vector<std::pair<std::string, std::string>> names = {
        {"input_layernorm.weight", "attn_norm.weight"},
        {"self_attn.q_proj.weight", "attn_q.weight"},
        {"self_attn.q_a_proj.weight", "attn_q_a.weight"},
        {"self_attn.q_a_layernorm.weight", "attn_q_a_norm.weight"},
        {"self_attn.q_b_proj.weight", "attn_q_b.weight"},
        {"self_attn.kv_a_proj_with_mqa.weight", "attn_kv_a_mqa.weight"},
        {"self_attn.kv_a_layernorm.weight", "attn_kv_a_norm.weight"},
        {"self_attn.o_proj.weight", "attn_output.weight"},
        {"post_attention_layernorm.weight", "ffn_norm.weight"},
        {"mlp.gate_proj.weight", "ffn_gate.weight"},
        {"mlp.up_proj.weight", "ffn_up.weight"},
        {"mlp.down_proj.weight", "ffn_down.weight"},
        {"mlp.gate.weight", "ffn_gate_inp.weight"},
        {"mlp.shared_experts.gate_proj.weight", "ffn_gate_shexp.weight"},
        {"mlp.shared_experts.up_proj.weight", "ffn_up_shexp.weight"},
        {"mlp.shared_experts.down_proj.weight", "ffn_down_shexp.weight"}};
    for (int64_t il = 0; il < L; ++il) {
      const std::string hp = "model.layers." + std::to_string(il) + ".";
      const std::string gp = "blk." + std::to_string(il) + ".";
      for (const auto& [hf, gg] : names)
        if (st_->FindTensor(hp + hf)) PENG_RETURN_IF_ERROR(Copy(hp + hf, gp + gg));
      if (il >= dense && noaux_) {
        std::vector<uint8_t>& b = Buffer(E * sizeof(float));
        for (int64_t e = 0; e < E; ++e) {
          const float v = 0.05f * static_cast<float>((e * 3) % 5) - 0.1f;
          std::memcpy(b.data() + e * sizeof(float), &v, sizeof(float));
        }
        PENG_RETURN_IF_ERROR(
            w_.AddTensor(gp + "exp_probs_b.bias", DType::kF32, {E}, b.data(), b.size()));
      }
      if (il >= dense) {
        for (const char* w : {"gate", "up", "down"}) {
          std::vector<const TensorView*> parts;
          for (int64_t e = 0; e < E; ++e)
            parts.push_back(st_->FindTensor(hp + "mlp.experts." + std::to_string(e) + "." + w +
                                            "_proj.weight"));
          PENG_RETURN_IF_ERROR(Stack(parts, gp + "ffn_" + w + "_exps.weight"));
        }
      }
      const TensorView* kvb = st_->FindTensor(hp + "self_attn.kv_b_proj.weight");
      if (!split) {
        PENG_RETURN_IF_ERROR(Copy(hp + "self_attn.kv_b_proj.weight", gp + "attn_kv_b.weight"));
        continue;
      }
      const size_t es = kvb->size_bytes / kvb->numel();  // F32 / BF16 / F16 elements
      const auto* src = static_cast<const uint8_t*>(kvb->data);
      std::vector<uint8_t>& kb = Buffer(H * r * dn * es);
      std::vector<uint8_t>& vb = Buffer(H * dv * r * es);
      for (int64_t h = 0; h < H; ++h) {
        for (int64_t i = 0; i < dn; ++i)
          for (int64_t j = 0; j < r; ++j)
            std::memcpy(kb.data() + ((h * r + j) * dn + i) * es,
                        src + ((h * (dn + dv) + i) * r + j) * es, es);
        std::memcpy(vb.data() + h * dv * r * es, src + (h * (dn + dv) + dn) * r * es, dv * r * es);
      }
      PENG_RETURN_IF_ERROR(
          w_.AddTensor(gp + "attn_k_b.weight", kvb->dtype, {H, r, dn}, kb.data(), kb.size()));
      PENG_RETURN_IF_ERROR(
          w_.AddTensor(gp + "attn_v_b.weight", kvb->dtype, {H, dv, r}, vb.data(), vb.size()));
    }
    return w_.WriteFile(out);
  }

  Status Copy(const std::string& hf, const std::string& gg) {
    const TensorView* t = st_->FindTensor(hf);
    if (!t) return NotFound(hf);
    return w_.AddTensor(gg, t->dtype, t->shape, t->data, t->size_bytes);
  }
  Status Stack(const std::vector<const TensorView*>& parts, const std::string& gg) {
    for (const TensorView* p : parts)
      if (!p) return NotFound(gg + " part");
    std::vector<uint8_t>& buf = Buffer(parts[0]->size_bytes * parts.size());
    for (size_t e = 0; e < parts.size(); ++e)
      std::memcpy(buf.data() + e * parts[0]->size_bytes, parts[e]->data, parts[0]->size_bytes);
    return w_.AddTensor(gg, parts[0]->dtype,
                        {static_cast<int64_t>(parts.size()), parts[0]->dim(0), parts[0]->dim(1)},
                        buf.data(), buf.size());
  }
  std::vector<uint8_t>& Buffer(size_t n) {
    bufs_.emplace_back(n);
    return bufs_.back();
  }

  bool noaux_ = false;
  GgufWriter w_;
  std::unique_ptr<SafetensorsModel> st_;
  std::deque<std::vector<uint8_t>> bufs_;
};

class DeepseekGgufTest : public ::testing::TestWithParam<std::tuple<std::string, bool>> {};

TEST_P(DeepseekGgufTest, MatchesReference) {
  const auto [name, split] = GetParam();
  const std::string path =
      (fs::temp_directory_path() / ("peng_ds_" + std::to_string(::getpid()) + "_" + name +
                                    (split ? "_split" : "_kvb") + ".gguf"))
          .string();
  ASSERT_TRUE(GgufFromHf::Write(name, path, split).ok());
  {
    Runner run(path);
    ASSERT_TRUE(run.ok());
    EXPECT_EQ(run.model().config().arch, "deepseek2");
    EXPECT_NEAR(run.ds().softmax_scale(), Golden(name)["meta"]["hf_softmax_scaling"].get<double>(),
                1e-6);
    const DeepseekV2Config& c = run.ds().ds_config();
    EXPECT_EQ(c.qk_nope_head_dim, 16);
    EXPECT_EQ(c.v_head_dim, 12);
    EXPECT_EQ(run.model().kv_spec().BytesPerToken(DType::kF32),
              run.model().config().n_layers * (c.kv_lora_rank + c.qk_rope_head_dim) * 4);
    ExpectWeightBytesPerToken(run.model(), name);
    auto logits = run.Prompt(Tokens(name), 5);
    ASSERT_TRUE(logits.ok()) << logits.status().ToString();
    const double worst = CheckPromptLogits(name, *logits, kBound);
    std::vector<float> step;
    const std::vector<int32_t> greedy = GreedyIds(name);
    const int64_t n = static_cast<int64_t>(Tokens(name).size());
    double worst_decode = 0;
    for (size_t i = 0; i < greedy.size(); ++i) {
      ASSERT_TRUE(run.Step({greedy[i]}, n + static_cast<int64_t>(i), false, &step).ok());
      worst_decode =
          std::max(worst_decode, RowDiff(step.data(), Golden(name)["decode_logits"][i], 256));
    }
    EXPECT_LE(worst_decode, kBound);
    std::printf("[deepseek] %s GGUF (%s): prompt max |dlogit| = %.3g, decode %.3g; %zu linears\n",
                name.c_str(), split ? "attn_k_b/attn_v_b" : "attn_kv_b", worst, worst_decode,
                run.model().Linears().size());
  }
  fs::remove(path);
}

INSTANTIATE_TEST_SUITE_P(Fixtures, DeepseekGgufTest,
                         ::testing::Combine(::testing::Values("lite", "v2"), ::testing::Bool()),
                         [](const auto& info) {
                           return std::get<0>(info.param) +
                                  (std::get<1>(info.param) ? "_split_kv_b" : "_kv_b");
                         });

// noaux_tc (DeepSeek-V3 routing: sigmoid scores + correction bias choose, groups scored by their
// top-2 sum, unbiased scores normalised) has no reference fixture: it loads, runs, and the
// grouped MoE equals the per-token loop.
TEST(DeepseekNoauxTest, GgufRoutingSmoke) {
  const std::string path =
      (fs::temp_directory_path() / ("peng_ds_" + std::to_string(::getpid()) + "_noaux.gguf"))
          .string();
  ASSERT_TRUE(GgufFromHf::Write("v2", path, true, /*noaux=*/true).ok());
  std::vector<std::vector<float>> results;
  for (bool ref : {false, true}) {
    Runner run(path);
    ASSERT_TRUE(run.ok());
    EXPECT_EQ(run.ds().ds_config().topk_method, DeepseekV2Config::TopkMethod::kNoauxTc);
    EXPECT_TRUE(run.ds().ds_config().norm_topk_prob);
    run.ds().set_moe_reference(ref);
    auto logits = run.Prompt(Tokens("v2"), 5);
    ASSERT_TRUE(logits.ok()) << logits.status().ToString();
    for (float v : *logits) ASSERT_TRUE(std::isfinite(v));
    results.push_back(*logits);
  }
  EXPECT_LE(MaxDiff(results[0], results[1]), 1e-5);
  fs::remove(path);
}

// The same weights with the config spelled as the Hub checkpoints / transformers 4.x write it:
// top-level rope_theta + rope_scaling {type: yarn, ...}, torch_dtype, the remote code's extra
// fields (moe_layer_freq, scoring_func, aux_loss_alpha, seq_aux), no head_dim / qk_head_dim.
class DeepseekLegacyConfigTest : public ::testing::TestWithParam<std::string> {};

TEST_P(DeepseekLegacyConfigTest, MatchesReference) {
  const std::string name = GetParam();
  TempFolder d(Folder(name));
  d.EditConfig([](nlohmann::json* c) {
    const nlohmann::json rp = (*c)["rope_parameters"];
    c->erase("rope_parameters");
    c->erase("head_dim");
    c->erase("qk_head_dim");
    (*c)["torch_dtype"] = (*c)["dtype"];
    c->erase("dtype");
    (*c)["rope_theta"] = rp["rope_theta"];
    if (rp["rope_type"] == "yarn") {
      nlohmann::json rs = rp;
      rs.erase("rope_type");
      rs.erase("rope_theta");
      rs["type"] = "yarn";
      (*c)["rope_scaling"] = rs;
    } else {
      (*c)["rope_scaling"] = nullptr;
    }
    (*c)["moe_layer_freq"] = 1;
    (*c)["scoring_func"] = "softmax";
    (*c)["aux_loss_alpha"] = 0.001;
    (*c)["seq_aux"] = true;
  });
  Runner run(d.path());
  ASSERT_TRUE(run.ok());
  EXPECT_NEAR(run.ds().softmax_scale(), Golden(name)["meta"]["hf_softmax_scaling"].get<double>(),
              1e-6);
  EXPECT_NEAR(run.model().config().rope.attention_factor,
              Golden(name)["meta"]["rope_attention_scaling"].get<double>(), 1e-6);
  auto logits = run.Prompt(Tokens(name), 7);
  ASSERT_TRUE(logits.ok()) << logits.status().ToString();
  CheckPromptLogits(name, *logits, kBound);
}

INSTANTIATE_TEST_SUITE_P(Fixtures, DeepseekLegacyConfigTest,
                         ::testing::Values("lite", "v2", "mscale"),
                         [](const auto& info) { return info.param; });

}  // namespace
}  // namespace peng
