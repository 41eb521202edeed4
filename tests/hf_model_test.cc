// Hugging Face model folders (config.json + safetensors) against transformers itself: tiny
// random models built and scored by tools/gen_hf_tiny_models.py (committed under
// tests/data/hf_tiny/), one per architecture:
//   llama  -- F32, single model.safetensors, untied lm_head
//   qwen2  -- BF16, sharded (model.safetensors.index.json), q/k/v biases, tied head
//   gemma3 -- F16, model_type gemma3_text, sliding (window 4 < prompt) + full layers from
//             layer_types, q/k norms, (1 + w) norms, local RoPE base != global,
//             query_pre_attn_scalar != head_dim, head_dim != hidden / heads
// Every parameter (norm weights and biases included) is random, and the weights were rounded
// to the stored dtype before the float64 eager reference ran, so only peng's FP32 arithmetic
// differs: with an F32 KV cache |dlogit| <= 1e-4 at every position over the whole vocabulary,
// top-1 identical everywhere and the 8-token greedy continuation identical. With the default
// F16 KV cache the bound is 2e-2 (measured <= 9e-3), top-1 and greedy still identical (the
// generator picks seeds whose reference top-2 gaps are all > 0.01).
// The folders have no tokenizer, so everything runs on token ids.
// PENG_TEST_DEVICE (e.g. cuda) runs the model tests through the engine on that device.
#include <gtest/gtest.h>

#include "core/test_paths.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>

#include <nlohmann/json.hpp>

#include "engine/llm.h"
#include "kernels/ops.h"

namespace peng {
namespace {

namespace fs = std::filesystem;

constexpr double kF32KvBound = 1e-4;
constexpr double kF16KvBound = 2e-2;

using ::peng::test_util::SourceDir;

std::string DataDir() { return SourceDir() + "/tests/data/hf_tiny"; }

nlohmann::json LoadGolden(const std::string& arch) {
  std::ifstream in(DataDir() + "/" + arch + ".golden.json");
  EXPECT_TRUE(in.good()) << arch;
  return nlohmann::json::parse(in);
}

StatusOr<std::unique_ptr<Llm>> LoadFolder(const std::string& path, DType kv,
                                          int max_num_batched_tokens = 512) {
  LlmOptions o;
  o.model_path = path;
  o.threads = 2;
  o.max_model_len = 128;
  o.kv_dtype = kv;
  o.max_num_batched_tokens = max_num_batched_tokens;
  // PENG_TEST_DEVICE=cuda: the same checks on an accelerator (scripts/gpu_check.sh).
  if (const char* d = std::getenv("PENG_TEST_DEVICE"); d && *d) o.device = d;
  return Llm::Load(o);
}

// Compares prompt logits and the greedy continuation of `folder` with the reference of `arch`.
void CheckFolder(const std::string& arch, const std::string& folder, DType kv, double bound) {
  const nlohmann::json g = LoadGolden(arch);
  kernels::SetExactActivations(false);  // F32/F16/BF16 weights: activations stay FP32 anyway
  auto llm = LoadFolder(folder, kv);
  ASSERT_TRUE(llm.ok()) << llm.status().ToString();
  Llm& m = **llm;
  EXPECT_EQ(m.tokenizer(), nullptr) << "the fixture has no tokenizer.json";
  const int64_t V = m.model().config().vocab_size;
  ASSERT_EQ(V, 256);
  const std::vector<int32_t> tokens = g["tokens"].get<std::vector<int32_t>>();
  const auto& ref = g["logits"];
  ASSERT_EQ(ref.size(), tokens.size());
  auto logits = m.PromptLogits(tokens);
  ASSERT_TRUE(logits.ok()) << logits.status().ToString();
  ASSERT_EQ(logits->size(), tokens.size() * V);
  double worst = 0;
  size_t worst_pos = 0;
  for (size_t pos = 0; pos < tokens.size(); ++pos) {
    const float* row = logits->data() + pos * V;
    const std::vector<double> r = ref[pos].get<std::vector<double>>();
    ASSERT_EQ(static_cast<int64_t>(r.size()), V);
    for (int64_t i = 0; i < V; ++i) {
      const double d = std::abs(row[i] - r[i]);
      if (d > worst || std::isnan(d)) worst = std::isnan(d) ? INFINITY : d, worst_pos = pos;
    }
    const int64_t ours = std::max_element(row, row + V) - row;
    const int64_t theirs = std::max_element(r.begin(), r.end()) - r.begin();
    EXPECT_EQ(ours, theirs) << "top-1 at position " << pos;
  }
  std::printf("[hf] %s (%s KV): %zu positions x %lld logits, max |dlogit| = %.3g (position %zu)\n",
              arch.c_str(), DTypeName(kv), tokens.size(), static_cast<long long>(V), worst,
              worst_pos);
  EXPECT_LE(worst, bound) << "worst at position " << worst_pos;

  const std::vector<int32_t> ref_ids = g["greedy"].get<std::vector<int32_t>>();
  SamplingParams sp;
  sp.temperature = 0;
  sp.ignore_eos = true;
  sp.max_tokens = static_cast<int>(ref_ids.size());
  std::vector<int32_t> ids;
  GenerateStats st;
  Status s = m.Generate(tokens, sp, [](int32_t, const std::string&) { return true; }, &st, &ids);
  ASSERT_TRUE(s.ok()) << s.ToString();
  EXPECT_EQ(ids, ref_ids) << "greedy continuation";
}

void CheckArch(const std::string& arch, DType kv, double bound) {
  CheckFolder(arch, DataDir() + "/" + arch, kv, bound);
}

TEST(HfModelTest, LlamaF32) { CheckArch("llama", DType::kF32, kF32KvBound); }
TEST(HfModelTest, Qwen2Bf16Sharded) { CheckArch("qwen2", DType::kF32, kF32KvBound); }
// transformers 5 writes Gemma 3's RoPE bases only as nested rope_parameters
// {sliding_attention: {rope_theta, rope_type}, full_attention: {rope_theta, rope_type}} (no
// top-level rope_theta / rope_local_base_freq). Gemma3LegacyConfig runs the same weights with
// the 4.x spelling, so a failure here alone points at that config parsing (fixed; keep both).
constexpr char kGemma3Note[] =
    "transformers 5 nests Gemma 3's RoPE bases in rope_parameters.{full_attention,"
    "sliding_attention}.rope_theta (ReadHfRope / gemma3.cc must read them)";
TEST(HfModelTest, Gemma3F16) {
  SCOPED_TRACE(kGemma3Note);
  CheckArch("gemma3", DType::kF32, kF32KvBound);
}
TEST(HfModelTest, LlamaF16Kv) { CheckArch("llama", DType::kF16, kF16KvBound); }
TEST(HfModelTest, Qwen2F16Kv) { CheckArch("qwen2", DType::kF16, kF16KvBound); }
TEST(HfModelTest, Gemma3F16Kv) {
  SCOPED_TRACE(kGemma3Note);
  CheckArch("gemma3", DType::kF16, kF16KvBound);
}

// A temporary copy of a fixture folder, removed at the end of the test.
class TempFolder {
 public:
  TempFolder(const std::string& from, const std::string& tag) {
    path_ = (fs::temp_directory_path() /
             ("peng_hf_" + tag + "_" + std::to_string(::testing::UnitTest::GetInstance()->random_seed()) +
              "_" + std::to_string(std::rand())))
                .string();
    fs::create_directories(path_);
    for (const auto& e : fs::directory_iterator(from)) fs::copy(e.path(), path_ / e.path().filename());
  }
  ~TempFolder() {
    std::error_code ec;
    fs::remove_all(path_, ec);
  }
  std::string path() const { return path_.string(); }

 private:
  fs::path path_;
};

// The same Gemma 3 weights with the config spelled as transformers 4.5x (and the released
// checkpoints on the Hub) write it: top-level rope_theta + rope_local_base_freq and
// sliding_window_pattern, no rope_parameters.
TEST(HfModelTest, Gemma3LegacyConfig) {
  TempFolder dir(DataDir() + "/gemma3", "gemma3_legacy");
  const std::string cfg_path = dir.path() + "/config.json";
  nlohmann::json cfg = nlohmann::json::parse(std::ifstream(cfg_path));
  const nlohmann::json rp = cfg["rope_parameters"];
  cfg.erase("rope_parameters");
  cfg.erase("_sliding_window_pattern");
  cfg["rope_theta"] = rp["full_attention"]["rope_theta"];
  cfg["rope_local_base_freq"] = rp["sliding_attention"]["rope_theta"];
  cfg["rope_scaling"] = nullptr;
  cfg["sliding_window_pattern"] = 6;  // would make all 3 layers slide; layer_types must win
  std::ofstream(cfg_path) << cfg.dump(2);
  CheckFolder("gemma3", dir.path(), DType::kF32, kF32KvBound);
}

// Prefill chunking is invisible: chunks of 1, 3 and 512 tokens give the same logits.
TEST(HfModelTest, PrefillChunkDoesNotChangeLogits) {
  for (const std::string arch : {"llama", "qwen2", "gemma3"}) {
    SCOPED_TRACE(arch);
    const std::vector<int32_t> tokens = LoadGolden(arch)["tokens"].get<std::vector<int32_t>>();
    std::vector<float> base;
    for (int chunk : {512, 1, 3}) {
      auto llm = LoadFolder(DataDir() + "/" + arch, DType::kF32, chunk);
      ASSERT_TRUE(llm.ok()) << llm.status().ToString();
      auto logits = (*llm)->PromptLogits(tokens);
      ASSERT_TRUE(logits.ok()) << logits.status().ToString();
      if (base.empty()) {
        base = *logits;
        continue;
      }
      ASSERT_EQ(logits->size(), base.size());
      double worst = 0;
      for (size_t i = 0; i < base.size(); ++i)
        worst = std::max(worst, static_cast<double>(std::abs((*logits)[i] - base[i])));
      EXPECT_LE(worst, 1e-5) << "max_num_batched_tokens " << chunk;
    }
  }
}

// Broken folders (tools/gen_hf_tiny_models.py writes them from a micro llama): each load fails
// with a message that names what is wrong.
Status LoadBroken(const std::string& name) {
  auto llm = LoadFolder(DataDir() + "/broken/" + name, DType::kF32);
  return llm.ok() ? OkStatus() : llm.status();
}

TEST(HfModelErrorTest, ConfigWithoutHiddenSize) {
  const Status s = LoadBroken("no_hidden_size");
  ASSERT_FALSE(s.ok());
  std::printf("[hf] %s\n", s.ToString().c_str());
  EXPECT_NE(s.ToString().find("config.json"), std::string::npos) << s.ToString();
  EXPECT_NE(s.ToString().find("hidden_size"), std::string::npos) << s.ToString();
}

// model.layers.0.self_attn.k_proj.weight stored transposed: [16, 8] instead of [8, 16].
TEST(HfModelErrorTest, TensorWithWrongShape) {
  const Status s = LoadBroken("wrong_shape");
  ASSERT_FALSE(s.ok());
  std::printf("[hf] %s\n", s.ToString().c_str());
  const std::string msg = s.ToString();
  // peng reports its internal (GGUF-style) name; either spelling identifies the tensor.
  EXPECT_TRUE(msg.find("model.layers.0.self_attn.k_proj.weight") != std::string::npos ||
              msg.find("blk.0.attn_k.weight") != std::string::npos)
      << msg;
  EXPECT_NE(msg.find("[16, 8]"), std::string::npos) << msg;
  EXPECT_NE(msg.find("[8, 16]"), std::string::npos) << msg;
}

// model.layers.0.mlp.up_proj.weight left out.
TEST(HfModelErrorTest, MissingTensor) {
  const Status s = LoadBroken("missing_tensor");
  ASSERT_FALSE(s.ok());
  std::printf("[hf] %s\n", s.ToString().c_str());
  const std::string msg = s.ToString();
  EXPECT_TRUE(msg.find("model.layers.0.mlp.up_proj.weight") != std::string::npos ||
              msg.find("blk.0.ffn_up.weight") != std::string::npos)
      << msg;
  EXPECT_NE(msg.find("missing"), std::string::npos) << msg;
}

}  // namespace
}  // namespace peng
