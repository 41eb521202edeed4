// Tensor and data parallelism against one process, under `mpirun -np N` with the job's layout
// from the command line (`--tp T --dp D`, N = T x D; default T = N): ctest runs tp 2, tp 4,
// dp 2 and tp 2 x dp 2, and tp 2 / dp 2 with `--device host` (the device graphs' shards and
// collectives, the path CUDA + NCCL take, and device replicas, against the CPU engine). Rank 0
// runs the tests; every other rank serves rank 0's engine cores (RunParallelWorker) until the
// end. For each model rank 0 computes, in the same process, the
// single-process reference (the whole model, a plain LocalExecutor) and the parallel result
// (CreateEngineCore with the layout: its shard of replica 0, the other ranks' shards and
// replicas; requests spread over the replicas):
//   - exact mode (FP32 activations, F32 KV cache): the logits of every prompt position within
//     kExactBound (relative) of one process -- only the order of the additions differs (the
//     all-reduce sums the ranks' partial dot products) -- and the 16-token greedy
//     continuations of three prompts decoded together identical;
//   - default mode, float-weight models: the greedy continuations identical too.
// Models: the tiny random HF folders (4 heads, 2 KV heads: split at tp 2, replicated at tp 4),
// Qwen2.5-Coder-0.5B Q4_K_M (14 heads, 2 KV heads; 14 heads cannot be split 4 ways: a clean
// error) and Gemma 3 270M Q4_K_M (1 KV head: replicated) when downloaded; DeepSeek-V2: the tiny
// HF fixtures (MLA heads split, latent cache replicated; each routed expert split, or with
// expert parallelism whole experts per rank) and a small V2-Lite-shaped Q4_0 GGUF written by
// make_deepseek_gguf (split kv_b, stacked experts; column splits at whole Q4_0 blocks).
#include <gtest/gtest.h>

#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>

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

int g_tp = 1, g_dp = 1, g_pp = 1;  // the job's layout (main)
std::string g_device = "cpu";  // --device of the parallel run (the reference runs on the CPU)
int64_t g_last_rank_memory = 0;  // --last-rank-device-memory: the emulator's memory there

EngineOptions Options(const std::string& path, DType kv, bool expert_parallel) {
  EngineOptions o;
  o.model_path = path;
  o.enable_expert_parallel = expert_parallel;
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

// The job's layout: this rank's shard of replica 0 + the other ranks'.
std::unique_ptr<EngineCore> ParallelCore(EngineOptions o) {
  o.tensor_parallel_size = g_tp;
  o.pipeline_parallel_size = g_pp;
  o.data_parallel_size = g_dp;
  o.device = g_device;
  auto core = CreateEngineCore(o);
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
// reproducible across tensor-parallel sizes (nor across llama.cpp's). `expert_parallel`: MoE
// models run whole experts per rank.
void CheckModel(const std::string& path, int n_prompt, int n_greedy, bool default_greedy,
                bool expert_parallel = false) {
  std::printf("model %s, tensor parallel size %d, pipeline parallel size %d, data parallel "
              "size %d%s\n", path.c_str(), g_tp, g_pp, g_dp,
              expert_parallel ? ", expert parallel" : "");
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
    EngineOptions o = Options(path, exact ? DType::kF32 : DType::kF16, expert_parallel);
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
    // Pipeline stages alone (and replicas) run the one process's ops in its order: the same
    // bits (on the CPU; the reference runs there).
    if (g_tp == 1 && g_device == "cpu") EXPECT_EQ(worst, 0.0);
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
  if (14 % g_tp != 0) {
    if (g_dp != 1) GTEST_SKIP() << "the error is checked with tensor parallelism alone";
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

// DeepSeek-V2 fixtures (4 heads, 8 routed experts of width 16, 1 shared, F32): "lite" (no q
// LoRA, greedy routing), "v2" (q LoRA, group-limited routing), "lite_fused" (transformers 5's
// fused gate_up experts). Routing is replicated, so the experts each token uses are those of
// one process; the greedy tokens are identical in both modes (float weights).
std::string TinyDeepseek(const std::string& name) {
  return test_util::SourceDir() + "/tests/data/deepseek_tiny/" + name;
}

TEST(TensorParallelTest, TinyDeepseekLite) { CheckModel(TinyDeepseek("lite"), 20, 16, true); }
TEST(TensorParallelTest, TinyDeepseekV2) { CheckModel(TinyDeepseek("v2"), 20, 16, true); }
TEST(ExpertParallelTest, TinyDeepseekLite) {
  CheckModel(TinyDeepseek("lite"), 20, 16, true, /*expert_parallel=*/true);
}
TEST(ExpertParallelTest, TinyDeepseekV2) {
  CheckModel(TinyDeepseek("v2"), 20, 16, true, /*expert_parallel=*/true);
}
TEST(ExpertParallelTest, TinyDeepseekFusedExperts) {
  CheckModel(TinyDeepseek("lite_fused"), 20, 16, true, /*expert_parallel=*/true);
}

// A V2-Lite-shaped Q4_0 file (2 layers: one dense, one MoE with 8 experts of width 128, top 2,
// 2 shared; 4 heads of 128 + 64 with kv_lora_rank 512, split attn_k_b / attn_v_b; vocabulary
// 1024) with random weights: every split lands on whole Q4_0 blocks (o: 128 columns per head;
// experts at tp 4: 32), tensor and expert parallel. Exact-mode logits and greedy tokens.
TEST(TensorParallelTest, DeepseekQ4_0) {
#ifndef PENG_MAKE_DEEPSEEK_GGUF
  GTEST_SKIP() << "make_deepseek_gguf is not built (PENG_BUILD_BENCH off)";
#else
  const std::string path = (std::filesystem::temp_directory_path() /
                            ("peng_tp_ds_" + std::to_string(::getpid()) + ".gguf")).string();
  const std::string cmd = std::string(PENG_MAKE_DEEPSEEK_GGUF) + " -o " + path +
                          " --layers 2 --dense 1 --experts 8 --shared 2 --topk 2 --vocab 1024"
                          " --hidden 256 --ffn 512 --moe-ffn 128 --heads 4 --threads 1 > /dev/null";
  ASSERT_EQ(std::system(cmd.c_str()), 0) << cmd;
  CheckModel(path, 12, 8, false);
  CheckModel(path, 12, 8, false, /*expert_parallel=*/true);
  std::filesystem::remove(path);
#endif
}

// Each rank binds only its own experts with expert parallelism, over all tp x dp ranks (with
// data parallelism the replicas share them): "lite" has 2 MoE layers of 8 experts (3 matrices
// each), so rank 0's model has 2 x 3 x (8 - 8 / (tp dp)) matrices fewer than the whole model
// (its other matrices are shards, one Linear each like the whole ones).
TEST(ExpertParallelTest, EachRankBindsItsOwnExperts) {
  const int ranks = g_tp * g_dp;
  StatusOr<std::unique_ptr<Model>> whole = LoadModel(TinyDeepseek("lite"));
  ASSERT_TRUE(whole.ok()) << whole.status().ToString();
  auto core = ParallelCore(Options(TinyDeepseek("lite"), DType::kF16, /*expert_parallel=*/true));
  ASSERT_TRUE(core);
  EXPECT_EQ((*whole)->Linears().size() - core->executor().model().Linears().size(),
            static_cast<size_t>(2 * 3 * (8 - 8 / ranks)));
}

// On devices, the default KV cache (here 4096 whole contexts of the tiny Llama: 32768 blocks,
// 64 MB a rank at tp 2) is the smallest any rank's share of its device holds, the same on every
// rank: the last rank's emulated device has 48 MB (--last-rank-device-memory), rank 0's 16 GiB,
// so the cache is capped below the 64 MB -- by less than the last rank's 0.9 x 48 MB -- and the
// job decodes as one process does (a rank with fewer blocks than rank 0's block ids would
// write past its cache).
TEST(TensorParallelTest, DefaultKvCacheIsTheSmallestRanksShare) {
  if (g_last_rank_memory == 0) GTEST_SKIP() << "no --last-rank-device-memory";
  const std::string path = Tiny("llama");
  EngineOptions o = Options(path, DType::kF16, false);
  o.num_kv_blocks = 0;
  o.max_num_seqs = 4096;
  o.max_model_len = 128;
  auto core = ParallelCore(o);
  ASSERT_TRUE(core);
  EngineStats st;
  core->FillStats(&st);
  const int64_t block = 2 * 2 * 16 * 2 * 2 * 16 / g_tp;  // (layers, K / V, KV heads, dims, F16)
  std::printf("default KV cache: %lld blocks (%lld bytes a rank)\n",
              static_cast<long long>(st.kv_blocks_total),
              static_cast<long long>(st.kv_blocks_total / g_dp * block));
  EXPECT_GT(st.kv_blocks_total, 0);
  EXPECT_LT(st.kv_blocks_total / g_dp * block, g_last_rank_memory * 9 / 10);
  o.num_kv_blocks = 64;
  auto one = SingleCore(o);
  ASSERT_TRUE(one);
  std::vector<std::vector<int32_t>> prompts;
  for (int i = 0; i < 3; ++i) prompts.push_back(Prompt(20, 256, 40 + i));
  EXPECT_EQ(GreedyBatch(core.get(), prompts, 8), GreedyBatch(one.get(), prompts, 8));
}

// Pipeline parallelism: each stage binds only its layers' weights and caches only their keys
// and values. The tiny Llama's 2 layers at pp 2: rank 0 holds layer 0 (its 7 matrices, shards
// of them under tp; the embedding and the head every stage) and half the KV bytes a token of
// its tensor-parallel shard of the whole model.
TEST(PipelineParallelTest, EachStageBindsItsOwnLayers) {
  if (g_pp == 1) GTEST_SKIP() << "no pipeline stages in this job";
  StatusOr<std::unique_ptr<Model>> whole = LoadModel(Tiny("llama"));
  ASSERT_TRUE(whole.ok()) << whole.status().ToString();
  auto core = ParallelCore(Options(Tiny("llama"), DType::kF16, false));
  ASSERT_TRUE(core);
  const Model& stage = core->executor().model();
  EXPECT_EQ((*whole)->Linears().size() - stage.Linears().size(), size_t{7});
  EXPECT_EQ(stage.kv_spec().BytesPerToken(DType::kF16) * 2,
            (*whole)->kv_spec().BytesPerToken(DType::kF16) / g_tp);
}

// Steps of over 32 tokens run as micro-batches through the stages (a 100-token prompt: four
// chunks of 26 or 27 tokens in its first step, PipelineStage::MicroBatches), with the same
// logits and tokens as one process.
TEST(PipelineParallelTest, MicroBatchesOfLongSteps) {
  if (g_pp == 1) GTEST_SKIP() << "no pipeline stages in this job";
  CheckModel(Tiny("llama"), 100, 16, true);
  CheckModel(TinyDeepseek("lite"), 100, 16, true);
}

// A request for the residual streams (Engine's return_hidden_states) is refused with stages,
// which each hold a part of them.
TEST(PipelineParallelTest, HiddenStatesAreRefused) {
  if (g_pp == 1) GTEST_SKIP() << "no pipeline stages in this job";
  if (g_dp > 1) GTEST_SKIP() << "data parallelism refuses it first";
  EngineOptions o = Options(Tiny("llama"), DType::kF16, false);
  o.max_num_seqs = 1;
  auto core = ParallelCore(o);
  ASSERT_TRUE(core);
  GenerateRequest r;
  r.id = "hidden";
  r.prompt = {1, 2, 3};
  r.return_hidden_states = true;
  const Status st = core->Add(std::move(r));
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(st.message(), "return_hidden_states needs an engine without pipeline stages");
}

// Data parallelism: each request goes to the replica with the fewest sequences; among the
// least loaded, to the one that has the prompt's prefix cached.
TEST(DataParallelTest, RequestsGoToTheLeastLoadedReplicaWithTheirPrefix) {
  if (g_dp == 1) GTEST_SKIP() << "no data parallelism in this job";
  const std::string path = Tiny("llama");
  EngineOptions o = Options(path, DType::kF16, false);
  auto core = ParallelCore(o);
  ASSERT_TRUE(core);
  EngineStats st;
  std::vector<std::vector<int32_t>> prompts;
  for (int i = 0; i < 2 * g_dp; ++i) prompts.push_back(Prompt(20, 256, 10 + i));
  for (size_t i = 0; i < prompts.size(); ++i) {
    GenerateRequest r;
    r.id = "r" + std::to_string(i);
    r.prompt = prompts[i];
    r.params.max_tokens = 2;
    ASSERT_TRUE(core->Add(std::move(r)).ok());
  }
  core->FillStats(&st);
  ASSERT_EQ(st.replicas.size(), static_cast<size_t>(g_dp));
  EXPECT_EQ(st.data_parallel_size, g_dp);
  for (const EngineStats::Replica& rep : st.replicas) EXPECT_EQ(rep.num_waiting, 2);
  while (core->HasUnfinished()) core->Step();
  // Request i went to replica i % dp (ties go to the lowest index); its first 16-token block is
  // cached there. The last prompt comes back: it goes to replica (2 dp - 1) % dp, not 0.
  GenerateRequest again;
  again.id = "again";
  again.prompt = prompts.back();
  again.params.max_tokens = 1;
  ASSERT_TRUE(core->Add(std::move(again)).ok());
  core->FillStats(&st);
  for (int d = 0; d < g_dp; ++d)
    EXPECT_EQ(st.replicas[d].num_waiting, d == g_dp - 1 ? 1 : 0) << "replica " << d;
  while (core->HasUnfinished()) core->Step();
}

}  // namespace
}  // namespace peng

int main(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);
  peng::Communicator* world = peng::World();
  peng::g_tp = 0;
  for (int i = 1; i + 1 < argc; ++i) {
    if (std::string(argv[i]) == "--tp") peng::g_tp = std::atoi(argv[i + 1]);
    if (std::string(argv[i]) == "--dp") peng::g_dp = std::atoi(argv[i + 1]);
    if (std::string(argv[i]) == "--pp") peng::g_pp = std::atoi(argv[i + 1]);
    if (std::string(argv[i]) == "--device") peng::g_device = argv[i + 1];
    if (std::string(argv[i]) == "--last-rank-device-memory")
      peng::g_last_rank_memory = std::atoll(argv[i + 1]);
  }
  if (peng::g_last_rank_memory > 0 && world->rank() == world->size() - 1)
    setenv("PENG_EMULATOR_DEVICE_MEMORY", std::to_string(peng::g_last_rank_memory).c_str(), 1);
  if (peng::g_tp == 0) peng::g_tp = world->size() / std::max(1, peng::g_dp * peng::g_pp);
  peng::EngineOptions o;  // the layout and threads; the model and KV come from rank 0
  o.threads = 1;
  o.tensor_parallel_size = peng::g_tp;
  o.pipeline_parallel_size = peng::g_pp;
  o.data_parallel_size = peng::g_dp;
  o.device = peng::g_device;
  const peng::StatusOr<bool> worker = peng::RunParallelWorker(o);
  if (!worker.ok()) world->Abort(worker.status().ToString());
  int rc = 0;
  if (!*worker) {
    rc = RUN_ALL_TESTS();
    peng::EndParallelJob();
  }
  peng::FinalizeWorld();
  return rc;
}
