// Tensor parallelism against one process, under `mpirun -np N` (ctest: N = 2 and 4). Rank 0
// runs the tests; every other rank serves rank 0's engine cores (RunTensorParallelWorker) until
// the end. For each model rank 0 computes, in the same process, the single-process reference
// (the whole model, a plain LocalExecutor) and the tensor-parallel result (its shard, the
// TensorParallelExecutor, the other ranks' shards):
//   - exact mode (FP32 activations, F32 KV cache): the logits of every prompt position within
//     kExactBound (relative) of one process -- only the order of the additions differs (the
//     all-reduce sums the ranks' partial dot products) -- and the 16-token greedy
//     continuations of three prompts decoded together identical;
//   - default mode, float-weight models: the greedy continuations identical too.
// Models: the tiny random HF folders (4 heads, 2 KV heads: split at tp 2, replicated at tp 4),
// Qwen2.5-Coder-0.5B Q4_K_M (14 heads, 2 KV heads; 14 heads cannot be split 4 ways: a clean
// error) and Gemma 3 270M Q4_K_M (1 KV head: replicated) when downloaded.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>

#include "core/test_paths.h"
#include "engine/engine_core.h"
#include "kernels/ops.h"
#include "model/registry.h"
#include "parallel/communicator.h"
#include "world.h"

namespace peng {
namespace {

constexpr double kExactBound = 1e-5;  // relative to the largest |logit|

using test_util::World;

EngineOptions Options(const std::string& path, DType kv) {
  EngineOptions o;
  o.model_path = path;
  o.threads = 1;
  o.max_model_len = 256;
  o.max_num_seqs = 4;
  o.num_kv_blocks = 64;
  o.measure_peaks = false;
  o.kv_dtype = kv;
  return o;
}

// One process: the whole model.
std::unique_ptr<EngineCore> SingleCore(const EngineOptions& o) {
  StatusOr<std::unique_ptr<Model>> m = LoadModel(o.model_path);
  EXPECT_TRUE(m.ok()) << m.status().ToString();
  if (!m.ok()) return nullptr;
  auto core = CreateEngineCore(o, std::move(*m), nullptr);
  EXPECT_TRUE(core.ok()) << core.status().ToString();
  return core.ok() ? std::move(*core) : nullptr;
}

// Tensor parallel over the world: this rank's shard + the workers'.
std::unique_ptr<EngineCore> ParallelCore(const EngineOptions& o) {
  StatusOr<std::unique_ptr<Model>> m = LoadModel(o.model_path, {.tp = World()});
  EXPECT_TRUE(m.ok()) << m.status().ToString();
  if (!m.ok()) return nullptr;
  auto ex = CreateTensorParallelExecutor(o, World(), std::move(*m));
  EXPECT_TRUE(ex.ok()) << ex.status().ToString();
  if (!ex.ok()) return nullptr;
  auto core = EngineCore::Create(o, std::move(*ex), nullptr);
  EXPECT_TRUE(core.ok()) << core.status().ToString();
  return core.ok() ? std::move(*core) : nullptr;
}

// Runs `r` to its end; returns every event.
std::vector<RequestOutput> RunRequest(EngineCore* core, GenerateRequest r) {
  std::vector<RequestOutput> out;
  EXPECT_TRUE(core->Add(std::move(r)).ok());
  for (bool done = false; !done;) {
    for (EngineCoreOutput& o : core->Step()) {
      done = done || o.request_finished;
      out.push_back(std::move(o.output));
    }
  }
  return out;
}

std::vector<float> PromptLogits(EngineCore* core, const std::vector<int32_t>& prompt) {
  GenerateRequest r;
  r.id = "score";
  r.prompt = prompt;
  r.return_prompt_logits = true;
  std::vector<float> logits;
  for (const RequestOutput& ev : RunRequest(core, r))
    logits.insert(logits.end(), ev.prompt_logits.begin(), ev.prompt_logits.end());
  return logits;
}

// Greedy continuations of several prompts decoded together (one batch per step).
std::vector<std::vector<int32_t>> GreedyBatch(EngineCore* core,
                                              const std::vector<std::vector<int32_t>>& prompts,
                                              int n) {
  std::vector<std::vector<int32_t>> ids(prompts.size());
  for (size_t i = 0; i < prompts.size(); ++i) {
    GenerateRequest r;
    r.id = "g" + std::to_string(i);
    r.prompt = prompts[i];
    r.params.temperature = 0;
    r.params.max_tokens = n;
    r.params.ignore_eos = true;
    EXPECT_TRUE(core->Add(std::move(r)).ok());
  }
  while (core->HasUnfinished())
    for (EngineCoreOutput& o : core->Step()) {
      const size_t i = std::stoul(o.request_id.substr(1));
      ids[i].insert(ids[i].end(), o.output.token_ids.begin(), o.output.token_ids.end());
    }
  return ids;
}

std::vector<int32_t> Prompt(int n, int vocab, int seed) {
  std::vector<int32_t> p(n);
  for (int i = 0; i < n; ++i) p[i] = (seed * 7919 + i * 104729) % vocab;
  return p;
}

// Exact mode (FP32 activations, F32 KV cache): the logits of every prompt position within
// kExactBound x the largest |logit|, and the greedy continuations of three prompts decoded
// together identical. `default_greedy`: also in the default mode (quantized activations, F16 KV)
// -- only for float weights: with int8-quantized activations a different order of additions
// can move an activation across a rounding boundary, so the tokens of a quantized model are not
// reproducible across tensor-parallel sizes (nor across llama.cpp's).
void CheckModel(const std::string& path, int n_prompt, int n_greedy, bool default_greedy) {
  const int tp = World()->size();
  std::printf("model %s, tensor parallel size %d\n", path.c_str(), tp);
  StatusOr<std::unique_ptr<Model>> probe = LoadModel(path);
  ASSERT_TRUE(probe.ok());
  const int vocab = static_cast<int>((*probe)->config().vocab_size);
  probe->reset();
  const std::vector<int32_t> prompt = Prompt(n_prompt, vocab, 1);
  const std::vector<std::vector<int32_t>> prompts = {prompt, Prompt(5, vocab, 2),
                                                     Prompt(1, vocab, 3)};
  for (const bool exact : {true, false}) {
    if (!exact && !default_greedy) break;
    SCOPED_TRACE(exact ? "exact mode" : "default mode");
    kernels::SetExactActivations(exact);
    EngineOptions o = Options(path, exact ? DType::kF32 : DType::kF16);
    std::vector<float> want, got;
    std::vector<std::vector<int32_t>> want_ids, got_ids;
    {
      auto core = SingleCore(o);
      ASSERT_TRUE(core);
      if (exact) want = PromptLogits(core.get(), prompt);
      want_ids = GreedyBatch(core.get(), prompts, n_greedy);
    }
    {
      auto core = ParallelCore(o);
      ASSERT_TRUE(core);
      if (exact) got = PromptLogits(core.get(), prompt);
      got_ids = GreedyBatch(core.get(), prompts, n_greedy);
    }
    kernels::SetExactActivations(false);
    for (size_t i = 0; i < prompts.size(); ++i) {
      ASSERT_EQ(want_ids[i].size(), static_cast<size_t>(n_greedy));
      EXPECT_EQ(got_ids[i], want_ids[i]) << "prompt " << i;
    }
    if (!exact) continue;
    ASSERT_EQ(got.size(), want.size());
    ASSERT_EQ(want.size(), prompt.size() * vocab);
    double worst = 0, scale = 0;
    for (size_t i = 0; i < want.size(); ++i) {
      worst = std::max(worst, std::abs(double(got[i]) - want[i]));
      scale = std::max(scale, std::abs(double(want[i])));
    }
    std::printf("  exact mode: max |dlogit| %.3g over %zu logits, %.2g of the largest |logit| "
                "%.3g\n", worst, want.size(), worst / scale, scale);
    EXPECT_LE(worst, kExactBound * scale);
  }
}

std::string Tiny(const std::string& arch) {
  return test_util::SourceDir() + "/tests/data/hf_tiny/" + arch;
}

TEST(TensorParallelTest, TinyLlama) { CheckModel(Tiny("llama"), 20, 16, true); }
TEST(TensorParallelTest, TinyQwen2) { CheckModel(Tiny("qwen2"), 20, 16, true); }
TEST(TensorParallelTest, TinyGemma3) { CheckModel(Tiny("gemma3"), 20, 16, true); }

TEST(TensorParallelTest, Qwen25HasFourteenHeads) {
  const std::string path = test_util::ModelFile("qwen2.5-coder-0.5b-instruct-q4_k_m.gguf");
  if (path.empty()) GTEST_SKIP() << "model not downloaded";
  if (14 % World()->size() != 0) {
    StatusOr<std::unique_ptr<Model>> m = LoadModel(path, {.tp = World()});
    ASSERT_FALSE(m.ok());
    EXPECT_NE(m.status().message().find("14 attention heads cannot be split for tensor parallel "
                                        "size " + std::to_string(World()->size())),
              std::string::npos)
        << m.status().message();
    return;
  }
  CheckModel(path, 24, 16, false);
}

TEST(TensorParallelTest, Gemma3OneKvHead) {
  const std::string path = test_util::ModelFile("gemma-3-270m-q4_k_m.gguf");
  if (path.empty()) GTEST_SKIP() << "model not downloaded";
  CheckModel(path, 24, 16, false);
}

}  // namespace
}  // namespace peng

int main(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);
  peng::Communicator* world = peng::World();
  int rc = 0;
  if (world->rank() == 0) {
    rc = RUN_ALL_TESTS();
    peng::EndTensorParallelJob(world);
  } else {
    peng::EngineOptions o;  // threads; the model and KV come from rank 0
    o.threads = 1;
    const peng::Status st = peng::RunTensorParallelWorker(o, world);
    if (!st.ok()) world->Abort(st.ToString());
  }
  peng::FinalizeWorld();
  return rc;
}
