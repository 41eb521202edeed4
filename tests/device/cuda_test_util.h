// The harness of the CUDA conformance tests (cuda_device_test.cc: the ops; cuda_graph_test.cc:
// the graphs and golden checks; one binary, cuda_device_test -- and cuda_emulator_test on the
// CUDA emulator): the device under test, the models the graph tests take, and the CudaTest
// fixture (the device under test next to the host device, in exact mode).
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include <unistd.h>

#include "backend/device.h"
#include "device_test_util.h"
#include "kernels/ops.h"
#include "model/kv_cache.h"
#include "quant/random_weights.h"

namespace peng::cuda_test {

using backend::Device;
using backend::DeviceMatrix;

// The device under test: "cuda" ("cuda-emu", the CUDA emulator, in cuda_emulator_test), or
// PENG_TEST_DEVICE (e.g. "host": the harness itself checked against the reference on a machine
// without a GPU). Empty: skip.
inline std::string DeviceUnderTest() {
  const char* e = std::getenv("PENG_TEST_DEVICE");
#ifdef PENG_TEST_DEVICE_DEFAULT  // (cuda_emulator_test: "cuda-emu")
  const std::string spec = e && *e ? e : PENG_TEST_DEVICE_DEFAULT;
#else
  const std::string spec = e && *e ? e : "cuda";
#endif
  const bool gpu = spec == "cuda" || spec.rfind("cuda:", 0) == 0;
  if (gpu && backend::CudaDeviceCount() == 0) return "";
  return spec;
}

inline bool Emulated() { return DeviceUnderTest() == "cuda-emu"; }
// The emulator runs a trained model's graph in minutes (a block's threads are coroutines on one
// core): by default it takes the tiny fixtures and, where the quantized path is under test
// (smollm2), the smallest trained model, SmolLM2; PENG_EMULATOR_MODELS=all takes every model,
// as a GPU does.
inline bool AllModelsEmulated() {
  const char* e = std::getenv("PENG_EMULATOR_MODELS");
  return e && std::string(e) == "all";
}
inline std::vector<std::string> GraphModelPaths(bool smollm2) {
  std::vector<std::string> out;
  for (const std::string& p : device_test::ModelPaths())
    if (!Emulated() || AllModelsEmulated() || p.find(".gguf") == std::string::npos ||
        (smollm2 && p.find("smollm2") != std::string::npos))
      out.push_back(p);
  return out;
}

using device_test::QuantizedDeepseekPath;

// The models of the quantized-graph tests: GraphModelPaths with SmolLM2, the W8A8 folders of
// the tiny Llama, Qwen2 and DeepSeek-V2 Lite (device_test::Int8Folder), the DeepSeek fixtures
// and the small Q4_0 DeepSeek file where it could be written.
inline std::vector<std::string> QuantizedGraphPaths() {
  std::vector<std::string> paths = GraphModelPaths(/*smollm2=*/true);
  const std::string data = test_util::SourceDir() + "/tests/data/";
  for (const char* m : {"hf_tiny/llama", "hf_tiny/qwen2", "deepseek_tiny/lite"})
    paths.push_back(device_test::Int8Folder(data + m, "w8a8"));
  for (const std::string& p : device_test::DeepseekPaths()) paths.push_back(p);
  if (!QuantizedDeepseekPath().empty()) paths.push_back(QuantizedDeepseekPath());
  return paths;
}

class CudaTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const std::string spec = DeviceUnderTest();
    if (spec.empty()) GTEST_SKIP() << "no CUDA device";
    auto c = backend::CreateDevice(spec, &pool_);
    ASSERT_TRUE(c.ok()) << c.status().ToString();
    cuda_ = std::move(*c);
    auto h = backend::CreateDevice("host", &pool_);
    ASSERT_TRUE(h.ok());
    host_ = std::move(*h);
    kernels::SetExactActivations(true);
    std::printf("[cuda] %s\n", cuda_->Name().c_str());
  }
  void TearDown() override { kernels::SetExactActivations(false); }

  // n floats on both devices from the same host values.
  struct Pair {
    float* cuda;
    float* host;
  };
  Pair Upload(const std::vector<float>& v) {
    auto c = cuda_->UploadFloats(v.data(), static_cast<int64_t>(v.size()));
    auto h = host_->UploadFloats(v.data(), static_cast<int64_t>(v.size()));
    EXPECT_TRUE(c.ok() && h.ok());
    return {*c, *h};
  }
  Pair Zeros(int64_t n) { return Upload(std::vector<float>(n, 0.f)); }
  std::vector<float> Download(const float* p, int64_t n) {
    std::vector<float> out(n);
    EXPECT_TRUE(cuda_->CopyToHost(out.data(), p, n * 4).ok());
    return out;
  }
  // The CUDA result of `p` against the host's, within tol of the largest |host value|.
  void Expect(const Pair& p, int64_t n, double tol, const std::string& what) {
    const Status s = cuda_->Synchronize();
    ASSERT_TRUE(s.ok()) << what << ": " << s.ToString();
    const std::vector<float> got = Download(p.cuda, n);
    double scale = 1e-20, worst = 0;
    for (int64_t i = 0; i < n; ++i) scale = std::max(scale, std::abs(double{p.host[i]}));
    int64_t at = 0;
    for (int64_t i = 0; i < n; ++i) {
      const double d = std::abs(double{got[i]} - p.host[i]);
      if (!(d <= worst)) {
        worst = d;
        at = i;
      }
    }
    std::printf("[cuda] %-28s max |d| / max |ref| = %.2e\n", what.c_str(), worst / scale);
    EXPECT_LE(worst / scale, tol) << what << " at " << at << ": " << got[at] << " vs "
                                  << p.host[at];
  }
  // A KV layer of 9 blocks of 16 tokens on the device under test (*kc) and on the host device
  // (*kh), K (and V when v_head_dim > 0) holding the same random values in `t`.
  void RandomCache(DType t, int kv_heads, int head_dim, int v_head_dim, kernels::KvLayerView* kc,
                   kernels::KvLayerView* kh) {
    KvCacheSpec spec;
    spec.layers.push_back({kv_heads, head_dim, v_head_dim});
    int64_t k_bytes, v_bytes;
    *kc = *kh = spec.LayerView(0, 9, 16, t, &k_bytes, &v_bytes);
    for (auto [part, bytes] : {std::pair{&kernels::KvLayerView::k, k_bytes},
                               std::pair{&kernels::KvLayerView::v, v_bytes}}) {
      if (bytes == 0) continue;
      std::vector<uint8_t> init(bytes);
      ASSERT_TRUE(FillRandomWeights(t, bytes / static_cast<int64_t>(RowBytes(t, 1)), init.data(),
                                    &rng_).ok());
      for (auto [view, dev] : {std::pair{kc, cuda_.get()}, std::pair{kh, host_.get()}}) {
        view->*part = *dev->Alloc(bytes);
        ASSERT_TRUE(dev->CopyToDevice(view->*part, init.data(), bytes).ok());
      }
    }
  }
  std::vector<float> Random(int64_t n, float lo = -1.f, float hi = 1.f) {
    std::uniform_real_distribution<float> u(lo, hi);
    std::vector<float> v(n);
    for (float& x : v) x = u(rng_);
    return v;
  }

  ThreadPool pool_{2};
  std::unique_ptr<Device> cuda_, host_;
  std::mt19937_64 rng_{1234};
};

}  // namespace peng::cuda_test
