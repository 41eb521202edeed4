// The golden checks of real models (golden_model_test.cc; the CUDA backend runs them too,
// tests/device/cuda_device_test.cc). See golden_model_test.cc for the references and bounds.
#pragma once

#include <gtest/gtest.h>

#include "core/test_paths.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>

#include <nlohmann/json.hpp>

#include "engine/llm.h"
#include "kernels/ops.h"

namespace peng::golden {


struct Bounds {
  bool exact;           // peng's exact mode (FP32 activations and KV)
  double max_delta;     // max |dlogit| over the reference's top-32 tokens and logsumexp
  double mean_delta;    // mean of the per-position max |dlogit|
  double tie_gap;       // reference top-2 gaps below this are near ties
};
inline constexpr Bounds kHf = {true, 2e-3, 2e-3, 2e-3};
inline constexpr Bounds kLlamaCpp = {false, 3.0, 0.8, 1.0};

using ::peng::test_util::SourceDir;

using ::peng::test_util::ModelsDir;

// How many tokens of each greedy continuation are compared: all, or PENG_GOLDEN_GREEDY_TOKENS
// (scripts/test_arm64.sh --ci: under qemu a decode step is some 30 times slower).
inline size_t GreedyTokens() {
  const char* e = std::getenv("PENG_GOLDEN_GREEDY_TOKENS");
  const long n = e && *e ? std::strtol(e, nullptr, 10) : -1;
  return n > 0 ? static_cast<size_t>(n) : SIZE_MAX;
}

inline nlohmann::json LoadGolden(const std::string& name) {
  std::ifstream in(SourceDir() + "/tests/golden/" + name);
  EXPECT_TRUE(in.good()) << name;
  return nlohmann::json::parse(in);
}

inline double LogSumExp(const float* row, int64_t n) {
  double m = *std::max_element(row, row + n);
  double s = 0;
  for (int64_t i = 0; i < n; ++i) s += std::exp(row[i] - m);
  return m + std::log(s);
}

// Mean over positions of the max |a - b| over the tokens both top-32 lists hold.
inline double MeanTopDistance(const nlohmann::json& a, const nlohmann::json& b) {
  double sum = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    std::map<int, double> bm;
    for (const auto& pair : b[i]["top"]) bm[pair[0].get<int>()] = pair[1].get<double>();
    double worst = 0;
    for (const auto& pair : a[i]["top"]) {
      auto it = bm.find(pair[0].get<int>());
      if (it != bm.end()) worst = std::max(worst, std::abs(pair[1].get<double>() - it->second));
    }
    sum += worst;
  }
  return sum / a.size();
}

// Same for peng's logits rows against a golden's top-32 lists.
inline double MeanTopDistance(const std::vector<float>& logits, int64_t V,
                              const nlohmann::json& b) {
  double sum = 0;
  for (size_t i = 0; i < b.size(); ++i) {
    double worst = 0;
    for (const auto& pair : b[i]["top"])
      worst = std::max(worst, std::abs(logits[i * V + pair[0].get<int>()] -
                                       pair[1].get<double>()));
    sum += worst;
  }
  return sum / b.size();
}

// `device`: LlmOptions::device ("cpu" or an accelerator, whose run the same bounds judge).
inline void CheckModel(const std::string& golden_name, const Bounds& bounds,
                       const std::string& device = "cpu") {
  const nlohmann::json g = LoadGolden(golden_name);
  nlohmann::json hf;  // the float64 reference, for the noise comparison of the 8-bit path
  if (!bounds.exact) {
    std::string hf_name = golden_name;
    hf_name.replace(hf_name.size() - 5, 5, ".hf.json");
    hf = LoadGolden(hf_name);
  }
  const std::string path = ModelsDir() + "/" + g["model_file"].get<std::string>();
  if (!std::filesystem::exists(path)) GTEST_SKIP() << "model not fetched: " << path;
  LlmOptions o;
  o.model_path = path;
  o.threads = 2;
  o.device = device;
  o.max_model_len = 512;
  kernels::SetExactActivations(bounds.exact);
  o.kv_dtype = bounds.exact ? DType::kF32 : DType::kF16;
  auto llm = Llm::Load(o);
  ASSERT_TRUE(llm.ok()) << llm.status().ToString();
  Llm& m = **llm;
  const int64_t V = m.model().config().vocab_size;
  for (auto& [name, p] : g["prompts"].items()) {
    SCOPED_TRACE("prompt '" + name + "'");
    const std::vector<int32_t> tokens = p["tokens"].get<std::vector<int32_t>>();
    // The same text through our tokenizer gives the reference's ids.
    EXPECT_EQ(*m.Encode(p["text"].get<std::string>()), tokens);
    auto logits = m.PromptLogits(tokens);
    ASSERT_TRUE(logits.ok()) << logits.status().ToString();
    double worst = 0, sum_pos = 0;
    for (size_t pos = 0; pos < tokens.size(); ++pos) {
      const float* row = logits->data() + pos * V;
      const auto& ref = p["positions"][pos];
      const auto& top = ref["top"];
      double pos_worst = std::abs(LogSumExp(row, V) - ref["logsumexp"].get<double>());
      for (const auto& pair : top)
        pos_worst = std::max(pos_worst, std::abs(row[pair[0].get<int>()] - pair[1].get<double>()));
      worst = std::max(worst, pos_worst);
      sum_pos += pos_worst;
      const int ours = static_cast<int>(std::max_element(row, row + V) - row);
      const double gap = top[0][1].get<double>() - top[1][1].get<double>();
      if (ours != top[0][0].get<int>() && gap >= bounds.tie_gap) {
        ADD_FAILURE() << "position " << pos << ": top-1 " << ours << " vs reference "
                      << top[0][0] << " (reference gap " << gap << ")";
      }
    }
    const double mean = sum_pos / tokens.size();
    EXPECT_LE(worst, bounds.max_delta);
    EXPECT_LE(mean, bounds.mean_delta);
    if (!bounds.exact) {
      const auto& hf_pos = hf["prompts"][name]["positions"];
      const double ref_noise = MeanTopDistance(p["positions"], hf_pos);
      const double our_noise = MeanTopDistance(*logits, V, hf_pos);
      std::printf("[golden] %s/%s: distance to float64 HF: peng %.3f, llama.cpp %.3f\n",
                  golden_name.c_str(), name.c_str(), our_noise, ref_noise);
      EXPECT_LE(our_noise, 1.25 * ref_noise + 0.05);
    }
    std::printf("[golden] %s/%s: %zu positions, max |dlogit| = %.5f, mean = %.5f\n",
                golden_name.c_str(), name.c_str(), tokens.size(), worst, mean);

    // Greedy continuation.
    const auto& greedy = p["greedy"];
    std::vector<int32_t> ref_ids = greedy["tokens"].get<std::vector<int32_t>>();
    ref_ids.resize(std::min(ref_ids.size(), GreedyTokens()));
    SamplingParams sp;
    sp.temperature = 0;
    sp.ignore_eos = true;
    sp.max_tokens = static_cast<int>(ref_ids.size());
    std::vector<int32_t> ids;
    GenerateStats st;
    ASSERT_TRUE(m.Generate(tokens, sp, [](int32_t, const std::string&) { return true; }, &st,
                           &ids).ok());
    ASSERT_EQ(ids.size(), ref_ids.size());
    for (size_t i = 0; i < ids.size(); ++i) {
      const auto& t2 = greedy["top2_logits"][i];
      if (t2[0].get<double>() - t2[1].get<double>() < bounds.tie_gap) break;  // near tie
      ASSERT_EQ(ids[i], ref_ids[i]) << "greedy step " << i;
    }
  }
}

}  // namespace peng::golden
