// INT8 models end to end (issue 5): `peng quantize` output (QuantizeModel) loads and runs.
//  * tiny HF llama (tests/data/hf_tiny, F32): quant_config.json shape, W8A16/W8A8 logits close to
//    the transformers float64 golden, greedy continuation unchanged; broken folders (unknown
//    scheme, missing scale, wrong scale shape, a W8A8 weight of -128) fail to load with errors
//    naming the problem.
//  * tiny DeepSeek-V2 fixtures (MLA + MoE, tests/data/deepseek_tiny): the quantized lite model
//    stays close to the float64 golden; the servable model's perplexity on the committed text
//    stays within 1% of its BF16 original (W8A16 0.9956, W8A8 0.9979).
//  * SmolLM2 135M (models/, skipped if absent): the f32 conversion of the GGUF (HF names,
//    un-permuted Q/K, config.json, tokenizer.gguf) reproduces the GGUF's exact-mode logits;
//    W8A16 and W8A8 perplexity on the committed text within 1% of the dequantized full-precision
//    reference (the GGUF in exact mode), KL and top-1 reported; a deliberately corrupted scale
//    is caught by the weight check and localised to its layer, the honest model passes.
#include <gtest/gtest.h>

#include <sys/stat.h>

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>

#include <nlohmann/json.hpp>

#include "core/test_paths.h"
#include "engine/diagnose.h"
#include "engine/eval.h"
#include "engine/llm.h"
#include "formats/safetensors.h"
#include "formats/safetensors_writer.h"
#include "kernels/ops.h"
#include "quant/quantize.h"

namespace peng {
namespace {

namespace fs = std::filesystem;
using ::peng::test_util::SourceDir;

std::string TmpDir(const std::string& name) {
  const std::string d = ::testing::TempDir() + "/int8_" + name + "_" + std::to_string(::getpid());
  fs::remove_all(d);
  return d;
}

std::string SmolLm() { return test_util::ModelFile("smollm2-135m-instruct-q4_1.gguf"); }

StatusOr<std::unique_ptr<Llm>> Load(const std::string& path, int64_t ctx = 256) {
  LlmOptions o;
  o.model_path = path;
  o.threads = 2;
  o.max_model_len = ctx;
  o.kv_dtype = DType::kF32;
  return Llm::Load(o);
}

void Quantize(const std::string& in, const std::string& out, const std::string& scheme) {
  QuantizeOptions o;
  o.input = in;
  o.output = out;
  o.scheme = scheme;
  o.threads = 2;
  auto r = QuantizeModel(o);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
}

// Where the data of tensor `name` starts in the safetensors file `f` (header parsed).
uint64_t TensorOffset(std::fstream& f, const std::string& name) {
  uint64_t n = 0;
  f.seekg(0);
  f.read(reinterpret_cast<char*>(&n), 8);
  std::string header(n, '\0');
  f.read(header.data(), n);
  return 8 + n + nlohmann::json::parse(header)[name]["data_offsets"][0].get<uint64_t>();
}

// Multiplies row `row` of the scale tensor `name` in OUT/model.safetensors by `factor`.
void CorruptScale(const std::string& dir, const std::string& name, int row, float factor) {
  std::fstream f(dir + "/model.safetensors", std::ios::in | std::ios::out | std::ios::binary);
  const uint64_t off = TensorOffset(f, name) + 4 * row;
  float v = 0;
  f.seekg(off);
  f.read(reinterpret_cast<char*>(&v), 4);
  v *= factor;
  f.seekp(off);
  f.write(reinterpret_cast<const char*>(&v), 4);
  ASSERT_TRUE(f.good());
}

// Sets byte `index` of tensor `name` in DIR/model.safetensors to `value`.
void SetByte(const std::string& dir, const std::string& name, int64_t index, uint8_t value) {
  std::fstream f(dir + "/model.safetensors", std::ios::in | std::ios::out | std::ios::binary);
  f.seekp(TensorOffset(f, name) + index);
  f.write(reinterpret_cast<const char*>(&value), 1);
  ASSERT_TRUE(f.good());
}

// ---------------------------------------------------------------------------------------------
// Tiny HF llama

const std::string kTinyLlama = "/tests/data/hf_tiny/llama";

TEST(Int8TinyModel, QuantConfigAndLogits) {
  const nlohmann::json g = [] {
    std::ifstream in(SourceDir() + "/tests/data/hf_tiny/llama.golden.json");
    return nlohmann::json::parse(in);
  }();
  const std::vector<int32_t> tokens = g["tokens"].get<std::vector<int32_t>>();
  for (const std::string scheme : {"w8a16", "w8a8"}) {
    const std::string dir = TmpDir(scheme);
    Quantize(SourceDir() + kTinyLlama, dir, scheme);
    ASSERT_TRUE(fs::exists(dir + "/config.json"));
    std::ifstream qf(dir + "/quant_config.json");
    const nlohmann::json qc = nlohmann::json::parse(qf);
    EXPECT_EQ(qc["format"], "peng-int8");
    EXPECT_EQ(qc["format_version"], 1);
    EXPECT_EQ(qc["scheme"], scheme);
    EXPECT_EQ(qc["group_size"], -1);
    EXPECT_EQ(qc["granularity"], "per_channel");
    EXPECT_EQ(qc["activation_group_size"], scheme == "w8a8" ? 32 : 0);
    // 2 layers x 7 projections quantized; embeddings and the untied lm_head skipped by default.
    EXPECT_EQ(qc["quantized"].size(), 14u);
    ASSERT_EQ(qc["skipped"].size(), 2u);
    EXPECT_EQ(qc["skipped"][0]["name"], "lm_head.weight");
    EXPECT_EQ(qc["skipped"][1]["name"], "model.embed_tokens.weight");
    auto st = SafetensorsFile::Open(dir + "/model.safetensors");
    ASSERT_TRUE(st.ok());
    const TensorView* q = (*st)->FindTensor("model.layers.1.mlp.down_proj.weight");
    const TensorView* s = (*st)->FindTensor("model.layers.1.mlp.down_proj.weight_scale");
    ASSERT_TRUE(q && s);
    EXPECT_EQ(q->dtype, DType::kI8);
    EXPECT_EQ(q->shape, (std::vector<int64_t>{64, 128}));
    EXPECT_EQ(s->dtype, DType::kF32);
    EXPECT_EQ(s->shape, (std::vector<int64_t>{64}));

    auto llm = Load(dir);
    ASSERT_TRUE(llm.ok()) << llm.status().ToString();
    EXPECT_NE((*llm)->model().WeightSummary().find("I8 x14"), std::string::npos)
        << (*llm)->model().WeightSummary();
    auto logits = (*llm)->PromptLogits(tokens);
    ASSERT_TRUE(logits.ok());
    const int64_t V = 256;
    double worst = 0;
    int top1 = 0;
    for (size_t p = 0; p < tokens.size(); ++p) {
      const std::vector<double> r = g["logits"][p].get<std::vector<double>>();
      const float* row = logits->data() + p * V;
      for (int64_t i = 0; i < V; ++i) worst = std::max(worst, std::abs(row[i] - r[i]));
      top1 += (std::max_element(row, row + V) - row) ==
              (std::max_element(r.begin(), r.end()) - r.begin());
    }
    std::printf("[int8 tiny] %s: max |dlogit| vs float64 %.4f, top-1 %d/%zu\n", scheme.c_str(),
                worst, top1, tokens.size());
    // INT8 noise on the random tiny model's logits (range ~40); measured 0.47 (W8A16) and 0.73
    // (W8A8) with 12/12 and 11/12 top-1 agreement.
    EXPECT_LT(worst, 1.0);
    EXPECT_GE(top1, static_cast<int>(tokens.size()) - 1);
    fs::remove_all(dir);
  }
}

// A folder whose quant_config.json or scales do not match its tensors fails to load.
TEST(Int8TinyModel, BrokenFoldersAreErrors) {
  const std::string dir = TmpDir("broken");
  Quantize(SourceDir() + kTinyLlama, dir, "w8a16");
  auto expect_error = [](const std::string& path, const std::string& substr) {
    auto m = Load(path);
    ASSERT_FALSE(m.ok()) << path;
    EXPECT_NE(m.status().message().find(substr), std::string::npos) << m.status().message();
  };
  // Unknown scheme.
  const std::string bad_scheme = TmpDir("bad_scheme");
  fs::copy(dir, bad_scheme);
  {
    std::ifstream in(dir + "/quant_config.json");
    nlohmann::json j = nlohmann::json::parse(in);
    j["scheme"] = "w4a16";
    std::ofstream(bad_scheme + "/quant_config.json") << j.dump();
  }
  expect_error(bad_scheme, "unknown quantization scheme 'w4a16'");
  // No quant_config.json at all.
  const std::string no_config = TmpDir("no_config");
  fs::copy(dir, no_config);
  fs::remove(no_config + "/quant_config.json");
  expect_error(no_config, "no quant_config.json");
  // Rewrites the checkpoint without / with a misshapen scale of one tensor.
  auto rewrite = [&](const std::string& out, bool drop) {
    fs::create_directories(out);
    fs::copy_file(dir + "/config.json", out + "/config.json");
    fs::copy_file(dir + "/quant_config.json", out + "/quant_config.json");
    auto st = SafetensorsFile::Open(dir + "/model.safetensors");
    ASSERT_TRUE(st.ok());
    const std::string victim = "model.layers.0.self_attn.k_proj.weight_scale";
    SafetensorsWriter w(out + "/model.safetensors");
    for (const TensorView& t : (*st)->tensors()) {
      if (t.name == victim && drop) continue;
      std::vector<int64_t> shape = t.shape;
      if (t.name == victim) shape = {shape[0] / 2, 2};
      ASSERT_TRUE(w.Add(t.name, t.dtype, shape).ok());
    }
    ASSERT_TRUE(w.Begin().ok());
    for (const TensorView& t : (*st)->tensors()) {
      if (t.name == victim && drop) continue;
      ASSERT_TRUE(w.Write(t.data, t.size_bytes).ok());
    }
    ASSERT_TRUE(w.Finish().ok());
  };
  const std::string no_scale = TmpDir("no_scale"), bad_shape = TmpDir("bad_shape");
  rewrite(no_scale, true);
  expect_error(no_scale, "has no scale tensor 'model.layers.0.self_attn.k_proj.weight_scale'");
  rewrite(bad_shape, false);
  expect_error(bad_shape, "expected F32 [32]");
  // A W8A8 weight of -128 (peng quantize writes [-127, 127]; the W8A8 kernels need it): refused,
  // with the tensor and row named. The same byte in a W8A16 folder multiplies correctly.
  const std::string w8a8 = TmpDir("w8a8_sym"), minus128 = TmpDir("w8a8_m128");
  Quantize(SourceDir() + kTinyLlama, w8a8, "w8a8");
  fs::copy(w8a8, minus128);
  SetByte(minus128, "model.layers.1.mlp.up_proj.weight", 3 * 64 + 5, 0x80);
  expect_error(minus128, "'blk.1.ffn_up.weight' holds -128 (row 3)");
  const std::string w8a16_128 = TmpDir("w8a16_m128");
  fs::copy(dir, w8a16_128);
  SetByte(w8a16_128, "model.layers.1.mlp.up_proj.weight", 3 * 64 + 5, 0x80);
  EXPECT_TRUE(Load(w8a16_128).ok());
  for (const std::string& d :
       {dir, bad_scheme, no_config, no_scale, bad_shape, w8a8, minus128, w8a16_128})
    fs::remove_all(d);
}

// The first n tokens of the committed text under llm's tokenizer.
std::vector<int32_t> TextTokens(Llm& llm, size_t n) {
  std::ifstream f(SourceDir() + "/tests/data/eval/gpl3_excerpt.txt");
  std::stringstream ss;
  ss << f.rdbuf();
  auto ids = llm.Encode(ss.str());
  EXPECT_TRUE(ids.ok());
  EXPECT_GE(ids->size(), n);
  ids->resize(n);
  return *ids;
}

eval::LogitsFn Runner(Llm& llm, bool exact) {
  return [&llm, exact](std::span<const int32_t> w) {
    kernels::SetExactActivations(exact);
    auto out = llm.PromptLogits(w);
    kernels::SetExactActivations(false);
    return out;
  };
}

// ---------------------------------------------------------------------------------------------
// Tiny DeepSeek-V2 fixtures (MLA + MoE): the quantized models load, per-expert matrices and the
// latent projections become INT8 (the router and matrices with a column count that is not a
// multiple of 32 stay in floating point), and outputs stay close to the reference.

TEST(Int8DeepseekTiny, LiteLogitsAndServePerplexity) {
  const std::string ds = SourceDir() + "/tests/data/deepseek_tiny";
  std::ifstream gin(ds + "/lite.golden.json");
  const nlohmann::json g = nlohmann::json::parse(gin);
  const std::vector<int32_t> tokens = g["tokens"].get<std::vector<int32_t>>();
  auto ref = Load(ds + "/serve", 256);
  ASSERT_TRUE(ref.ok()) << ref.status().ToString();
  const std::vector<int32_t> text = TextTokens(**ref, 1024);
  for (const std::string scheme : {"w8a16", "w8a8"}) {
    const std::string lite = TmpDir("ds_lite_" + scheme), serve = TmpDir("ds_serve_" + scheme);
    Quantize(ds + "/lite", lite, scheme);
    Quantize(ds + "/serve", serve, scheme);
    std::ifstream qf(lite + "/quant_config.json");
    const nlohmann::json qc = nlohmann::json::parse(qf);
    // 3 layers: q, kv_a, kv_b; dense gate/up/down; 2 MoE layers x (8 experts x gate/up +
    // shared gate/up) = 48; o_proj (48 columns), expert/shared down (16 columns), routers,
    // embeddings and lm_head skipped.
    EXPECT_EQ(qc["quantized"].size(), 48u);
    bool router_skipped = false;
    for (const auto& e : qc["skipped"])
      router_skipped |= e["name"] == "model.layers.1.mlp.gate.weight";
    EXPECT_TRUE(router_skipped);

    auto m = Load(lite);
    ASSERT_TRUE(m.ok()) << m.status().ToString();
    auto logits = (*m)->PromptLogits(tokens);
    ASSERT_TRUE(logits.ok());
    double worst = 0;
    int top1 = 0;
    for (size_t p = 0; p < tokens.size(); ++p) {
      const std::vector<double> r = g["logits"][p].get<std::vector<double>>();
      const float* row = logits->data() + p * 256;
      for (int i = 0; i < 256; ++i) worst = std::max(worst, std::abs(row[i] - r[i]));
      top1 += (std::max_element(row, row + 256) - row) ==
              (std::max_element(r.begin(), r.end()) - r.begin());
    }
    auto q = Load(serve, 256);
    ASSERT_TRUE(q.ok());
    auto c = eval::Compare(text, 256, 256, 640, Runner(**q, false), Runner(**ref, false));
    ASSERT_TRUE(c.ok());
    std::printf("[int8 deepseek] %s: lite max |dlogit| vs float64 %.4f, top-1 %d/%zu; serve PPL "
                "%.2f vs %.2f (ratio %.5f), KL %.4f, top-1 %.1f%%\n",
                scheme.c_str(), worst, top1, tokens.size(), c->PplModel(), c->PplRef(),
                c->PplRatio(), c->MeanKl(), 100 * c->Top1Agreement());
    EXPECT_LT(worst, 1.0);
    EXPECT_GE(top1, static_cast<int>(tokens.size()) - 1);
    EXPECT_NEAR(c->PplRatio(), 1.0, 0.01) << scheme;
    fs::remove_all(lite);
    fs::remove_all(serve);
  }
}

// The fused-expert checkpoint (transformers 5 mlp.experts.gate_up_proj [E, 2I, D]) quantizes to
// stacked INT8 matrices with [E, 2I] scales and gives bit for bit the logits of the quantized
// per-expert checkpoint (same rows, same scales).
TEST(Int8DeepseekTiny, FusedExpertsQuantizeLikePerExpert) {
  const std::string ds = SourceDir() + "/tests/data/deepseek_tiny";
  const std::string per = TmpDir("ds_per"), fused = TmpDir("ds_fused");
  Quantize(ds + "/lite", per, "w8a8");
  Quantize(ds + "/lite_fused", fused, "w8a8");
  auto st = SafetensorsFile::Open(fused + "/model.safetensors");
  ASSERT_TRUE(st.ok());
  const TensorView* q = (*st)->FindTensor("model.layers.1.mlp.experts.gate_up_proj");
  const TensorView* s = (*st)->FindTensor("model.layers.1.mlp.experts.gate_up_proj_scale");
  ASSERT_TRUE(q && s);
  EXPECT_EQ(q->dtype, DType::kI8);
  EXPECT_EQ(s->shape, (std::vector<int64_t>{8, 32}));
  auto a = Load(per), b = Load(fused);
  ASSERT_TRUE(a.ok() && b.ok()) << b.status().ToString();
  const std::vector<int32_t> tokens = {1, 17, 200, 45, 99, 3, 128, 77};
  auto la = (*a)->PromptLogits(tokens), lb = (*b)->PromptLogits(tokens);
  ASSERT_TRUE(la.ok() && lb.ok());
  EXPECT_EQ(*la, *lb);
  fs::remove_all(per);
  fs::remove_all(fused);
}

// ---------------------------------------------------------------------------------------------
// SmolLM2 135M: conversion, perplexity, corrupted-scale detection.

class Int8SmolLm : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    gguf_ = SmolLm();
    if (gguf_.empty()) return;
    base_ = TmpDir("smol");
    for (const char* s : {"w8a16", "w8a8"}) Quantize(gguf_, base_ + "/" + s, s);
  }
  static void TearDownTestSuite() {
    if (!base_.empty()) fs::remove_all(base_);
  }
  void SetUp() override {
    if (gguf_.empty()) GTEST_SKIP() << "models/smollm2-135m-instruct-q4_1.gguf not present";
  }
  static std::string gguf_, base_;
};
std::string Int8SmolLm::gguf_, Int8SmolLm::base_;

// The f32 scheme writes the dequantized GGUF as a plain HF folder: same logits as the GGUF in
// exact mode (checks the HF names, Q/K un-permutation, config.json and tokenizer.gguf).
TEST_F(Int8SmolLm, F32ConversionReproducesTheGguf) {
  const std::string dir = base_ + "/f32";
  Quantize(gguf_, dir, "f32");
  EXPECT_TRUE(fs::exists(dir + "/tokenizer.gguf"));
  EXPECT_FALSE(fs::exists(dir + "/quant_config.json"));
  auto ref = Load(gguf_, 64);
  auto conv = Load(dir, 64);
  ASSERT_TRUE(ref.ok() && conv.ok()) << conv.status().ToString();
  ASSERT_NE((*conv)->tokenizer(), nullptr);
  auto ids = (*conv)->Encode("The capital of France is Paris, and the capital of Italy is");
  auto ids_ref = (*ref)->Encode("The capital of France is Paris, and the capital of Italy is");
  ASSERT_TRUE(ids.ok() && ids_ref.ok());
  EXPECT_EQ(*ids, *ids_ref);
  kernels::SetExactActivations(true);
  auto a = (*ref)->PromptLogits(*ids);
  auto b = (*conv)->PromptLogits(*ids);
  kernels::SetExactActivations(false);
  ASSERT_TRUE(a.ok() && b.ok());
  double worst = 0;
  for (size_t i = 0; i < a->size(); ++i) worst = std::max(worst, double(std::abs((*a)[i] - (*b)[i])));
  std::printf("[int8 smol] f32 folder vs GGUF exact: max |dlogit| %.2e\n", worst);
  EXPECT_LT(worst, 1e-3);
  fs::remove_all(dir);
}

// The skipped embedding (SmolLM2 ties it to the LM head, read in full every decode step) comes
// from a block-quantized GGUF tensor and is written as F16 by default, not F32: half the bytes.
TEST_F(Int8SmolLm, SkippedBlockQuantTensorsAreF16) {
  auto st = SafetensorsFile::Open(base_ + "/w8a8/model.safetensors");
  ASSERT_TRUE(st.ok()) << st.status().ToString();
  const TensorView* e = (*st)->FindTensor("model.embed_tokens.weight");
  ASSERT_NE(e, nullptr);
  EXPECT_EQ(e->dtype, DType::kF16);
  EXPECT_EQ(e->size_bytes, static_cast<size_t>(e->numel() * 2));
}

// Perplexity of W8A16 and W8A8 within 1% of the full-precision reference on 1024 tokens
// (measured ratios 1.0018 and 1.0004; on 512 tokens window noise alone moves them by ~1%).
TEST_F(Int8SmolLm, PerplexityWithinOnePercent) {
  auto ref = Load(gguf_);
  ASSERT_TRUE(ref.ok());
  const std::vector<int32_t> ids = TextTokens(**ref, 1024);
  const int64_t V = (*ref)->model().config().vocab_size;
  for (const char* scheme : {"w8a16", "w8a8"}) {
    auto m = Load(base_ + "/" + scheme);
    ASSERT_TRUE(m.ok()) << m.status().ToString();
    ASSERT_EQ(TextTokens(**m, 1024), ids);
    auto r = eval::Compare(ids, 256, 256, V, Runner(**m, false), Runner(**ref, true));
    ASSERT_TRUE(r.ok());
    std::printf("[int8 smol] %s: PPL %.4f vs reference %.4f (ratio %.5f), KL %.5f, top-1 %.2f%%, "
                "mean deviation %.4f\n",
                scheme, r->PplModel(), r->PplRef(), r->PplRatio(), r->MeanKl(),
                100 * r->Top1Agreement(), r->MeanDeviation());
    EXPECT_NEAR(r->PplRatio(), 1.0, 0.01) << scheme;
    EXPECT_LT(r->MeanKl(), 0.02) << scheme;
    EXPECT_GE(r->Top1Agreement(), 0.93) << scheme;
    EXPECT_LT(r->MeanDeviation(), 0.03) << scheme;  // the honest model passes the default
  }
}

// One scale of blk.10's down projection multiplied by 10: the weight check names the tensor,
// the outputs deviate past 3%, and the residual stream's error jumps at layer 10.
TEST_F(Int8SmolLm, CorruptedScaleIsFlaggedAndLocalised) {
  const std::string bad = base_ + "/bad";
  fs::copy(base_ + "/w8a8", bad);
  CorruptScale(bad, "model.layers.10.mlp.down_proj.weight_scale", 7, 10.f);
  auto ref = Load(gguf_);
  auto honest = Load(base_ + "/w8a8");
  auto broken = Load(bad);
  ASSERT_TRUE(ref.ok() && honest.ok() && broken.ok());
  const auto w_ok = eval::CompareWeights((*honest)->model(), (*ref)->model(), &(*ref)->pool());
  const auto w_bad = eval::CompareWeights((*broken)->model(), (*ref)->model(), &(*ref)->pool());
  ASSERT_EQ(w_ok.size(), 211u);  // 30 layers x 7 + the embedding (tied head)
  std::printf("[int8 smol] worst weights: honest %s %.4f, corrupted %s %.4f\n",
              w_ok[0].name.c_str(), w_ok[0].rel, w_bad[0].name.c_str(), w_bad[0].rel);
  EXPECT_LT(w_ok[0].rel, 0.03);
  EXPECT_EQ(w_bad[0].name, "blk.10.ffn_down.weight");
  EXPECT_GT(w_bad[0].rel, 0.3);  // one row of 576 scaled 10x: 9 / sqrt(576) = 0.375
  EXPECT_LT(w_bad[1].rel, 0.03);

  const std::vector<int32_t> ids = TextTokens(**ref, 512);
  const int64_t V = (*ref)->model().config().vocab_size;
  auto r = eval::Compare(ids, 256, 256, V, Runner(**broken, false), Runner(**ref, true));
  ASSERT_TRUE(r.ok());
  std::printf("[int8 smol] corrupted: mean deviation %.4f, PPL ratio %.4f, KL %.4f\n",
              r->MeanDeviation(), r->PplRatio(), r->MeanKl());
  EXPECT_GT(r->MeanDeviation(), 0.03);

  auto d = eval::DiagnoseLayers(**broken, **ref, std::span(ids).subspan(0, 128), true);
  ASSERT_TRUE(d.ok());
  ASSERT_EQ(d->layer_rel.size(), 31u);
  EXPECT_EQ(d->worst_layer, 10);
  fs::remove_all(bad);
}

}  // namespace
}  // namespace peng
