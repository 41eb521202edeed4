// The CUDA conformance tests of whole graphs (part of cuda_device_test and cuda_emulator_test;
// the ops are in cuda_device_test.cc, whose opening comment gives the tolerances): the device
// graph against the host device's -- exact mode, quantized activations, every layer on equal
// inputs --, the kernels a decode step launches, and the golden checks of the real models.
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "cuda_test_util.h"
#include "engine/engine_test_util.h"
#include "engine/llm.h"
#include "golden_check.h"

namespace peng::cuda_test {
namespace {

// The kernels a decode step launches (Device::KernelLaunches, the GPU's work counter): steps 1-3
// of MakeSteps (two sequences, a token each, both wanting logits) launch the same kernels,
// recorded once and then replayed; for the models below, exactly the numbers their layers come
// to. A fusion that comes apart, or a kernel more a layer, changes them. Every logit row is a
// token's own, so no gather; the kernel producing a quantized GEMV's input -- the RMSNorm, the
// gated activation, the quantization -- runs inside that GEMV (FusedQGemvKernel,
// GatedExpertsQGemvKernel) where the GEMV has at most 3 blocks a multiprocessor; each sequence
// having one token, RoPE and the KV write run inside the attention (AttnRope), and MLA's inside
// the absorption (MlaRopeKv). The quantized files:
//   SmolLM2 (30 layers, Q4_1; LM head Q8_0) 153 = 1 embedding + 30 x 5 + 2 for the logits:
//     a layer is RMSNorm + quantize + q|k|v (one launch), RoPE + KV write + attention +
//     quantize, o (+ residual), RMSNorm + quantize + gate|up, SiLU + quantize + down (+
//     residual); the logits: RMSNorm + quantize (the LM head's 6144 blocks: on its own), the
//     LM head.
//   The small Q4_0 DeepSeek file (a dense layer, an MoE layer; every matrix Q4_0 but the F32
//     router) 17 = 1 + 7 + 8 + 1 for the logits (the norm inside the head's GEMV: 1024 rows).
//     Each layer's MLA part is 5: RMSNorm + quantize + q|kv_a, latent norm + RoPE + KV write +
//     absorb, attention, project + quantize, o. Then the dense FFN 2 (RMSNorm + quantize +
//     gate|up, SiLU + quantize + down), or the MoE 3: RMSNorm + quantize (for the routed experts
//     too) + shared gate|up + the router (F32, blocks of its own: RouteTail) + route (the last
//     of those), routed gate|up, the routed and the shared experts' SiLU + quantize + down with
//     their weighted sum (the last block of a token's rows: MoeDownKernel).
//   The tiny Llama's and Qwen2's W8A8 folders (2 layers, INT8 matrices, the LM head F32) 13 =
//     1 + 2 x 5 + 2: a layer as SmolLM2's, but its heads of 16 values are no whole group of
//     32, so the attention's output is quantized inside the o GEMV. The tiny DeepSeek-V2 Lite's
//     W8A8 folder 32 (its F32 original's 49 less the launches that the norms, activations and
//     quantizations inside the INT8 products' GEMVs save, the routed experts' input quantized
//     in the norm among them, and the router riding on the shared experts' gate|up; its experts'
//     down projections, 16 columns, stay F32).
// The F32 fixtures take the FP32 GEMVs (no quantization; norms and biases on their own; RoPE
// inside the attention or the absorption; Gemma 3's q and k norms inside the attention, its
// post-norms added to the residual stream in their kernel; the MoE layers' routing in the
// router's GEMV).
struct StepKernels {
  const char* file;  // the model's file or folder name
  int64_t kernels;
};
constexpr StepKernels kDecodeStepKernels[] = {
    {"smollm2-135m-instruct-q4_1.gguf", 153},
    {"peng_device_ds_q4_0_", 17},  // (QuantizedDeepseekPath)
    {"_llama_w8a8", 13},  // (device_test::Int8Folder)
    {"_qwen2_w8a8", 13},
    {"_lite_w8a8", 32},
    {"hf_tiny/llama", 25},
    {"hf_tiny/qwen2", 25},
    {"hf_tiny/gemma3", 42},
    {"deepseek_tiny/lite", 49},
    {"deepseek_tiny/lite_fused", 49},
    {"deepseek_tiny/v2", 55},
    {"deepseek_tiny/mscale", 55},
};
void ExpectDecodeStepKernels(const std::string& path, const device_test::Run& c) {
  ASSERT_GE(c.kernels.size(), 4u);
  std::printf("[cuda] %s: kernels a decode step %ld (the 27-token prefill: %ld)\n",
              path.c_str(), static_cast<long>(c.kernels[1]), static_cast<long>(c.kernels[0]));
  EXPECT_EQ(c.kernels[2], c.kernels[1]);
  EXPECT_EQ(c.kernels[3], c.kernels[1]);
  const StepKernels* want = nullptr;  // (the longest name found in the path)
  for (const StepKernels& k : kDecodeStepKernels)
    if (path.find(k.file) != std::string::npos &&
        (!want || std::strlen(k.file) > std::strlen(want->file)))
      want = &k;
  if (want) {
    EXPECT_EQ(c.kernels[1], want->kernels) << want->file;
  }
}

// Steps whose rows ask for their best logits (SeqBatchEntry::top_logits) on the device under
// test: exactly kernels::TopK of the rows the same steps give whole on the same device, two
// kernels more a decode step (Device::TopLogits), three with a row's token drawn
// (Device::DrawTokens: kernels::DrawInIdOrder's id), four with a row changed first as the
// engine would (Device::EditLogits), the prompt-logit rows whole.
TEST_F(CudaTest, TopLogitsStepsReturnTheRowsBest) {
  const std::string data = test_util::SourceDir() + "/tests/data/";
  for (const std::string& path :
       {data + "hf_tiny/llama", data + "deepseek_tiny/lite", data + "deepseek_tiny/serve"}) {
    SCOPED_TRACE(path);
    const device_test::Run whole = device_test::RunSteps(path, DeviceUnderTest(), DType::kF32);
    const device_test::Run top =
        device_test::RunSteps(path, DeviceUnderTest(), DType::kF32, nullptr, false, 64);
    ASSERT_GT(whole.logits.size(), 3u);
    device_test::ExpectTopOfWholeRows(whole, top, whole.logits[1].size() / 2);
    if (whole.kernels[2] > 0) {  // (not on "host")
      EXPECT_EQ(top.kernels[2], whole.kernels[2] + 2);
      EXPECT_EQ(top.kernels[1], whole.kernels[1] + 4);  // (a row edited and drawn)
      EXPECT_EQ(top.kernels[3], whole.kernels[3] + 3);  // (a row drawn: DrawTokens)
    }
  }
}

// Llm's options for a fixture (tests/data/...) on the device under test: one thread, 64 tokens.
LlmOptions FixtureOnDevice(const std::string& fixture) {
  LlmOptions o;
  o.model_path = test_util::SourceDir() + "/tests/data/" + fixture;
  o.device = DeviceUnderTest();
  o.threads = 1;
  o.max_model_len = 64;
  return o;
}

// The tiny Llama's engine on the device under test, its default KV cache 4096 whole contexts
// (128 MB: capped by the device's memory where a test cuts it).
EngineOptions TinyLlamaEngine() {
  EngineOptions o;
  o.model_path = test_util::SourceDir() + "/tests/data/hf_tiny/llama";
  o.device = DeviceUnderTest();
  o.threads = 1;
  o.max_num_seqs = 4096;
  o.measure_peaks = false;
  return o;
}

// Leaves `spare` bytes of the device's memory free while it lives (on a GPU up to 2 MiB more:
// its allocations' granularity): the emulator's memory cut to what is in use plus spare
// (PENG_EMULATOR_DEVICE_MEMORY), on a GPU the rest taken by allocations, the largest that
// succeed first.
class FreeMemoryCut {
 public:
  FreeMemoryCut(Device* d, int64_t spare) : d_(d) {
    const int64_t free = d->FreeMemoryBytes();
    if (Emulated()) {
      const int64_t in_use = d->TotalMemoryBytes() - free;
      EXPECT_EQ(setenv("PENG_EMULATOR_DEVICE_MEMORY", std::to_string(in_use + spare).c_str(), 1),
                0);
      return;
    }
    constexpr int64_t kPage = int64_t{2} << 20;
    for (int64_t chunk = (free - spare) / kPage * kPage; chunk >= kPage;) {
      auto b = d->FreeMemoryBytes() - spare >= chunk ? d->Alloc(chunk) : StatusOr<void*>(nullptr);
      if (b.ok() && *b) {
        ballast_.push_back(*b);
      } else {
        chunk = chunk / 2 / kPage * kPage;
      }
    }
  }
  ~FreeMemoryCut() {
    for (void* b : ballast_) d_->Free(b);
    unsetenv("PENG_EMULATOR_DEVICE_MEMORY");
  }
  FreeMemoryCut(const FreeMemoryCut&) = delete;
  FreeMemoryCut& operator=(const FreeMemoryCut&) = delete;

 private:
  Device* d_;
  std::vector<void*> ballast_;
};

// `peng bench --json`'s tg.kernels_per_step: Llm counts the kernels of its device, and a
// BenchDecode of n tokens is n + 1 one-token steps (the first from its one-token prompt), each
// the decode step counted above and the two of TopLogits (its greedy rows come back as their
// best logit, not whole).
TEST_F(CudaTest, LlmCountsTheKernelsOfItsDecodeSteps) {
  auto llm = Llm::Load(FixtureOnDevice("hf_tiny/llama"));
  ASSERT_TRUE(llm.ok()) << llm.status().ToString();
  EXPECT_EQ((*llm)->DeviceKernelLaunches(), 0);
  ASSERT_TRUE((*llm)->BenchDecode(2).ok());  // (records the graph)
  const int64_t k0 = (*llm)->DeviceKernelLaunches();
  ASSERT_TRUE((*llm)->BenchDecode(5).ok());
  EXPECT_EQ((*llm)->DeviceKernelLaunches() - k0, 6 * (25 + 2));
}

// A model that does not fit the device's free memory is a clear error when it loads, and the
// failed load gives back all it allocated; with the memory back the same model loads and
// decodes. Free memory is cut to `spare` bytes (FreeMemoryCut). The emulator tries several
// points of the load: inside the device's opening, and after it with room for part of the
// weights (about 440 KB).
TEST_F(CudaTest, AModelLargerThanTheDevicesMemoryIsAClearError) {
  if (DeviceUnderTest() == "host") GTEST_SKIP() << "the host device's memory is not counted";
  const LlmOptions o = FixtureOnDevice("deepseek_tiny/v2");
  std::vector<int64_t> spares = {int64_t{64} << 10};
  if (Emulated()) {
    const int64_t free = cuda_->FreeMemoryBytes();
    int64_t open = 0;  // what a device takes when it opens
    {
      auto d = backend::CreateDevice(DeviceUnderTest(), &pool_);
      ASSERT_TRUE(d.ok()) << d.status().ToString();
      open = free - (*d)->FreeMemoryBytes();
    }
    for (const int64_t part : {64, 128, 256, 384}) spares.push_back(open + (part << 10));
  }
  for (const int64_t spare : spares) {
    SCOPED_TRACE("spare " + std::to_string(spare));
    const FreeMemoryCut cut(cuda_.get(), spare);
    const int64_t left = cuda_->FreeMemoryBytes();
    {
      auto llm = Llm::Load(o);
      ASSERT_FALSE(llm.ok()) << "loaded in " << left << " bytes";
      std::printf("[cuda] %lld bytes free: %s\n", static_cast<long long>(left),
                  llm.status().ToString().c_str());
      EXPECT_EQ(llm.status().code(), StatusCode::kResourceExhausted);
      EXPECT_NE(llm.status().message().find("bytes of device memory"), std::string::npos);
    }
    // (a GPU's runtime may keep a page of its own)
    const int64_t slack = Emulated() ? 0 : int64_t{2} << 20;
    EXPECT_GE(cuda_->FreeMemoryBytes(), left - slack) << "the failed load kept device memory";
  }
  auto llm = Llm::Load(o);
  ASSERT_TRUE(llm.ok()) << llm.status().ToString();
  EXPECT_TRUE((*llm)->BenchDecode(2).ok());
}

// --gpu-memory-utilization: the default KV cache (4096 whole contexts of the tiny Llama's 128
// tokens, 128 MB at 4 KB a block) stops where the engine's share of the device's memory is
// full -- the share set so that it leaves the engine 64 MB past what is in use now (256 MB of
// the device free: FreeMemoryCut), so the memory still free after the engine starts is what
// the rest of the share leaves, within a block (and on a GPU the allocations' granularity) --;
// a share that the device's opening and the weights fill already is ResourceExhausted naming
// the flag, and keeps nothing.
TEST_F(CudaTest, GpuMemoryUtilizationCapsTheKvCache) {
  if (DeviceUnderTest() == "host") GTEST_SKIP() << "the host device's memory is not counted";
  EngineOptions o = TinyLlamaEngine();
  const FreeMemoryCut cut(cuda_.get(), int64_t{256} << 20);
  const int64_t total = cuda_->TotalMemoryBytes(), free = cuda_->FreeMemoryBytes();
  const int64_t block = 2 * 2 * 16 * 2 * 2 * 16, slack = Emulated() ? 0 : int64_t{2} << 20;
  const int64_t room = int64_t{64} << 20;  // (the device's opening, cuBLAS's on a GPU, in it)
  o.gpu_memory_utilization = 1 - static_cast<double>(free - room) / static_cast<double>(total);
  {
    auto e = Engine::Create(o);
    ASSERT_TRUE(e.ok()) << e.status().ToString();
    const int64_t left = cuda_->FreeMemoryBytes(), blocks = (*e)->GetStats().kv_blocks_total;
    std::printf("[cuda] --gpu-memory-utilization %.6f: %lld KV blocks, %lld bytes left of %lld "
                "(the share leaves %lld)\n", o.gpu_memory_utilization,
                static_cast<long long>(blocks), static_cast<long long>(left),
                static_cast<long long>(free), static_cast<long long>(free - room));
    EXPECT_GT(blocks, 0);
    EXPECT_LT(blocks * block, int64_t{128} << 20) << "not capped";
    EXPECT_GE(left, free - room - slack);
    EXPECT_LE(left, free - room + block + slack);
  }
  o.gpu_memory_utilization = 1 - static_cast<double>(free - (1 << 20)) / static_cast<double>(total);
  {
    auto e = Engine::Create(o);
    ASSERT_FALSE(e.ok());
    std::printf("[cuda] %s\n", e.status().ToString().c_str());
    EXPECT_EQ(e.status().code(), StatusCode::kResourceExhausted);
    EXPECT_NE(e.status().message().find("--gpu-memory-utilization"), std::string::npos);
  }
  EXPECT_GE(cuda_->FreeMemoryBytes(), free - slack);  // (nothing kept)
}

// The KV cache sized by the device's memory leaves the largest step its scratch
// (DeviceModel::ReserveStepScratch): with all but 1 MB of the free memory the engine's, steps
// of up to max_num_batched_tokens tokens (1024) and as many sequences run, and none allocates:
// the free memory after them is what it was when the engine had started. Without the
// reservation the KV cache takes that scratch's memory and the first step fails.
TEST_F(CudaTest, TheKvCacheLeavesTheLargestStepItsScratch) {
  if (DeviceUnderTest() == "host") GTEST_SKIP() << "the host device's memory is not counted";
  EngineOptions o = TinyLlamaEngine();  // (its default KV cache: 128 MB, capped)
  o.max_num_batched_tokens = 1024;
  o.max_waiting = 2048;
  const FreeMemoryCut cut(cuda_.get(), int64_t{64} << 20);
  const int64_t total = cuda_->TotalMemoryBytes(), free = cuda_->FreeMemoryBytes();
  const int64_t block = 2 * 2 * 16 * 2 * 2 * 16, slack = Emulated() ? 0 : int64_t{2} << 20;
  o.gpu_memory_utilization = 1 - static_cast<double>(1 << 20) / static_cast<double>(total);
  auto e = Engine::Create(o);
  ASSERT_TRUE(e.ok()) << e.status().ToString();
  const int64_t started = cuda_->FreeMemoryBytes(), blocks = (*e)->GetStats().kv_blocks_total;
  std::printf("[cuda] %lld KV blocks; %lld bytes free of %lld after the start\n",
              static_cast<long long>(blocks), static_cast<long long>(started),
              static_cast<long long>(free));
  EXPECT_LE(started, (1 << 20) + block + slack);
  EXPECT_LT(blocks * block, free - (int64_t{4} << 20)) << "no room kept for the scratch";
  std::vector<GenerateRequest> reqs;  // 12 prompts of 100 tokens: steps of 1024 tokens, then
  for (int i = 0; i < 12; ++i) {      // 176 and decodes; then 1024 sequences of one token
    test_util::Ids prompt(100);
    for (int t = 0; t < 100; ++t) prompt[t] = 3 + (i * 37 + t * 11) % 250;
    reqs.push_back(test_util::Greedy("long" + std::to_string(i), prompt, 2));
  }
  for (int i = 0; i < 1024; ++i)
    reqs.push_back(test_util::Greedy("one" + std::to_string(i), {3 + i % 250}, 1));
  for (const test_util::Result& r : test_util::RunBatch(e->get(), {reqs.begin(), reqs.begin() + 12}))
    EXPECT_EQ(r.finish[0], "length") << r.error;
  const std::vector<test_util::Result> ones =
      test_util::RunBatch(e->get(), {reqs.begin() + 12, reqs.end()});
  EXPECT_EQ(std::count_if(ones.begin(), ones.end(),
                          [](const test_util::Result& r) { return r.finish[0] == "length"; }),
            1024);
  EXPECT_GE(cuda_->FreeMemoryBytes(), started - slack);
}

// A device that loses its context (the emulator's PENG_EMULATOR_FAULT: every kernel, copy and
// synchronization fails, as after a kernel's illegal address) fails the request whose step it
// was running, and for good: the engine reports why (EngineStats::fatal_error, which the
// server's /health answers with 503 and peng_engine_healthy with 0) and refuses new requests.
// Before the fault requests run.
TEST_F(CudaTest, ADeviceThatLosesItsContextEndsTheEngine) {
  if (!Emulated()) GTEST_SKIP() << "the fault is the emulator's";
  EngineOptions o;
  o.model_path = test_util::SourceDir() + "/tests/data/hf_tiny/llama";
  o.device = DeviceUnderTest();
  o.threads = 1;
  o.measure_peaks = false;
  auto e = Engine::Create(o);
  ASSERT_TRUE(e.ok()) << e.status().ToString();
  const test_util::Result before = test_util::RunOne(e->get(), test_util::Greedy("a", {1, 2}, 4));
  EXPECT_EQ(before.finish[0], "length");
  EXPECT_TRUE((*e)->GetStats().fatal_error.empty());
  ASSERT_EQ(setenv("PENG_EMULATOR_FAULT", "1", 1), 0);
  const test_util::Result during = test_util::RunOne(e->get(), test_util::Greedy("b", {1, 2}, 4));
  unsetenv("PENG_EMULATOR_FAULT");
  EXPECT_EQ(during.finish[0], "error");
  EXPECT_NE(during.error.find("an illegal memory access"), std::string::npos) << during.error;
  // (the stats are published after the step whose events ended the stream)
  std::string fatal;
  const auto until = std::chrono::steady_clock::now() + test_util::Patience();
  while (fatal.empty() && std::chrono::steady_clock::now() < until) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
    fatal = (*e)->GetStats().fatal_error;
  }
  std::printf("[cuda] the engine after the fault: %s\n", fatal.c_str());
  EXPECT_NE(fatal.find("the GPU's context is lost"), std::string::npos) << fatal;
  auto refused = (*e)->Submit(test_util::Greedy("c", {1, 2}, 4));
  ASSERT_FALSE(refused.ok());
  EXPECT_NE(refused.status().message().find("the engine cannot run"), std::string::npos);
  EXPECT_EQ((*e)->GetStats().fatal_error, fatal);  // (for good, the fault gone or not)
}

// The graphs in the default mode (quantized GEMVs on both devices). The quantized GEMVs equal
// the host's within 1e-5 on equal inputs (above), but the graphs' inputs are not equal: the GPU
// sums in another order, and quantized activations amplify such differences -- a value near a
// rounding step lands one step apart and moves the next layer's inputs by a step, so a 1e-3
// change of the arithmetic moves the trained models' logits by 2-4e-2
// (device_graph_test, QuantizedActivationsAmplifySmallChanges). So the bound is the host's own
// distance between its quantized and exact logits, doubled: the noise of quantized activations.
// A path that is wrong (a scratch region misread, an epilogue lost, a stale recording) lands far
// past it; the F32 fixtures, which quantize nothing, are held to 1e-4. (Whether the device
// quantizes at all is the op tests' concern: its FP32 path misses their 1e-5.)
TEST_F(CudaTest, GraphsMatchTheHostDeviceWithQuantizedActivations) {
  for (const std::string& path : QuantizedGraphPaths()) {
    SCOPED_TRACE(path);
    kernels::SetExactActivations(true);
    const device_test::Run exact =
        device_test::RunSteps(path, "host", DType::kF32, nullptr, /*with_chunk=*/true);
    kernels::SetExactActivations(false);
    const device_test::Run h = device_test::RunSteps(path, "host", DType::kF32, nullptr, true);
    const device_test::Run c =
        device_test::RunSteps(path, DeviceUnderTest(), DType::kF32, nullptr, true);
    ASSERT_FALSE(h.logits.empty());
    const double noise = device_test::RelativeDistance(h.logits, exact.logits);
    const double d = device_test::RelativeDistance(h.logits, c.logits);
    std::printf("[cuda] graph %s, quantized activations: max |dlogit| / max |logit| = %.2e "
                "(host quantized vs exact: %.2e)\n",
                path.c_str(), d, noise);
    EXPECT_LE(d, std::max(1e-4, 2 * noise));
    ExpectDecodeStepKernels(path, c);
  }
  kernels::SetExactActivations(true);
}

// The largest over layers of max |a - b| / max |a| of each layer's output (blocks 1.. of two
// captured residual streams of `block` values a layer), and that layer.
std::pair<double, int64_t> WorstLayer(const std::vector<float>& a, const std::vector<float>& b,
                                      int64_t block) {
  std::pair<double, int64_t> worst{0.0, 0};
  for (int64_t l = 1; (l + 1) * block <= static_cast<int64_t>(std::min(a.size(), b.size()));
       ++l) {
    const std::vector<float> al(a.begin() + l * block, a.begin() + (l + 1) * block);
    const std::vector<float> bl(b.begin() + l * block, b.begin() + (l + 1) * block);
    const double d = device_test::RelativeDistance({al}, {bl});
    if (d > worst.first) worst = {d, l - 1};
  }
  return worst;
}

// Each layer on equal inputs: the host's residual stream entering every layer of the first step
// (a 27-token prefill, through the quantized GEMVs) replaces the device's own, so that the
// noise of quantized activations cannot build up from layer to layer (the test above). A few
// activations a layer may still land one rounding step apart, so the bound is relative to what
// quantizing does to the same layers: the host in exact mode on the same inputs. The device's
// worst layer must be within half the exact host's worst layer (distances from the host's
// quantized layers, relative to the largest |value| of the layer's output), or 1e-4 where
// nothing is quantized. Measured in the emulator: 2.4e-3 and 2.1e-3 (SmolLM2, the Q4_0
// DeepSeek file) against 1.0e-2 and 8.2e-3 for the FP32 path (PENG_CUDA_QGEMV=0), which is what
// the exact host computes: the bound tells the two apart.
TEST_F(CudaTest, EveryLayerOnEqualInputsWithQuantizedActivations) {
  for (const std::string& path : QuantizedGraphPaths()) {
    SCOPED_TRACE(path);
    kernels::SetExactActivations(false);
    const device_test::Run h = device_test::RunSteps(path, "host", DType::kF32);
    const device_test::Run c = device_test::RunSteps(path, DeviceUnderTest(), DType::kF32,
                                                     &h.hidden);
    kernels::SetExactActivations(true);
    const device_test::Run e = device_test::RunSteps(path, "host", DType::kF32, &h.hidden);
    ASSERT_EQ(h.hidden.size(), c.hidden.size());
    ASSERT_EQ(h.hidden.size(), e.hidden.size());
    const int64_t block =
        static_cast<int64_t>(device_test::MakeSteps(2).batches[0].tokens.size()) * h.hidden_size;
    ASSERT_GT(block, 0);
    const auto [worst, layer] = WorstLayer(h.hidden, c.hidden, block);
    const auto [exact_worst, exact_layer] = WorstLayer(h.hidden, e.hidden, block);
    std::printf("[cuda] layers of %s on equal inputs, quantized activations: worst max |d| / "
                "max |ref| = %.2e (layer %ld); exact host: %.2e (layer %ld)\n",
                path.c_str(), worst, static_cast<long>(layer), exact_worst,
                static_cast<long>(exact_layer));
    EXPECT_LE(worst, std::max(1e-4, 0.5 * exact_worst)) << "layer " << layer;
  }
  kernels::SetExactActivations(true);
}

TEST_F(CudaTest, DeepseekGraphMatchesTheHostDevice) {
  for (const std::string& path : device_test::DeepseekPaths()) {
    SCOPED_TRACE(path);
    const device_test::Run h = device_test::RunSteps(path, "host", DType::kF32, nullptr, true);
    const device_test::Run c =
        device_test::RunSteps(path, DeviceUnderTest(), DType::kF32, nullptr, true);
    ASSERT_FALSE(h.logits.empty());
    const double d = device_test::RelativeDistance(h.logits, c.logits);
    std::printf("[cuda] graph %s: max |dlogit| / max |logit| = %.2e\n", path.c_str(), d);
    EXPECT_LE(d, 1e-4);
  }
}

// The graph of the model at `path` on the device under test against the host device's, with a
// KV cache of `kv`: every step within 1e-3 of its own largest logit.
void ExpectGraphMatchesTheHostDevice(const std::string& path, DType kv) {
  SCOPED_TRACE(path);
  const device_test::Run h = device_test::RunSteps(path, "host", kv, nullptr, true);
  const device_test::Run c = device_test::RunSteps(path, DeviceUnderTest(), kv, nullptr, true);
  ASSERT_EQ(h.logits.size(), c.logits.size());
  ASSERT_FALSE(h.logits.empty());
  for (size_t i = 0; i < h.logits.size(); ++i) {
    const double d = device_test::RelativeDistance({h.logits[i]}, {c.logits[i]});
    std::printf("[cuda] graph %s, %s cache, step %zu: max |dlogit| / max |logit| = %.2e\n",
                path.c_str(), DTypeName(kv), i, d);
    EXPECT_LE(d, 1e-3) << "step " << i;
  }
}

TEST_F(CudaTest, DecoderGraphMatchesTheHostDevice) {
  for (const std::string& path : GraphModelPaths(/*smollm2=*/false))
    ExpectGraphMatchesTheHostDevice(path, DType::kF32);
}

// A Q8_0 cache (--kv-cache-dtype q8_0): the tiny Gemma 3 (head_dim 32: runs of 32) and the small
// Q4_0 DeepSeek file (MLA's 576-value latent rows: runs of 64) -- the rows rotated, quantized
// and read on the device as the CPU kernels do it.
TEST_F(CudaTest, Q8_0CacheGraphsMatchTheHostDevice) {
  ExpectGraphMatchesTheHostDevice(test_util::SourceDir() + "/tests/data/hf_tiny/gemma3",
                                  DType::kQ8_0);
  if (!QuantizedDeepseekPath().empty())
    ExpectGraphMatchesTheHostDevice(QuantizedDeepseekPath(), DType::kQ8_0);
}

// The graphs outside exact mode with an F16 cache -- and a Q8_0 one for the tiny Gemma 3 (head
// size 32) -- where the steps' prompts take the tensor cores (AttentionMmaKernel;
// AttentionMmaWideKernel for DeepSeek-V2's 32 + 16-value latent rows). The float fixtures
// quantize nothing, so the device's logits differ from the host's (with the same cache) by the
// tensor cores' FP16 operands: the queries and the softmax weights rounded as an F16 cache rounds
// the keys and values (a Q8_0 cache's scaled values rounded too). Every step is held to 3 times
// what the cache itself moves the host's logits (against an F32 cache, the worst step; the
// emulator: at most 1.9 times for F16 -- DeepSeek-V2's prompt step --, 0.15 for Q8_0, whose
// 8-bit rounding of the next layers' keys and values amplifies any change, as quantized
// activations do), the same graph on the FP32 tiles (PENG_CUDA_MMA_ATTENTION=0) to
// ExpectGraphMatchesTheHostDevice's 1e-3, and the first step (prompts of 20 and 7 tokens) on the
// tensor cores must differ from it.
TEST_F(CudaTest, GraphsWithPromptsOnTheTensorCores) {
  kernels::SetExactActivations(false);
  for (auto [fixture, kv] : {std::pair{"hf_tiny/llama", DType::kF16},
                             {"hf_tiny/gemma3", DType::kF16},
                             {"deepseek_tiny/v2", DType::kF16},
                             {"hf_tiny/gemma3", DType::kQ8_0}}) {
    const std::string path = test_util::SourceDir() + "/tests/data/" + fixture;
    SCOPED_TRACE(path + " " + DTypeName(kv));
    const device_test::Run h = device_test::RunSteps(path, "host", kv, nullptr, true);
    const device_test::Run h32 =
        device_test::RunSteps(path, "host", DType::kF32, nullptr, true);
    const device_test::Run c = device_test::RunSteps(path, DeviceUnderTest(), kv, nullptr, true);
    ASSERT_EQ(setenv("PENG_CUDA_MMA_ATTENTION", "0", 1), 0);
    const device_test::Run f = device_test::RunSteps(path, DeviceUnderTest(), kv, nullptr, true);
    unsetenv("PENG_CUDA_MMA_ATTENTION");
    ASSERT_EQ(h.logits.size(), c.logits.size());
    ASSERT_EQ(h.logits.size(), f.logits.size());
    ASSERT_EQ(h.logits.size(), h32.logits.size());
    ASSERT_FALSE(h.logits.empty());
    double cache = 0;
    for (size_t i = 0; i < h.logits.size(); ++i)
      cache = std::max(cache, device_test::RelativeDistance({h.logits[i]}, {h32.logits[i]}));
    for (size_t i = 0; i < h.logits.size(); ++i) {
      const double d = device_test::RelativeDistance({h.logits[i]}, {c.logits[i]});
      const double d32 = device_test::RelativeDistance({h.logits[i]}, {f.logits[i]});
      std::printf("[cuda] graph %s, %s cache, step %zu: max |dlogit| / max |logit| = %.2e "
                  "(FP32 tiles: %.2e; the cache's own, worst step: %.2e)\n", path.c_str(),
                  DTypeName(kv), i, d, d32, cache);
      EXPECT_LE(d, 3 * cache) << "step " << i;
      EXPECT_LE(d32, 1e-3) << "step " << i;
    }
    EXPECT_NE(c.logits[0], f.logits[0]) << "the prompts' step on the tensor cores";
  }
  kernels::SetExactActivations(true);
}

constexpr golden::Bounds kCudaHf = {true, 0.25, 0.1, 0.25};

class CudaGoldenTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (DeviceUnderTest().empty()) GTEST_SKIP() << "no CUDA device";
    if (Emulated() && !AllModelsEmulated())
      GTEST_SKIP() << "the emulator takes minutes a model (PENG_EMULATOR_MODELS=all)";
  }
};
TEST_F(CudaGoldenTest, SmolLM2) {
  golden::CheckModel("smollm2-135m-instruct-q4_1.hf.json", kCudaHf, DeviceUnderTest());
}
TEST_F(CudaGoldenTest, Gemma3) {
  golden::CheckModel("gemma-3-270m-q4_k_m.hf.json", kCudaHf, DeviceUnderTest());
}
TEST_F(CudaGoldenTest, Qwen25Coder) {
  golden::CheckModel("qwen2.5-coder-0.5b-instruct-q4_k_m.hf.json", kCudaHf, DeviceUnderTest());
}

}  // namespace
}  // namespace peng::cuda_test
