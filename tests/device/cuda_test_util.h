// The harness of the CUDA conformance tests (cuda_device_test.cc: the ops; cuda_graph_test.cc:
// the graphs and golden checks; one binary, cuda_device_test -- and cuda_emulator_test on the
// CUDA emulator): the device under test, the models the graph tests take, and the CudaTest
// fixture (the device under test next to the host device, in exact mode).
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <random>
#include <string>
#include <tuple>
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

// Random weights of type t [rows, cols] (quant/random_weights.h); INT8 with positive row
// scales.
inline std::vector<uint8_t> RandomMatrix(DType t, int64_t rows, int64_t cols, std::mt19937_64* rng,
                                  std::vector<float>* int8_scales) {
  std::vector<uint8_t> w(RowBytes(t, cols) * rows);
  const Status s = FillRandomWeights(t, rows * cols, w.data(), rng);
  EXPECT_TRUE(s.ok()) << s.ToString();
  if (t == DType::kI8) {
    std::uniform_real_distribution<float> pos(0.001f, 0.02f);
    int8_scales->resize(rows);
    for (float& x : *int8_scales) x = pos(*rng);
  }
  return w;
}

// n random [rows, cols] matrices of type t (a stack of experts): their bytes appended to
// *bytes, their views to *views, and INT8's row scales to *int8_scales where given.
inline void RandomExperts(DType t, int n, int64_t rows, int64_t cols, std::mt19937_64* rng,
                          std::vector<std::vector<uint8_t>>* bytes,
                          std::vector<TensorView>* views,
                          std::vector<std::vector<float>>* int8_scales = nullptr) {
  for (int e = 0; e < n; ++e) {
    std::vector<float> scales;
    bytes->push_back(RandomMatrix(t, rows, cols, rng, &scales));
    if (int8_scales) int8_scales->push_back(std::move(scales));
    TensorView v;
    v.name = "expert";
    v.dtype = t;
    v.shape = {rows, cols};
    v.data = bytes->back().data();
    v.size_bytes = bytes->back().size();
    views->push_back(v);
  }
}

// A random [rows, cols] matrix of a block-quantized, float or INT8 type t uploaded to both
// devices (cuda, host); its bytes (and INT8's row scales) appended to *keep (the host device
// runs on them). INT8 as W8A8 (int8_activations).
struct Uploaded {
  backend::DeviceMatrix cuda, host;
};
inline Uploaded UploadRandom(Device* cuda, Device* host, DType t, int64_t rows, int64_t cols,
                      std::mt19937_64* rng, std::vector<std::vector<uint8_t>>* keep) {
  std::vector<float> scales;
  keep->push_back(RandomMatrix(t, rows, cols, rng, &scales));
  TensorView v;
  v.name = std::string("w.") + DTypeName(t);
  v.dtype = t;
  v.shape = {rows, cols};
  v.data = keep->back().data();
  v.size_bytes = keep->back().size();
  const float* s = nullptr;
  if (!scales.empty()) {
    const uint8_t* b = reinterpret_cast<const uint8_t*>(scales.data());
    keep->emplace_back(b, b + scales.size() * sizeof(float));
    s = reinterpret_cast<const float*>(keep->back().data());
  }
  auto c = cuda->Upload(v, s);
  auto h = host->Upload(v, s);
  EXPECT_TRUE(c.ok() && h.ok());
  Uploaded u{c.ok() ? *c : backend::DeviceMatrix{}, h.ok() ? *h : backend::DeviceMatrix{}};
  u.cuda.int8_activations = u.host.int8_activations = t == DType::kI8;
  return u;
}

// A batch of three sequences (a 21-token prefill from 0, a decode at 40, a 5-token chunk from
// 30) over 6 blocks of 16 each, with its StepBatch on both devices.
struct AttnBatch {
  std::vector<int32_t> pos, seq_of_token, first, count, slot, offsets, tables_flat;
  std::vector<std::vector<int32_t>> tables;
  std::vector<const int32_t*> table_ptrs;
  backend::StepBatch host, cuda;
};

// V2-Lite's MLA shapes: 16 heads, r 512, d_nope 128, d_rope 64, d_v 128.
// Attention over n_heads query heads of head_dim values, scaled by 1 / sqrt(head_dim).
inline kernels::AttentionParams AttnParams(int n_heads, int head_dim, int sliding_window = 0,
                                           float softcap = 0.f) {
  kernels::AttentionParams p;
  p.n_heads = n_heads;
  p.scale = 1.f / std::sqrt(static_cast<float>(head_dim));
  p.sliding_window = sliding_window;
  p.softcap = softcap;
  return p;
}

inline kernels::MlaParams LiteMla() {
  kernels::MlaParams p;
  p.n_heads = 16;
  p.kv_lora_rank = 512;
  p.d_nope = 128;
  p.d_rope = 64;
  p.d_v = 128;
  p.scale = 0.1f;
  return p;
}

// Three sequences over blocks of 16 (tables {4, 1, 0}, {2, 5, 3}, {7, 6, 8}, or `tables`): n[s]
// tokens of sequence s from position pos0[s] (by default a 21-token prefill, a decode and a
// 5-token chunk).
inline void BuildBatch(Device* cuda, AttnBatch* a, std::array<int64_t, 3> pos0 = {0, 40, 30},
                       std::array<int64_t, 3> n = {21, 1, 5},
                       std::vector<std::vector<int32_t>> tables = {}) {
  a->tables = tables.empty() ? std::vector<std::vector<int32_t>>{{4, 1, 0}, {2, 5, 3}, {7, 6, 8}}
                             : std::move(tables);
  for (int s = 0; s < 3; ++s) {
    a->first.push_back(static_cast<int32_t>(a->pos.size()));
    a->count.push_back(static_cast<int32_t>(n[s]));
    a->offsets.push_back(static_cast<int32_t>(a->tables_flat.size()));
    a->tables_flat.insert(a->tables_flat.end(), a->tables[s].begin(), a->tables[s].end());
    a->table_ptrs.push_back(a->tables[s].data());
    for (int64_t i = 0; i < n[s]; ++i) {
      const int64_t p = pos0[s] + i;
      a->pos.push_back(static_cast<int32_t>(p));
      a->seq_of_token.push_back(s);
      a->slot.push_back(a->tables[s][p / 16] * 16 + static_cast<int32_t>(p % 16));
    }
  }
  backend::StepBatch& h = a->host;
  h.n_tokens = static_cast<int64_t>(a->pos.size());
  h.n_seqs = 3;
  h.pos = a->pos.data();
  h.seq_of_token = a->seq_of_token.data();
  h.seq_first_token = a->first.data();
  h.seq_n_tokens = a->count.data();
  h.block_tables = a->table_ptrs.data();
  a->cuda = h;
  auto up = [&](const std::vector<int32_t>& v) {
    auto p = cuda->Alloc(static_cast<int64_t>(v.size() * 4));
    EXPECT_TRUE(p.ok() && cuda->CopyToDevice(*p, v.data(), v.size() * 4).ok());
    return static_cast<const int32_t*>(*p);
  };
  a->cuda.d_pos = up(a->pos);
  a->cuda.d_slot = up(a->slot);
  a->cuda.d_seq_of_token = up(a->seq_of_token);
  a->cuda.d_table_offset = up(a->offsets);
  std::vector<int32_t> firsts = a->first;
  firsts.push_back(static_cast<int32_t>(h.n_tokens));
  a->cuda.d_seq_first_token = up(firsts);
  a->cuda.d_tables = up(a->tables_flat);
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
  // x on device d alone (where a test runs the same op on several devices in turn).
  static float* UploadTo(Device* d, const std::vector<float>& x) {
    auto p = d->UploadFloats(x.data(), static_cast<int64_t>(x.size()));
    EXPECT_TRUE(p.ok()) << p.status().ToString();
    return p.ok() ? *p : nullptr;
  }
  std::vector<float> Download(const float* p, int64_t n) {
    std::vector<float> out(n);
    EXPECT_TRUE(cuda_->CopyToHost(out.data(), p, n * 4).ok());
    return out;
  }
  // The CUDA result of `p` against the host's, within tol of the largest |host value|.
  void Expect(const Pair& p, int64_t n, double tol, const std::string& what) {
    ExpectNear(cuda_.get(), p.cuda, std::vector<float>(p.host, p.host + n), tol, what);
  }
  // x (n = ref.size() values on device d) against ref within tol of the largest |ref|.
  static void ExpectNear(Device* d, const float* x, const std::vector<float>& ref, double tol,
                         const std::string& what) {
    const Status s = d->Synchronize();
    ASSERT_TRUE(s.ok()) << what << ": " << s.ToString();
    std::vector<float> got(ref.size());
    ASSERT_TRUE(d->CopyToHost(got.data(), x, got.size() * 4).ok());
    double scale = 1e-20, worst = 0;
    for (float r : ref) scale = std::max(scale, std::abs(double{r}));
    size_t at = 0;
    for (size_t i = 0; i < ref.size(); ++i) {
      const double diff = std::abs(double{got[i]} - ref[i]);
      if (!(diff <= worst)) {  // (a NaN is the worst)
        worst = diff;
        at = i;
      }
    }
    std::printf("[cuda] %-44s max |d| / max |ref| = %.2e\n", what.c_str(), worst / scale);
    EXPECT_LE(worst / scale, tol) << what << " at " << at << ": " << got[at] << " vs " << ref[at];
  }
  // The bytes of a KV layer's keys (or values: 0 where it has none).
  static int64_t CacheBytes(const kernels::KvLayerView& v, bool values) {
    const int64_t row = int64_t{v.n_kv_heads} * (values ? v.v_head_dim : v.head_dim);
    return static_cast<int64_t>(RowBytes(v.dtype, v.num_blocks * v.block_size * row));
  }
  // The KV layer `from` (the host device's memory) copied to device d.
  static kernels::KvLayerView CopyCache(Device* d, const kernels::KvLayerView& from) {
    kernels::KvLayerView to = from;
    for (auto [part, values] : {std::pair{&kernels::KvLayerView::k, false},
                                std::pair{&kernels::KvLayerView::v, true}}) {
      const int64_t bytes = CacheBytes(from, values);
      if (bytes == 0) continue;
      to.*part = *d->Alloc(bytes);
      EXPECT_TRUE(d->CopyToDevice(to.*part, from.*part, bytes).ok());
    }
    return to;
  }
  // A KV layer of 9 (n_blocks) blocks of 16 tokens on the device under test (*kc) and on the
  // host device (*kh), K (and V when v_head_dim > 0) holding the same random values in `t`.
  void RandomCache(DType t, int kv_heads, int head_dim, int v_head_dim, kernels::KvLayerView* kc,
                   kernels::KvLayerView* kh, int64_t n_blocks = 9) {
    KvCacheSpec spec;
    spec.layers.push_back({kv_heads, head_dim, v_head_dim});
    int64_t k_bytes, v_bytes;
    *kh = spec.LayerView(0, n_blocks, 16, t, &k_bytes, &v_bytes);
    for (auto [part, bytes, dim] : {std::tuple{&kernels::KvLayerView::k, k_bytes, head_dim},
                                    std::tuple{&kernels::KvLayerView::v, v_bytes, v_head_dim}}) {
      if (bytes == 0) continue;
      kh->*part = *host_->Alloc(bytes);
      ASSERT_TRUE(FillRandomWeights(t, n_blocks * 16 * kv_heads * dim,
                                    static_cast<uint8_t*>(kh->*part), &rng_).ok());
    }
    *kc = CopyCache(cuda_.get(), *kh);
  }
  // The device under test made with the environment variable `name` set to "0" (a fusion off):
  // the path a fused one must equal.
  std::unique_ptr<Device> DeviceWithout(const char* name) {
    EXPECT_EQ(setenv(name, "0", 1), 0);
    auto made = backend::CreateDevice(DeviceUnderTest(), &pool_);
    unsetenv(name);
    EXPECT_TRUE(made.ok()) << made.status().ToString();
    return made.ok() ? std::move(*made) : nullptr;
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
