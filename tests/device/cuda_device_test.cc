// Conformance of the CUDA backend, its ops (the graphs: cuda_graph_test.cc, the same binary;
// the harness: cuda_test_util.h) (ctest label `cuda`; every test skips itself -- reported as
// skipped by ctest -- where no GPU is present; scripts/gpu_check.sh runs them on a GPU machine).
// The same source is also built as cuda_emulator_test (label unit, every CI run), whose device
// is the CUDA emulator ("cuda-emu": the backend's own sources run on the CPU,
// src/backend/cuda/emulator.h).
//
// 1. Every op against the host device (the CPU kernels; matrices in exact mode: FP32
//    activations times the dequantized weights) on random inputs. Tolerances, relative to the
//    largest |value| of the reference output:
//      GEMV (<= 64 tokens, FP32 throughout)          1e-4
//      GEMM (prefill, FP16 operands, FP32 accum.)    1e-2
//      RMSNorm, RoPE, activations, attention         1e-4 (F16 KV: both sides read the same
//                                                    rounded values)
// 2. The device graph on CUDA against the same graph on the host device (exact mode, F32 KV):
//    the steps of device_test_util.h (with a 39-token one: <= 64 tokens a step, so the GEMV
//    path, recorded as graphs), every logit
//    within 1e-3 of the largest |logit|; with quantized activations, within twice the host's
//    own distance between its quantized and exact logits (see the test).
// 3. The golden tests of the real models (tests/golden_check.h) through the engine with
//    --device cuda: against the float64 HF reference with bounds that allow for the FP16
//    prefill GEMMs (max |dlogit| <= 0.25 over the top-32, mean <= 0.1, top-1 and greedy
//    identical outside reference gaps < 0.25).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <random>
#include <tuple>

#include "backend/device.h"
#include "core/half.h"
#include "cuda_test_util.h"
#include "kernels/ops.h"
#include "model/kv_cache.h"
#include "quant/random_weights.h"

namespace peng::cuda_test {
namespace {

// Random weights of type t [rows, cols] (quant/random_weights.h); INT8 with positive row
// scales.
std::vector<uint8_t> RandomMatrix(DType t, int64_t rows, int64_t cols, std::mt19937_64* rng,
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
// *bytes, their views to *views.
void RandomExperts(DType t, int n, int64_t rows, int64_t cols, std::mt19937_64* rng,
                   std::vector<std::vector<uint8_t>>* bytes, std::vector<TensorView>* views) {
  for (int e = 0; e < n; ++e) {
    std::vector<float> unused;
    bytes->push_back(RandomMatrix(t, rows, cols, rng, &unused));
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
Uploaded UploadRandom(Device* cuda, Device* host, DType t, int64_t rows, int64_t cols,
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

TEST_F(CudaTest, MatMulEveryWeightType) {
  const int64_t rows = 96, cols = 512;  // cols: two K-quant super-blocks
  for (DType t : {DType::kF32, DType::kF16, DType::kBF16, DType::kI8, DType::kQ4_0, DType::kQ4_1,
                  DType::kQ5_0, DType::kQ5_1, DType::kQ8_0, DType::kQ4_K, DType::kQ5_K,
                  DType::kQ6_K}) {
    std::vector<float> scales;
    const std::vector<uint8_t> bytes = RandomMatrix(t, rows, cols, &rng_, &scales);
    TensorView view;
    view.name = std::string("w.") + DTypeName(t);
    view.dtype = t;
    view.shape = {rows, cols};
    view.data = bytes.data();
    view.size_bytes = bytes.size();
    auto wc = cuda_->Upload(view, scales.empty() ? nullptr : scales.data());
    auto wh = host_->Upload(view, scales.empty() ? nullptr : scales.data());
    ASSERT_TRUE(wc.ok()) << wc.status().ToString();
    ASSERT_TRUE(wh.ok()) << wh.status().ToString();
    for (int64_t T : {1, 3, 9, 33, 64, 65, 80}) {  // GEMV (one token, tiles), GEMM from 65
      const Pair x = Upload(Random(T * cols));
      const Pair y = Zeros(T * rows);
      cuda_->MatMul(*wc, x.cuda, T, y.cuda);
      host_->MatMul(*wh, x.host, T, y.host);
      Expect(y, T * rows, T <= 64 ? 1e-4 : 1e-2,
             std::string("MatMul ") + DTypeName(t) + " T=" + std::to_string(T));
    }
    // The embedding lookup of the same matrix.
    const std::vector<int32_t> tokens = {5, 0, 95, 17};
    backend::StepBatch bc, bh;
    auto tc = cuda_->Alloc(16);
    ASSERT_TRUE(tc.ok());
    ASSERT_TRUE(cuda_->CopyToDevice(*tc, tokens.data(), 16).ok());
    bc.n_tokens = bh.n_tokens = 4;
    bc.d_tokens = static_cast<const int32_t*>(*tc);
    bh.d_tokens = tokens.data();
    const Pair e = Zeros(4 * cols);
    cuda_->EmbedRows(*wc, bc, 0.5f, e.cuda);
    host_->EmbedRows(*wh, bh, 0.5f, e.host);
    Expect(e, 4 * cols, 1e-6, std::string("EmbedRows ") + DTypeName(t));
  }
}

// The kernel floor (peng bench's kernel_floor_us): a positive time, from launches that the
// work counter does not count (they are no step's).
TEST_F(CudaTest, KernelFloorIsMeasuredOffTheCount) {
  const int64_t k0 = cuda_->KernelLaunches();
  const double floor = cuda_->MeasureKernelFloor();
  std::printf("[cuda] an empty kernel in a step: %.2f us\n", floor * 1e6);
  EXPECT_GT(floor, 0);
  if (!Emulated()) {  // (the emulator: a millisecond or more)
    EXPECT_LT(floor, 1e-4);
  }
  EXPECT_EQ(cuda_->KernelLaunches(), k0);
  EXPECT_EQ(host_->MeasureKernelFloor(), 0);
}

TEST_F(CudaTest, NormsActivationsAndElementwise) {
  const int64_t rows = 7, n = 640;
  const Pair x = Upload(Random(rows * n, -3.f, 3.f));
  const Pair w = Upload(Random(n));
  const Pair y = Zeros(rows * n);
  cuda_->RmsNorm(x.cuda, w.cuda, 1.f, y.cuda, rows, n, 1e-6f);
  host_->RmsNorm(x.host, w.host, 1.f, y.host, rows, n, 1e-6f);
  Expect(y, rows * n, 1e-5, "RmsNorm");
  const Pair up = Upload(Random(rows * n));
  for (auto act : {backend::GatedActivation::kSilu, backend::GatedActivation::kGeluTanh}) {
    const Pair o = Zeros(rows * n);
    cuda_->Gated(act, x.cuda, up.cuda, o.cuda, rows * n);
    host_->Gated(act, x.host, up.host, o.host, rows * n);
    Expect(o, rows * n, 1e-5, act == backend::GatedActivation::kSilu ? "SiluMul" : "GeluTanhMul");
  }
  const Pair b = Upload(Random(n));
  cuda_->AddBiasRows(y.cuda, b.cuda, rows, n);
  host_->AddBiasRows(y.host, b.host, rows, n);
  cuda_->Add(y.cuda, x.cuda, rows * n);
  host_->Add(y.host, x.host, rows * n);
  cuda_->Scale(y.cuda, 3.f, rows * n);
  host_->Scale(y.host, 3.f, rows * n);
  cuda_->Softcap(y.cuda, 5.f, rows * n);
  host_->Softcap(y.host, 5.f, rows * n);
  Expect(y, rows * n, 1e-5, "bias, add, scale, softcap");
  const std::vector<int32_t> pick = {6, 0, 3};
  auto pc = cuda_->Alloc(12);
  ASSERT_TRUE(pc.ok() && cuda_->CopyToDevice(*pc, pick.data(), 12).ok());
  const Pair g = Zeros(3 * n);
  cuda_->GatherRows(x.cuda, static_cast<const int32_t*>(*pc), 3, n, g.cuda);
  host_->GatherRows(x.host, pick.data(), 3, n, g.host);
  Expect(g, 3 * n, 0, "GatherRows");
}

// TopLogits: the k best of each row, best first, and the first NaN / +inf, exactly as the host
// device's (kernels::TopK, FindNanOrPosInf) -- ties within and across the backend's chunks of
// 8192, -0.0 next to +0.0, NaN and +inf, a last chunk shorter than k, rows of equal values.
TEST_F(CudaTest, TopLogitsEqualTheHost) {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const float inf = std::numeric_limits<float>::infinity();
  for (int64_t n : {int64_t{1000}, int64_t{8192 + 3}, int64_t{40000}, int64_t{151936}}) {
    const int64_t rows = n > 100000 ? 2 : 5;
    std::vector<float> x = Random(rows * n, -6.f, 6.f);
    for (float& v : x) v = std::round(v * 8.f) / 8.f;  // ~100 distinct values: ties everywhere
    float* r1 = x.data() + n;
    r1[n / 2] = nan;
    r1[n - 1] = inf;
    r1[7] = 9.f;
    r1[n - 2] = 9.f;  // a tie for the best, far apart
    if (rows > 2) {
      std::fill(x.begin() + 2 * n, x.begin() + 3 * n, -inf);  // everything masked
      float* r3 = x.data() + 3 * n;
      for (int64_t i = 0; i < n; ++i) r3[i] = i % 3 == 0 ? -0.f : (i % 3 == 1 ? 0.f : -1.f);
      x[5 * n - 1] = 7.f;  // the best is the last value
    }
    const Pair d = Upload(x);
    for (int k : {1, 5, 40, 64}) {
      SCOPED_TRACE(testing::Message() << "n " << n << " k " << k);
      std::vector<float> hv(rows * k), cv(rows * k);
      std::vector<int32_t> hi(rows * k), ci(rows * k), hb(rows), cb(rows);
      host_->TopLogits(d.host, rows, n, k, hv.data(), hi.data(), hb.data(), nullptr);
      auto out = cuda_->Alloc(rows * (2 * k + 1) * 4);
      auto scratch = cuda_->Alloc(std::max<int64_t>(cuda_->TopLogitsScratchBytes(rows, n, k), 1));
      ASSERT_TRUE(out.ok() && scratch.ok());
      float* v = static_cast<float*>(*out);
      int32_t* i = reinterpret_cast<int32_t*>(v + rows * k);
      cuda_->TopLogits(d.cuda, rows, n, k, v, i, i + rows * k, *scratch);
      ASSERT_TRUE(cuda_->Synchronize().ok());
      ASSERT_TRUE(cuda_->CopyToHost(cv.data(), v, rows * k * 4).ok());
      ASSERT_TRUE(cuda_->CopyToHost(ci.data(), i, rows * k * 4).ok());
      ASSERT_TRUE(cuda_->CopyToHost(cb.data(), i + rows * k, rows * 4).ok());
      EXPECT_EQ(cb, hb);
      EXPECT_EQ(ci, hi);
      EXPECT_EQ(std::memcmp(cv.data(), hv.data(), rows * k * 4), 0);
      EXPECT_EQ(hb[1], n / 2);  // (the host's answers, as built)
      if (rows > 2) {
        EXPECT_EQ(hi[4 * k], n - 1);
        EXPECT_EQ(hi[2 * k], 0);
      }
      cuda_->Free(*out);
      cuda_->Free(*scratch);
    }
  }
}

// A batch of three sequences (a 21-token prefill from 0, a decode at 40, a 5-token chunk from
// 30) over 6 blocks of 16 each, with its StepBatch on both devices.
struct AttnBatch {
  std::vector<int32_t> pos, seq_of_token, first, count, slot, offsets, tables_flat;
  std::vector<std::vector<int32_t>> tables;
  std::vector<const int32_t*> table_ptrs;
  backend::StepBatch host, cuda;
};

void BuildBatch(Device* cuda, AttnBatch* a) {
  a->tables = {{4, 1, 0}, {2, 5, 3}, {7, 6, 8}};
  const int64_t pos0[] = {0, 40, 30}, n[] = {21, 1, 5};
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
  a->cuda.d_tables = up(a->tables_flat);
}

TEST_F(CudaTest, RopeKvWriteAndPagedAttention) {
  AttnBatch a;
  BuildBatch(cuda_.get(), &a);
  const int64_t T = a.host.n_tokens;
  for (DType kv_type : {DType::kF32, DType::kF16}) {
    for (int hd : {64, 128, 256}) {
      const int H = 8, KV = 2;
      const std::string tag = std::string(DTypeName(kv_type)) + " hd=" + std::to_string(hd);
      kernels::RopeConfig rope;
      rope.rot_dim = hd;
      rope.theta = 10000.f;
      for (auto style : {kernels::RopeStyle::kNeox, kernels::RopeStyle::kInterleaved}) {
        rope.style = style;
        std::vector<float> inv(hd / 2);
        kernels::ComputeRopeInvFreq(rope, inv.data());
        const Pair f = Upload(inv);
        const Pair q = Upload(Random(T * H * hd));
        cuda_->Rope(q.cuda, H, hd, H * hd, a.cuda, rope, f.cuda);
        host_->Rope(q.host, H, hd, H * hd, a.host, rope, f.host);
        Expect(q, T * H * hd, 1e-5, "Rope " + tag);
      }
      // A cache of 9 blocks holding random K/V at every position the batch's sequences have
      // before it, then the batch's own K/V written by KvWrite.
      kernels::KvLayerView kc, kh;
      RandomCache(kv_type, KV, hd, hd, &kc, &kh);
      const int64_t bytes = 9 * 16 * KV * hd * static_cast<int64_t>(RowBytes(kv_type, 1));
      const Pair k = Upload(Random(T * KV * hd)), v = Upload(Random(T * KV * hd));
      cuda_->KvWrite(kc, a.cuda, k.cuda, v.cuda);
      host_->KvWrite(kh, a.host, k.host, v.host);
      const Pair q = Upload(Random(T * H * hd));
      for (int window : {0, 8}) {
        for (float softcap : {0.f, 20.f}) {
          kernels::AttentionParams p;
          p.n_heads = H;
          p.scale = 1.f / std::sqrt(static_cast<float>(hd));
          p.sliding_window = window;
          p.softcap = softcap;
          const Pair o = Zeros(T * H * hd);
          cuda_->PagedAttention(q.cuda, kc, a.cuda, p, o.cuda);
          host_->PagedAttention(q.host, kh, a.host, p, o.host);
          Expect(o, T * H * hd, 1e-4,
                 "PagedAttention " + tag + " window=" + std::to_string(window) +
                     (softcap > 0 ? " softcap" : ""));
        }
      }
      // Copy-on-write of a block.
      cuda_->CopyKvBlock(kc, 4, 8);
      host_->CopyKvBlock(kh, 4, 8);
      std::vector<uint8_t> got(bytes);
      ASSERT_TRUE(cuda_->CopyToHost(got.data(), kc.k, bytes).ok());
      EXPECT_EQ(std::memcmp(got.data(), kh.k, bytes), 0) << "KV cache after writes and a copy";
      // The fused form: q and k rotated (the first half of each head, interleaved pairs), then
      // k and v written; the cache rows hold exactly the device's rotated k and its v.
      kernels::RopeConfig part = rope;
      part.rot_dim = hd / 2;
      part.style = kernels::RopeStyle::kInterleaved;
      std::vector<float> inv(hd / 4);
      kernels::ComputeRopeInvFreq(part, inv.data());
      const Pair f = Upload(inv);
      const Pair q2 = Upload(Random(T * H * hd)), k2 = Upload(Random(T * KV * hd));
      cuda_->RopeKvWrite({q2.cuda, H, hd, H * hd}, {k2.cuda, KV, hd, KV * hd}, a.cuda, part,
                         f.cuda, kc, k2.cuda, v.cuda);
      host_->RopeKvWrite({q2.host, H, hd, H * hd}, {k2.host, KV, hd, KV * hd}, a.host, part,
                         f.host, kh, k2.host, v.host);
      Expect(q2, T * H * hd, 1e-5, "RopeKvWrite q " + tag);
      Expect(k2, T * KV * hd, 1e-5, "RopeKvWrite k " + tag);
      const std::vector<float> k_rot = Download(k2.cuda, T * KV * hd);
      const std::vector<float> v_rows = Download(v.cuda, T * KV * hd);
      std::vector<uint8_t> kcache(bytes), vcache(bytes);
      ASSERT_TRUE(cuda_->CopyToHost(kcache.data(), kc.k, bytes).ok());
      ASSERT_TRUE(cuda_->CopyToHost(vcache.data(), kc.v, bytes).ok());
      auto stored = [&](const std::vector<uint8_t>& c, int64_t i) {
        return kv_type == DType::kF16 ? F16ToF32(reinterpret_cast<const uint16_t*>(c.data())[i])
                                      : reinterpret_cast<const float*>(c.data())[i];
      };
      auto rounded = [&](float x) { return kv_type == DType::kF16 ? F16ToF32(F32ToF16(x)) : x; };
      for (int64_t t = 0; t < T; ++t) {
        for (int64_t i = 0; i < KV * hd; ++i) {
          const int64_t at = int64_t{a.slot[t]} * KV * hd + i;
          ASSERT_EQ(stored(kcache, at), rounded(k_rot[t * KV * hd + i])) << tag << " k " << t;
          ASSERT_EQ(stored(vcache, at), rounded(v_rows[t * KV * hd + i])) << tag << " v " << t;
        }
      }
    }
  }
}

TEST_F(CudaTest, MlaOps) {
  // V2-Lite's shapes: 16 heads, r 512, d_nope 128, d_rope 64, d_v 128.
  AttnBatch a;
  BuildBatch(cuda_.get(), &a);
  const int64_t T = a.host.n_tokens;
  kernels::MlaParams p;
  p.n_heads = 16;
  p.kv_lora_rank = 512;
  p.d_nope = 128;
  p.d_rope = 64;
  p.d_v = 128;
  p.scale = 0.1f;
  const int64_t H = p.n_heads, r = p.kv_lora_rank, row = r + p.d_rope, dqk = p.d_nope + p.d_rope;
  const Pair w_kvb = Upload(Random(H * (p.d_nope + p.d_v) * r, -0.05f, 0.05f));
  backend::MlaWeights wc, wh;  // the FP32 copy only
  wc.kvb = w_kvb.cuda;
  wh.kvb = w_kvb.host;
  const Pair q = Upload(Random(T * H * dqk));
  const Pair qa = Zeros(T * H * row);
  cuda_->MlaAbsorbQuery(q.cuda, a.cuda, wc, p, qa.cuda);
  host_->MlaAbsorbQuery(q.host, a.host, wh, p, qa.host);
  Expect(qa, T * H * row, 1e-4, "MlaAbsorbQuery");
  // Strided RMSNorm of the latent part of each row and RoPE of its k_pe (as the graph does).
  const Pair ckv = Upload(Random(T * row));
  const Pair norm_w = Upload(Random(r));
  cuda_->RmsNorm(ckv.cuda, norm_w.cuda, 0.f, ckv.cuda, T, r, 1e-6f, row);
  host_->RmsNorm(ckv.host, norm_w.host, 0.f, ckv.host, T, r, 1e-6f, row);
  kernels::RopeConfig rope;
  rope.rot_dim = p.d_rope;
  rope.style = kernels::RopeStyle::kInterleaved;
  std::vector<float> inv(p.d_rope / 2);
  kernels::ComputeRopeInvFreq(rope, inv.data());
  const Pair f = Upload(inv);
  cuda_->Rope(ckv.cuda + r, 1, row, row, a.cuda, rope, f.cuda);
  host_->Rope(ckv.host + r, 1, row, row, a.host, rope, f.host);
  cuda_->Rope(q.cuda + p.d_nope, H, dqk, H * dqk, a.cuda, rope, f.cuda);
  host_->Rope(q.host + p.d_nope, H, dqk, H * dqk, a.host, rope, f.host);
  Expect(ckv, T * row, 1e-5, "strided RmsNorm + RoPE (k_pe)");
  Expect(q, T * H * dqk, 1e-5, "strided RoPE (q_pe)");
  for (DType kv_type : {DType::kF32, DType::kF16}) {
    kernels::KvLayerView kc, kh;  // the latent cache: one row of r + d_rope values, no V
    RandomCache(kv_type, 1, static_cast<int>(row), 0, &kc, &kh);
    cuda_->KvWrite(kc, a.cuda, ckv.cuda, nullptr);
    host_->KvWrite(kh, a.host, ckv.host, nullptr);
    const Pair ol = Zeros(T * H * r);
    cuda_->MlaAttention(qa.cuda, kc, a.cuda, p, ol.cuda);
    host_->MlaAttention(qa.host, kh, a.host, p, ol.host);
    Expect(ol, T * H * r, 1e-4, std::string("MlaAttention ") + DTypeName(kv_type));
    const Pair out = Zeros(T * H * p.d_v);
    cuda_->MlaProjectOutput(ol.cuda, a.cuda, wc, p, out.cuda);
    host_->MlaProjectOutput(ol.host, a.host, wh, p, out.host);
    Expect(out, T * H * p.d_v, 1e-4, std::string("MlaProjectOutput ") + DTypeName(kv_type));
  }
  // The projection with the output projection o after it (MlaProjectMatMuls; quantized mode:
  // the projection kernel quantizes its output for o, a Q4_0 matrix [64, H * d_v]).
  std::vector<std::vector<uint8_t>> bytes;
  const Uploaded wo = UploadRandom(cuda_.get(), host_.get(), DType::kQ4_0, 64, H * p.d_v, &rng_,
                                   &bytes);
  const Pair ol = Upload(Random(T * H * r));
  for (bool exact : {true, false}) {
    kernels::SetExactActivations(exact);
    const std::string tag = exact ? " exact" : " quantized";
    const Pair out = Zeros(T * H * p.d_v), y = Upload(Random(T * 64));
    cuda_->MlaProjectMatMuls(ol.cuda, a.cuda, wc, p, out.cuda,
                             {{&wo.cuda, y.cuda, nullptr, true}});
    host_->MlaProjectMatMuls(ol.host, a.host, wh, p, out.host,
                             {{&wo.host, y.host, nullptr, true}});
    Expect(out, T * H * p.d_v, 1e-4, "MlaProjectMatMuls: the projection" + tag);
    Expect(y, T * 64, exact ? 1e-4 : 3e-3, "MlaProjectMatMuls: o" + tag);
  }
  kernels::SetExactActivations(true);
}

// kv_b stored per head (attn_k_b / attn_v_b): the batch's decode token (its sequence's only
// one) multiplies k_b / v_b in their stored type, the other 26 tokens the FP32 copy (random
// and unrelated to k_b / v_b here, so a token on the wrong path cannot pass), in exact mode
// (FP32 activations) and quantized mode (the block formats' input rows quantized as the CPU
// quantizes them).
TEST_F(CudaTest, MlaStoredHeads) {
  AttnBatch a;
  BuildBatch(cuda_.get(), &a);
  const int64_t T = a.host.n_tokens;
  kernels::MlaParams p;
  p.n_heads = 16;
  p.kv_lora_rank = 512;
  p.d_nope = 128;
  p.d_rope = 64;
  p.d_v = 128;
  const int64_t H = p.n_heads, r = p.kv_lora_rank, row = r + p.d_rope;
  const Pair w_kvb = Upload(Random(H * (p.d_nope + p.d_v) * r, -0.05f, 0.05f));
  const Pair q = Upload(Random(T * H * (p.d_nope + p.d_rope)));
  const Pair ol = Upload(Random(T * H * r));
  std::vector<std::vector<uint8_t>> bytes;
  const Uploaded wo = UploadRandom(cuda_.get(), host_.get(), DType::kQ4_0, 64, H * p.d_v, &rng_,
                                   &bytes);
  // (k_b's type, v_b's): v_b's rows of r = 512 values also take the K-quants.
  for (auto [kt, vt] : {std::pair{DType::kQ4_0, DType::kQ4_0}, {DType::kQ8_0, DType::kQ4_K},
                        {DType::kQ5_1, DType::kQ6_K}, {DType::kF16, DType::kBF16}}) {
    std::vector<TensorView> views;
    views.reserve(2 * H);
    RandomExperts(kt, static_cast<int>(H), r, p.d_nope, &rng_, &bytes, &views);
    RandomExperts(vt, static_cast<int>(H), p.d_v, r, &rng_, &bytes, &views);
    std::vector<const TensorView*> k_b, v_b;
    for (int64_t h = 0; h < H; ++h) {
      k_b.push_back(&views[h]);
      v_b.push_back(&views[H + h]);
    }
    std::vector<void*> allocs_c, allocs_h;
    backend::MlaWeights wc, wh;
    wc.kvb = w_kvb.cuda;
    wh.kvb = w_kvb.host;
    auto kc = cuda_->UploadExperts(k_b, &allocs_c), kh = host_->UploadExperts(k_b, &allocs_h);
    auto vc = cuda_->UploadExperts(v_b, &allocs_c), vh = host_->UploadExperts(v_b, &allocs_h);
    ASSERT_TRUE(kc.ok() && kh.ok() && vc.ok() && vh.ok());
    wc.k_b = *kc;
    wh.k_b = *kh;
    wc.v_b = *vc;
    wh.v_b = *vh;
    for (bool exact : {true, false}) {
      kernels::SetExactActivations(exact);
      const std::string tag = std::string(" k_b ") + DTypeName(kt) + ", v_b " + DTypeName(vt) +
                              (exact ? ", exact" : ", quantized");
      const Pair qa = Zeros(T * H * row), out = Zeros(T * H * p.d_v);
      cuda_->MlaAbsorbQuery(q.cuda, a.cuda, wc, p, qa.cuda);
      host_->MlaAbsorbQuery(q.host, a.host, wh, p, qa.host);
      Expect(qa, T * H * row, 1e-5, "MlaAbsorbQuery" + tag);
      cuda_->MlaProjectOutput(ol.cuda, a.cuda, wc, p, out.cuda);
      host_->MlaProjectOutput(ol.host, a.host, wh, p, out.host);
      Expect(out, T * H * p.d_v, 1e-5, "MlaProjectOutput" + tag);
      // The decode token's row (t = 21) is the stored heads' product: kernels::MlaAbsorbQueryHeads.
      std::vector<float> want(H * row);
      const int64_t t = a.host.seq_first_token[1], dqk = p.d_nope + p.d_rope;
      kernels::MlaAbsorbQueryHeads(q.host + t * H * dqk, k_b.data(), p, want.data(), nullptr);
      for (int64_t i = 0; i < H * row; ++i)
        ASSERT_EQ(qa.host[t * H * row + i], want[i]) << "the host's decode token, at " << i;
      const Pair po = Zeros(T * H * p.d_v), y = Upload(Random(T * 64));
      cuda_->MlaProjectMatMuls(ol.cuda, a.cuda, wc, p, po.cuda,
                               {{&wo.cuda, y.cuda, nullptr, true}});
      host_->MlaProjectMatMuls(ol.host, a.host, wh, p, po.host,
                               {{&wo.host, y.host, nullptr, true}});
      Expect(po, T * H * p.d_v, 1e-5, "MlaProjectMatMuls: the projection" + tag);
      Expect(y, T * 64, exact ? 1e-4 : 3e-3, "MlaProjectMatMuls: o" + tag);
    }
  }
  kernels::SetExactActivations(true);
}

TEST_F(CudaTest, MoeOps) {
  const int64_t T = 37, D = 256, I = 96;
  for (auto method : {kernels::MoeRouting::Method::kGreedy,
                      kernels::MoeRouting::Method::kGroupLimitedGreedy,
                      kernels::MoeRouting::Method::kNoauxTc}) {
    kernels::MoeRouting p;
    p.n_experts = 64;
    p.k = 6;
    p.n_group = 8;
    p.topk_group = 3;
    p.method = method;
    p.sigmoid = method == kernels::MoeRouting::Method::kNoauxTc;
    p.norm_topk_prob = true;
    p.routed_scaling_factor = 2.5f;
    const Pair logits = Upload(Random(T * p.n_experts, -4.f, 4.f));
    const Pair bias = Upload(Random(p.n_experts, -0.1f, 0.1f));
    const bool with_bias = method == kernels::MoeRouting::Method::kNoauxTc;
    auto ids_c = cuda_->Alloc(T * p.k * 4);
    ASSERT_TRUE(ids_c.ok());
    std::vector<int32_t> ids_h(T * p.k), ids_got(T * p.k);
    const Pair w = Zeros(T * p.k);
    cuda_->MoeRoute(logits.cuda, with_bias ? bias.cuda : nullptr, T, p,
                    static_cast<int32_t*>(*ids_c), w.cuda);
    host_->MoeRoute(logits.host, with_bias ? bias.host : nullptr, T, p, ids_h.data(), w.host);
    ASSERT_TRUE(cuda_->CopyToHost(ids_got.data(), *ids_c, T * p.k * 4).ok());
    EXPECT_EQ(ids_got, ids_h) << "routing method " << static_cast<int>(method);
    Expect(w, T * p.k, 1e-6, "MoeRoute weights");
    // The selected experts' products (64 experts of Q4_K gate/up and Q6_K down).
    std::vector<std::vector<uint8_t>> bytes;
    std::vector<TensorView> views;
    std::vector<const TensorView*> gate, down;
    RandomExperts(DType::kQ4_K, p.n_experts, I, D, &rng_, &bytes, &views);
    RandomExperts(DType::kQ6_K, p.n_experts, D, 256, &rng_, &bytes, &views);
    for (int e = 0; e < 2 * p.n_experts; ++e)
      (e < p.n_experts ? gate : down).push_back(&views[e]);
    std::vector<void*> allocs_c, allocs_h;
    auto gc = cuda_->UploadExperts(gate, &allocs_c);
    auto gh = host_->UploadExperts(gate, &allocs_h);
    auto dc = cuda_->UploadExperts(down, &allocs_c);
    auto dh = host_->UploadExperts(down, &allocs_h);
    ASSERT_TRUE(gc.ok() && gh.ok() && dc.ok() && dh.ok());
    const Pair x = Upload(Random(T * D));
    const Pair g = Zeros(T * p.k * I);
    cuda_->ExpertsMatMul(*gc, x.cuda, T, static_cast<int32_t*>(*ids_c), p.k, false, g.cuda);
    host_->ExpertsMatMul(*gh, x.host, T, ids_h.data(), p.k, false, g.host);
    Expect(g, T * p.k * I, 1e-4, "ExpertsMatMul Q4_K (per token)");
    // Expert parallel: the odd experts held by another rank give zeros.
    std::vector<const TensorView*> even = gate;
    for (size_t e = 1; e < even.size(); e += 2) even[e] = nullptr;
    auto ec = cuda_->UploadExperts(even, &allocs_c);
    auto eh = host_->UploadExperts(even, &allocs_h);
    ASSERT_TRUE(ec.ok() && eh.ok());
    const Pair ge = Upload(std::vector<float>(T * p.k * I, 7.f));
    cuda_->ExpertsMatMul(*ec, x.cuda, T, static_cast<int32_t*>(*ids_c), p.k, false, ge.cuda);
    host_->ExpertsMatMul(*eh, x.host, T, ids_h.data(), p.k, false, ge.host);
    Expect(ge, T * p.k * I, 1e-4, "ExpertsMatMul, odd experts elsewhere");
    for (int64_t i = 0; i < T * p.k; ++i) {
      if (ids_h[i] % 2) {
        ASSERT_EQ(ge.host[i * I], 0.f);
      }
    }
    // down: [T * k, 256] inputs, one per slot
    const Pair act = Upload(Random(T * p.k * 256));
    const Pair ys = Zeros(T * p.k * D);
    cuda_->ExpertsMatMul(*dc, act.cuda, T, static_cast<int32_t*>(*ids_c), p.k, true, ys.cuda);
    host_->ExpertsMatMul(*dh, act.host, T, ids_h.data(), p.k, true, ys.host);
    Expect(ys, T * p.k * D, 1e-4, "ExpertsMatMul Q6_K (per slot)");
    const Pair o = Upload(Random(T * D));
    cuda_->SlotSum(ys.cuda, w.cuda, T, p.k, D, o.cuda);
    host_->SlotSum(ys.host, w.host, T, p.k, D, o.host);
    Expect(o, T * D, 1e-5, "SlotSum");
  }
}

// INT8 experts (peng quantize folders of DeepSeek models) in both schemes: W8A16 (exact mode:
// FP32 activations, per pair and grouped by expert past 32 tokens) and W8A8 (the per-pair
// integer GEMV over activations quantized in groups of 32, the gated kernel quantizing the
// routed hidden for the down projection); each expert's row scales applied in the store; the
// odd experts held by another rank (zeros).
TEST_F(CudaTest, Int8ExpertsInBothSchemes) {
  const int64_t E = 8, rows = 96, cols = 256;
  const int k = 3;
  std::vector<std::vector<uint8_t>> bytes;
  std::vector<std::vector<float>> scales(E);
  std::vector<TensorView> views;
  for (int64_t e = 0; e < E; ++e) {
    bytes.push_back(RandomMatrix(DType::kI8, rows, cols, &rng_, &scales[e]));
    TensorView v;
    v.name = "expert.int8";
    v.dtype = DType::kI8;
    v.shape = {rows, cols};
    v.data = bytes.back().data();
    v.size_bytes = bytes.back().size();
    views.push_back(v);
  }
  std::vector<const TensorView*> ep;
  std::vector<const float*> sp;
  for (int64_t e = 0; e < E; ++e) {
    ep.push_back(e % 2 ? nullptr : &views[e]);
    sp.push_back(e % 2 ? nullptr : scales[e].data());
  }
  std::vector<void*> allocs_c, allocs_h;
  ASSERT_FALSE(cuda_->UploadExperts(ep, &allocs_c).ok());  // (no scales: a clear error)
  for (bool w8a8 : {false, true}) {
    kernels::SetExactActivations(!w8a8);
    auto ec = cuda_->UploadExperts(ep, &allocs_c, sp, w8a8);
    auto eh = host_->UploadExperts(ep, &allocs_h, sp, w8a8);
    ASSERT_TRUE(ec.ok() && eh.ok()) << ec.status().ToString() << eh.status().ToString();
    for (int64_t T : w8a8 ? std::vector<int64_t>{1, 5} : std::vector<int64_t>{5, 37}) {
      const std::string tag = std::string(w8a8 ? " W8A8" : " W8A16") + " T=" + std::to_string(T);
      std::vector<int32_t> ids(T * k);
      for (int64_t i = 0; i < T * k; ++i) ids[i] = static_cast<int32_t>((i * 5 + i / k) % E);
      auto ids_c = cuda_->Alloc(T * k * 4);
      ASSERT_TRUE(ids_c.ok());
      ASSERT_TRUE(cuda_->CopyToDevice(*ids_c, ids.data(), T * k * 4).ok());
      const int32_t* idc = static_cast<int32_t*>(*ids_c);
      for (bool per_slot : {false, true}) {
        const Pair x = Upload(Random((per_slot ? T * k : T) * cols, -2.f, 2.f));
        const Pair y = Upload(std::vector<float>(T * k * rows, 7.f));
        cuda_->ExpertsMatMul(*ec, x.cuda, T, idc, k, per_slot, y.cuda);
        host_->ExpertsMatMul(*eh, x.host, T, ids.data(), k, per_slot, y.host);
        Expect(y, T * k * rows, w8a8 ? 1e-5 : 1e-4,
               std::string("INT8 experts") + (per_slot ? " per slot" : " per token") + tag);
      }
      // The gated down projection (hidden [T * k, cols]).
      const Pair g = Upload(Random(T * k * cols, -3.f, 3.f)), u = Upload(Random(T * k * cols));
      const Pair h = Zeros(T * k * cols), y = Zeros(T * k * rows);
      cuda_->GatedExpertsMatMul(backend::GatedActivation::kSilu, g.cuda, u.cuda, h.cuda, T, k,
                                cols, *ec, idc, y.cuda);
      host_->GatedExpertsMatMul(backend::GatedActivation::kSilu, g.host, u.host, h.host, T, k,
                                cols, *eh, ids.data(), y.host);
      Expect(y, T * k * rows, w8a8 ? 3e-3 : 1e-4, "INT8 experts, gated" + tag);
    }
  }
  kernels::SetExactActivations(true);
}

// NormMatMuls told of the routed experts next (a DeepSeek MoE layer: the norm before the
// router) quantizes their input in the norm's kernel (here the Q4_K product's GEMV, which runs
// the norm: NormQGemvKernel), so ExpertsMatMuls launches no quantize
// kernel -- unless a kernel wrote the scratch in between, and then it quantizes again. Q4_0
// experts (blocks of 32) next to a Q4_K product (blocks of 256): both in the norm's kernel.
TEST_F(CudaTest, NormPreparesTheRoutedExpertsInput) {
  kernels::SetExactActivations(false);
  const int64_t T = 3, D = 256, I = 64, E = 8;
  const int k = 2;
  std::vector<int32_t> ids(T * k);
  for (int64_t i = 0; i < T * k; ++i) ids[i] = static_cast<int32_t>((i * 3 + 1) % E);
  auto ids_c = cuda_->Alloc(T * k * 4);
  ASSERT_TRUE(ids_c.ok());
  ASSERT_TRUE(cuda_->CopyToDevice(*ids_c, ids.data(), T * k * 4).ok());
  const int32_t* idc = static_cast<int32_t*>(*ids_c);
  std::vector<std::vector<uint8_t>> bytes;
  std::vector<TensorView> views;
  RandomExperts(DType::kQ4_0, E, I, D, &rng_, &bytes, &views);
  std::vector<const TensorView*> ep;
  for (const TensorView& v : views) ep.push_back(&v);
  std::vector<void*> allocs_c, allocs_h;
  auto ec = cuda_->UploadExperts(ep, &allocs_c);
  auto eh = host_->UploadExperts(ep, &allocs_h);
  ASSERT_TRUE(ec.ok() && eh.ok());
  const Uploaded wk = UploadRandom(cuda_.get(), host_.get(), DType::kQ4_K, 40, D, &rng_, &bytes);
  const Uploaded w0 = UploadRandom(cuda_.get(), host_.get(), DType::kQ4_0, 40, D, &rng_, &bytes);
  const Pair nw = Upload(Random(D, 0.5f, 1.5f));
  for (bool overwrite : {false, true}) {
    const std::string tag = overwrite ? " (scratch written in between)" : "";
    const Pair x = Upload(Random(T * D, -2.f, 2.f)), other = Upload(Random(T * D, -2.f, 2.f));
    const Pair h = Zeros(T * D), a = Zeros(T * 40), b = Zeros(T * 40), g = Zeros(T * k * I);
    const int64_t k0 = cuda_->KernelLaunches();
    cuda_->NormMatMuls(x.cuda, nw.cuda, 0.f, 1e-6f, h.cuda, T, D, {{&wk.cuda, a.cuda}}, &*ec);
    host_->NormMatMuls(x.host, nw.host, 0.f, 1e-6f, h.host, T, D, {{&wk.host, a.host}}, &*eh);
    if (overwrite) {  // a Q4_0 product of another x: the 32-block region rewritten
      cuda_->MatMuls(other.cuda, T, {{&w0.cuda, b.cuda}});
      host_->MatMuls(other.host, T, {{&w0.host, b.host}});
    }
    const int64_t k1 = cuda_->KernelLaunches();
    cuda_->ExpertsMatMuls(h.cuda, T, idc, k, false, {{&*ec, g.cuda}});
    host_->ExpertsMatMuls(h.host, T, ids.data(), k, false, {{&*eh, g.host}});
    // the norm inside the Q4_K product's GEMV (+ quantize + Q4_0 product), then the experts
    // (+ quantize)
    EXPECT_EQ(k1 - k0, overwrite ? 3 : 1) << tag;
    EXPECT_EQ(cuda_->KernelLaunches() - k1, overwrite ? 2 : 1) << tag;
    Expect(a, T * 40, 3e-3, "NormMatMuls Q4_K" + tag);
    Expect(g, T * k * I, 3e-3, "ExpertsMatMuls Q4_0 after the norm" + tag);
    if (overwrite) Expect(b, T * 40, 1e-5, "MatMuls Q4_0 in between");
  }
  kernels::SetExactActivations(true);
}

// The fused ops of a DeepSeek layer against their parts on the host device: the routed
// experts' gated down projection (GatedExpertsMatMul; quantized mode: the gated kernel
// quantizes the hidden as it computes it) and MLA's latent norm inside RopeKvWrite.
TEST_F(CudaTest, FusedExpertsAndLatentNorm) {
  const int64_t T = 5, D = 192, n = 256, E = 16;
  const int k = 3;
  std::vector<int32_t> ids(T * k);
  for (int64_t i = 0; i < T * k; ++i) ids[i] = static_cast<int32_t>((i * 7 + i / k) % E);
  auto ids_c = cuda_->Alloc(T * k * 4);
  ASSERT_TRUE(ids_c.ok());
  ASSERT_TRUE(cuda_->CopyToDevice(*ids_c, ids.data(), T * k * 4).ok());
  std::vector<std::vector<uint8_t>> bytes;
  std::vector<TensorView> views;
  RandomExperts(DType::kQ8_0, E, D, n, &rng_, &bytes, &views);
  std::vector<const TensorView*> down;
  for (const TensorView& v : views) down.push_back(&v);
  std::vector<void*> allocs_c, allocs_h;
  auto dc = cuda_->UploadExperts(down, &allocs_c);
  auto dh = host_->UploadExperts(down, &allocs_h);
  ASSERT_TRUE(dc.ok() && dh.ok());
  for (bool exact : {true, false}) {
    kernels::SetExactActivations(exact);
    const std::string tag = exact ? " exact" : " quantized";
    const Pair g = Upload(Random(T * k * n, -4.f, 4.f)), u = Upload(Random(T * k * n));
    const Pair y = Zeros(T * k * D);
    cuda_->GatedExpertsMatMul(backend::GatedActivation::kSilu, g.cuda, u.cuda, g.cuda, T, k, n,
                              *dc, static_cast<int32_t*>(*ids_c), y.cuda);
    host_->GatedExpertsMatMul(backend::GatedActivation::kSilu, g.host, u.host, g.host, T, k, n,
                              *dh, ids.data(), y.host);
    Expect(g, T * k * n, 1e-5, "GatedExpertsMatMul: SiLU * up" + tag);
    Expect(y, T * k * D, exact ? 1e-4 : 3e-3, "GatedExpertsMatMul Q8_0" + tag);
  }
  kernels::SetExactActivations(true);
  // An MLA cache row [c | k_pe] of V2-Lite's shape: c normalized, k_pe rotated, then stored.
  AttnBatch a;
  BuildBatch(cuda_.get(), &a);
  const int64_t Ta = a.host.n_tokens, r = 512, dr = 64, row = r + dr;
  kernels::RopeConfig rope;
  rope.rot_dim = static_cast<int>(dr);
  rope.theta = 10000.f;
  rope.style = kernels::RopeStyle::kInterleaved;
  std::vector<float> inv(dr / 2);
  kernels::ComputeRopeInvFreq(rope, inv.data());
  const Pair f = Upload(inv);
  const Pair norm_w = Upload(Random(r, 0.5f, 1.5f));
  const Pair ckv = Upload(Random(Ta * row, -3.f, 3.f));
  kernels::KvLayerView kc, kh;
  RandomCache(DType::kF32, 1, static_cast<int>(row), 0, &kc, &kh);
  cuda_->RopeKvWrite({}, {ckv.cuda + r, 1, row, row}, a.cuda, rope, f.cuda, kc, ckv.cuda, nullptr,
                     {ckv.cuda, norm_w.cuda, 1e-6f, r, row});
  host_->RopeKvWrite({}, {ckv.host + r, 1, row, row}, a.host, rope, f.host, kh, ckv.host, nullptr,
                     {ckv.host, norm_w.host, 1e-6f, r, row});
  Expect(ckv, Ta * row, 1e-5, "RopeKvWrite with the latent norm");
  const int64_t cache_floats = 9 * 16 * row;
  std::vector<float> got(cache_floats);
  ASSERT_TRUE(cuda_->CopyToHost(got.data(), kc.k, cache_floats * 4).ok());
  const float* want = static_cast<const float*>(kh.k);
  double worst = 0, scale = 1e-20;
  for (int64_t i = 0; i < cache_floats; ++i) {
    worst = std::max(worst, std::abs(double{got[i]} - want[i]));
    scale = std::max(scale, std::abs(double{want[i]}));
  }
  std::printf("[cuda] %-28s max |d| / max |ref| = %.2e\n", "the latent cache", worst / scale);
  EXPECT_LE(worst / scale, 1e-5);
}

// The attention's output quantized by the attention kernel for the output projection
// (AttentionMatMuls, Q4_1: blocks of 32 -- and Q4_K, 256, which takes the separate quantizer),
// and SlotSum folded into a product's store (MatMulOut::slots), against the host device.
TEST_F(CudaTest, FusedAttentionOutputAndSlotSum) {
  AttnBatch a;
  BuildBatch(cuda_.get(), &a);
  const int64_t T = a.host.n_tokens;
  const int H = 8, KV = 2, hd = 64;
  std::vector<std::vector<uint8_t>> bytes;
  const Uploaded wo4_1 = UploadRandom(cuda_.get(), host_.get(), DType::kQ4_1, 96, H * hd, &rng_,
                                      &bytes);
  const Uploaded wo4_k = UploadRandom(cuda_.get(), host_.get(), DType::kQ4_K, 96, H * hd, &rng_,
                                      &bytes);
  kernels::KvLayerView kc, kh;
  RandomCache(DType::kF16, KV, hd, hd, &kc, &kh);
  const Pair q = Upload(Random(T * H * hd));
  kernels::AttentionParams p;
  p.n_heads = H;
  p.scale = 1.f / std::sqrt(static_cast<float>(hd));
  for (bool exact : {true, false}) {
    kernels::SetExactActivations(exact);
    for (const Uploaded* wo : {&wo4_1, &wo4_k}) {
      const std::string tag = std::string(DTypeName(wo->cuda.dtype)) +
                              (exact ? " exact" : " quantized");
      const Pair o = Zeros(T * H * hd), y = Upload(Random(T * 96));
      cuda_->AttentionMatMuls(q.cuda, kc, a.cuda, p, o.cuda, {{&wo->cuda, y.cuda, nullptr, true}});
      host_->AttentionMatMuls(q.host, kh, a.host, p, o.host, {{&wo->host, y.host, nullptr, true}});
      Expect(o, T * H * hd, 1e-4, "AttentionMatMuls: attention " + tag);
      Expect(y, T * 96, exact ? 1e-4 : 3e-3, "AttentionMatMuls: o " + tag);
    }
    // y += W x + bias + the slots' weighted rows (k = 3 rows of 96 a token); GEMV and GEMM.
    const int k = 3;
    for (int64_t Ts : {5, 72}) {
      if (!exact && Ts > 64) continue;  // (prefill is FP32 either way)
      const Pair x = Upload(Random(Ts * H * hd)), bias = Upload(Random(96));
      const Pair rows = Upload(Random(Ts * k * 96)), w = Upload(Random(Ts * k));
      const Pair y = Upload(Random(Ts * 96));
      cuda_->MatMuls(x.cuda, Ts,
                     {{&wo4_1.cuda, y.cuda, bias.cuda, true, {rows.cuda, w.cuda, k}}});
      host_->MatMuls(x.host, Ts,
                     {{&wo4_1.host, y.host, bias.host, true, {rows.host, w.host, k}}});
      Expect(y, Ts * 96, Ts > 64 ? 1e-2 : exact ? 1e-4 : 3e-3,
             std::string("MatMuls + slot sum") + (exact ? " exact" : " quantized") +
                 " T=" + std::to_string(Ts));
    }
  }
  kernels::SetExactActivations(true);
}

// The quantized GEMVs (default mode: activations quantized as the CPU kernels quantize them,
// backend/cuda/weight_layout.h; INT8 as W8A8, kernels::QuantizeActivations' groups of 32): the
// integer parts equal the host's, so the results differ by the order of FP32 sums only. 2816
// columns: 88 units (lanes take 2-3 each), 11 K-quant super-blocks.
TEST_F(CudaTest, QuantizedGemvMatchesTheCpuQuantizedPath) {
  kernels::SetExactActivations(false);
  const int64_t rows = 77, cols = 2816;
  std::vector<std::vector<uint8_t>> bytes;
  const std::vector<DType> types = {DType::kQ4_0, DType::kQ4_1, DType::kQ5_0, DType::kQ5_1,
                                    DType::kQ8_0, DType::kQ4_K, DType::kQ5_K, DType::kQ6_K,
                                    DType::kF16,  DType::kI8};
  std::vector<backend::DeviceMatrix> wc, wh;
  for (DType t : types) {
    const Uploaded w = UploadRandom(cuda_.get(), host_.get(), t, rows, cols, &rng_, &bytes);
    wc.push_back(w.cuda);
    wh.push_back(w.host);
  }
  for (int64_t T : {1, 3, 9, 32, 64}) {
    std::vector<float> xv = Random(T * cols, -3.f, 3.f);
    for (int64_t c = 0; c < 32; ++c) xv[c] = 0.f;  // a block of zeros (scale 0)
    const Pair x = Upload(xv);
    for (size_t i = 0; i < types.size(); ++i) {
      const Pair y = Zeros(T * rows);
      cuda_->MatMul(wc[i], x.cuda, T, y.cuda);
      host_->MatMul(wh[i], x.host, T, y.host);
      Expect(y, T * rows, 1e-5,
             std::string("quantized MatMul ") + DTypeName(types[i]) + " T=" + std::to_string(T));
    }
    // One x for a 32-block type, a K-quant and a float type: both activation blocks at once.
    const Pair a = Zeros(T * rows), b = Zeros(T * rows), f = Zeros(T * rows);
    cuda_->MatMuls(x.cuda, T, {{&wc[4], a.cuda}, {&wc[5], b.cuda}, {&wc[8], f.cuda}});
    host_->MatMuls(x.host, T, {{&wh[4], a.host}, {&wh[5], b.host}, {&wh[8], f.host}});
    Expect(a, T * rows, 1e-5, "MatMuls Q8_0 T=" + std::to_string(T));
    Expect(b, T * rows, 1e-5, "MatMuls Q4_K T=" + std::to_string(T));
    Expect(f, T * rows, 1e-4, "MatMuls F16 T=" + std::to_string(T));
  }
  // The other row splits of the GEMV (backend/cuda/cuda_device.cu, LaunchQGemv): many rows a
  // warp each (2200 rows: at least 16 warps a multiprocessor up to 137 of them), few long rows
  // four warps each (144 units).
  for (auto [r2, c2] : {std::pair<int64_t, int64_t>{2200, 512}, {77, 4608}}) {
    for (DType t : {DType::kQ4_1, DType::kQ6_K}) {
      const Uploaded w = UploadRandom(cuda_.get(), host_.get(), t, r2, c2, &rng_, &bytes);
      for (int64_t T : {1, 11}) {
        const Pair x = Upload(Random(T * c2, -3.f, 3.f));
        const Pair y = Zeros(T * r2);
        cuda_->MatMul(w.cuda, x.cuda, T, y.cuda);
        host_->MatMul(w.host, x.host, T, y.host);
        Expect(y, T * r2, 1e-5,
               std::string("quantized MatMul ") + DTypeName(t) + " " + std::to_string(r2) + "x" +
                   std::to_string(c2) + " T=" + std::to_string(T));
      }
    }
  }
  // Four matrices of one type with rows of their own over one x: launches of up to three
  // matrices (blockIdx.z), the blocks past a smaller one's rows idle, each with its epilogue.
  {
    std::vector<Uploaded> ws;
    const std::vector<int64_t> rs = {77, 13, 2200, 40};
    for (int64_t r : rs)
      ws.push_back(UploadRandom(cuda_.get(), host_.get(), DType::kQ4_1, r, 512, &rng_, &bytes));
    const Pair bias = Upload(Random(2200));
    for (int64_t T : {1, 5}) {
      const Pair x = Upload(Random(T * 512, -3.f, 3.f));
      std::vector<Pair> ys;
      for (int64_t r : rs) ys.push_back(Upload(Random(T * r)));
      for (bool on_cuda : {true, false}) {
        Device* dev = on_cuda ? cuda_.get() : host_.get();
        auto W = [&](int i) { return on_cuda ? &ws[i].cuda : &ws[i].host; };
        auto Y = [&](int i) { return on_cuda ? ys[i].cuda : ys[i].host; };
        const float* b = on_cuda ? bias.cuda : bias.host;
        dev->MatMuls(on_cuda ? x.cuda : x.host, T,
                     {{W(0), Y(0), b}, {W(1), Y(1), nullptr, true}, {W(2), Y(2)},
                      {W(3), Y(3), b, true}});
      }
      for (size_t i = 0; i < rs.size(); ++i)
        Expect(ys[i], T * rs[i], 1e-5,
               "MatMuls of one type, matrix " + std::to_string(i) + " T=" + std::to_string(T));
    }
  }
  // The experts' products over quantized activations, per token and per slot (5 tokens, 3
  // slots each, 8 experts of Q4_0, the odd ones held by another rank).
  const int64_t T = 5, E = 8;
  const int k = 3;
  const std::vector<int32_t> ids = {0, 3, 7, 1, 2, 5, 6, 0, 4, 2, 2, 1, 7, 5, 3};
  std::vector<std::vector<uint8_t>> eb;
  std::vector<TensorView> ev;
  RandomExperts(DType::kQ4_0, E, rows, cols, &rng_, &eb, &ev);
  std::vector<const TensorView*> ep;
  for (int64_t e = 0; e < E; ++e) ep.push_back(e % 2 ? nullptr : &ev[e]);
  std::vector<void*> allocs_c, allocs_h;
  auto ec = cuda_->UploadExperts(ep, &allocs_c);
  auto eh = host_->UploadExperts(ep, &allocs_h);
  ASSERT_TRUE(ec.ok() && eh.ok());
  auto ids_c = cuda_->Alloc(T * k * 4);
  ASSERT_TRUE(ids_c.ok());
  ASSERT_TRUE(cuda_->CopyToDevice(*ids_c, ids.data(), T * k * 4).ok());
  for (bool per_slot : {false, true}) {
    const Pair x = Upload(Random((per_slot ? T * k : T) * cols));
    const Pair y = Upload(std::vector<float>(T * k * rows, 7.f));
    cuda_->ExpertsMatMul(*ec, x.cuda, T, static_cast<int32_t*>(*ids_c), k, per_slot, y.cuda);
    host_->ExpertsMatMul(*eh, x.host, T, ids.data(), k, per_slot, y.host);
    Expect(y, T * k * rows, 1e-5, per_slot ? "quantized experts (per slot)"
                                           : "quantized experts (per token)");
  }
  // Two stacks with the same x in one go (gate and up): the second the first reversed.
  std::vector<const TensorView*> rev(ep.rbegin(), ep.rend());
  auto rc = cuda_->UploadExperts(rev, &allocs_c);
  auto rh = host_->UploadExperts(rev, &allocs_h);
  ASSERT_TRUE(rc.ok() && rh.ok());
  const Pair x = Upload(Random(T * cols));
  const Pair y1 = Zeros(T * k * rows), y2 = Zeros(T * k * rows);
  cuda_->ExpertsMatMuls(x.cuda, T, static_cast<int32_t*>(*ids_c), k, false,
                        {{&*ec, y1.cuda}, {&*rc, y2.cuda}});
  host_->ExpertsMatMuls(x.host, T, ids.data(), k, false, {{&*eh, y1.host}, {&*rh, y2.host}});
  Expect(y1, T * k * rows, 1e-5, "ExpertsMatMuls, the first");
  Expect(y2, T * k * rows, 1e-5, "ExpertsMatMuls, the second");
  kernels::SetExactActivations(true);
}

// The fused forms (NormMatMuls, GatedMatMuls) and the products' epilogues (bias, accumulate),
// quantized (1, 3, 40 tokens, default mode) and in FP32 (exact mode: the GEMV; 72 tokens, the
// FP16 GEMM), over two sets of matrices sharing one x: a K-quant, a 32-block type and a float
// type; INT8 twice (W8A8: the norm and the gated activation quantize into W8A8's groups,
// QActOut::w8a8, and the GEMV scales each row by its weight scale before the bias and the
// residual add; W8A16 in exact mode) and a float type. The norm and the activation function sum
// or round in another order than the host's, so a quantized value can land one step apart: the
// quantized products within 3e-3 of the largest output (a wrong row, pointer or epilogue is off
// by the output itself).
TEST_F(CudaTest, FusedNormGatedAndEpilogues) {
  const int64_t rows = 96, cols = 512;
  std::vector<std::vector<uint8_t>> bytes;
  const std::vector<std::vector<DType>> sets = {{DType::kQ4_K, DType::kQ8_0, DType::kF32},
                                                {DType::kI8, DType::kI8, DType::kF32}};
  for (const std::vector<DType>& types : sets) {
    std::vector<backend::DeviceMatrix> wc, wh;
    for (DType t : types) {
      const Uploaded w = UploadRandom(cuda_.get(), host_.get(), t, rows, cols, &rng_, &bytes);
      wc.push_back(w.cuda);
      wh.push_back(w.host);
    }
    const std::string n0 = DTypeName(types[0]), n1 = DTypeName(types[1]);
    const Pair norm_w = Upload(Random(cols, 0.5f, 1.5f));
    const Pair bias = Upload(Random(rows));
    for (bool exact : {false, true}) {
      kernels::SetExactActivations(exact);
      for (int64_t T : {1, 3, 40, 72}) {
        if (!exact && T > 64) continue;  // (prefill is FP32 either way)
        const std::string tag = std::string(exact ? " exact" : " quantized") + " T=" +
                                std::to_string(T);
        const double tol = T > 64 ? 1e-2 : exact ? 1e-4 : 3e-3;
        const Pair x = Upload(Random(T * cols, -2.f, 2.f));
        const Pair h = Zeros(T * cols);
        const Pair a = Zeros(T * rows), b = Upload(Random(T * rows)), c = Zeros(T * rows);
        for (auto [dev, X, H, A, B, C, W, NW, BI] :
             {std::tuple{cuda_.get(), x.cuda, h.cuda, a.cuda, b.cuda, c.cuda, &wc, norm_w.cuda,
                         bias.cuda},
              std::tuple{host_.get(), x.host, h.host, a.host, b.host, c.host, &wh, norm_w.host,
                         bias.host}})
          dev->NormMatMuls(
              X, NW, 0.f, 1e-6f, H, T, cols,
              {{&(*W)[0], A, BI}, {&(*W)[1], B, nullptr, true}, {&(*W)[2], C, BI, true}});
        Expect(h, T * cols, 1e-5, "NormMatMuls: the norm" + tag);
        Expect(a, T * rows, tol, "NormMatMuls " + n0 + " + bias" + tag);
        Expect(b, T * rows, tol, "NormMatMuls " + n1 + " accumulated" + tag);
        Expect(c, T * rows, exact || T > 64 ? tol : 1e-4,
               "NormMatMuls F32 + bias, accumulated" + tag);
        // act(gate) * up into gate, then the second type's product with bias, added to c.
        const Pair g = Upload(Random(T * cols, -4.f, 4.f)), u = Upload(Random(T * cols));
        cuda_->GatedMatMuls(backend::GatedActivation::kSilu, g.cuda, u.cuda, g.cuda, T, cols,
                            {{&wc[1], c.cuda, bias.cuda, true}});
        host_->GatedMatMuls(backend::GatedActivation::kSilu, g.host, u.host, g.host, T, cols,
                            {{&wh[1], c.host, bias.host, true}});
        Expect(g, T * cols, 1e-5, "GatedMatMuls: SiLU * up" + tag);
        Expect(c, T * rows, tol, "GatedMatMuls " + n1 + " + bias, accumulated" + tag);
        // The plain MatMuls epilogue.
        const Pair y = Upload(Random(T * rows));
        cuda_->MatMuls(x.cuda, T, {{&wc[0], y.cuda, bias.cuda, true}});
        host_->MatMuls(x.host, T, {{&wh[0], y.host, bias.host, true}});
        Expect(y, T * rows, exact ? tol : 1e-5, "MatMuls " + n0 + " + bias, accumulated" + tag);
      }
    }
  }
  kernels::SetExactActivations(true);
}

// NormMatMuls runs its RMSNorm inside the first product's GEMV (NormQGemvKernel) where the
// block's tile of tokens fits its shared memory: one launch less, and the same bits as the
// norm kernel before the GEMV (PENG_CUDA_FUSED_NORM=0) -- the norm's output, its quantized
// rows read by the next launch (another type) and the FP32 product over it included. Shapes:
// a row a warp and a token tile (T = 3, 9), two and four warps a row (T = 5 x 2048, T = 1 x
// 4096), four rows a warp (4096 rows: a block takes 4 times its rows to stay within 3 blocks a
// multiprocessor); T = 2 x 4096 exceeds the tile budget, and 16384 rows stay past 3 blocks a
// multiprocessor even so: those keep the norm kernel.
TEST_F(CudaTest, NormInsideTheGemvEqualsTheNormKernel) {
  ASSERT_EQ(setenv("PENG_CUDA_FUSED_NORM", "0", 1), 0);
  auto made = backend::CreateDevice(DeviceUnderTest(), &pool_);
  unsetenv("PENG_CUDA_FUSED_NORM");
  ASSERT_TRUE(made.ok()) << made.status().ToString();
  Device* plain = made->get();
  kernels::SetExactActivations(false);
  std::mt19937_64 rng(7);
  struct Case {
    int64_t T, cols, rows;
    bool fused;
  };
  for (const Case& cs : {Case{3, 512, 96, true}, Case{9, 1024, 96, true},
                         Case{5, 2048, 96, true}, Case{1, 4096, 96, true},
                         Case{2, 4096, 96, false}, Case{3, 512, 4096, true},
                         Case{1, 256, 16384, false}}) {
    const int64_t T = cs.T, cols = cs.cols, rows = cs.rows;
    for (auto [t0, t1] : {std::pair{DType::kQ4_K, DType::kQ8_0}, {DType::kQ4_0, DType::kQ6_K},
                          {DType::kI8, DType::kF32}}) {
      const std::string tag = std::string(DTypeName(t0)) + " then " + DTypeName(t1) + ", T=" +
                              std::to_string(T) + " x " + std::to_string(cols) + ", " +
                              std::to_string(rows) + " rows";
      std::vector<std::vector<uint8_t>> bytes;
      std::vector<float> scales0, scales1;
      bytes.push_back(RandomMatrix(t0, rows, cols, &rng, &scales0));
      bytes.push_back(RandomMatrix(t1, rows, cols, &rng, &scales1));
      const std::vector<float> x = Random(T * cols, -2.f, 2.f), nw = Random(cols, 0.5f, 1.5f);
      const std::vector<float> bias = Random(rows), acc = Random(T * rows);
      std::vector<float> out[2][4];  // [fused, plain][h, a, b, c]
      int64_t launches[2];
      for (int which = 0; which < 2; ++which) {
        Device* d = which == 0 ? cuda_.get() : plain;
        std::vector<backend::DeviceMatrix> w;
        for (int i = 0; i < 2; ++i) {
          TensorView v;
          v.name = "w";
          v.dtype = i == 0 ? t0 : t1;
          v.shape = {rows, cols};
          v.data = bytes[i].data();
          v.size_bytes = bytes[i].size();
          const std::vector<float>& sc = i == 0 ? scales0 : scales1;
          auto m = d->Upload(v, sc.empty() ? nullptr : sc.data());
          ASSERT_TRUE(m.ok()) << m.status().ToString();
          m->int8_activations = v.dtype == DType::kI8;
          w.push_back(*m);
        }
        auto up = [&](const std::vector<float>& v) { return *d->UploadFloats(v.data(), v.size()); };
        float* X = up(x);
        float* NW = up(nw);
        float* BI = up(bias);
        float* H = up(std::vector<float>(T * cols));
        float* A = up(std::vector<float>(T * rows));
        float* B = up(acc);
        float* C = up(acc);
        const int64_t k0 = d->KernelLaunches();
        d->NormMatMuls(X, NW, 1.f, 1e-6f, H, T, cols,
                       {{&w[0], A, BI}, {&w[1], B, nullptr, true}, {&w[0], C, BI, true}});
        launches[which] = d->KernelLaunches() - k0;
        ASSERT_TRUE(d->Synchronize().ok()) << tag;
        int i = 0;
        for (auto [p, n] : {std::pair{H, T * cols}, {A, T * rows}, {B, T * rows}, {C, T * rows}}) {
          out[which][i].resize(n);
          ASSERT_TRUE(d->CopyToHost(out[which][i++].data(), p, n * 4).ok());
        }
      }
      EXPECT_EQ(launches[0], launches[1] - (cs.fused ? 1 : 0)) << tag;
      for (int i = 0; i < 4; ++i)
        EXPECT_EQ(out[0][i], out[1][i]) << tag << ": output " << "habc"[i];
    }
  }
  kernels::SetExactActivations(true);
}

// A W8A8 matrix over the same x as a 32-block GGUF matrix: a clear error (peng quantize
// folders never hold both).
TEST_F(CudaTest, Int8W8A8AndGgufBlocksOverOneInputAreRefused) {
  kernels::SetExactActivations(false);
  const int64_t rows = 96, cols = 512;
  std::vector<std::vector<uint8_t>> bytes;
  const Uploaded i8 = UploadRandom(cuda_.get(), host_.get(), DType::kI8, rows, cols, &rng_,
                                   &bytes);
  const Uploaded q8 = UploadRandom(cuda_.get(), host_.get(), DType::kQ8_0, rows, cols, &rng_,
                                   &bytes);
  const Pair x = Upload(Random(cols));
  const Pair y1 = Zeros(rows), y2 = Zeros(rows);
  ASSERT_TRUE(cuda_->Synchronize().ok());
  cuda_->MatMuls(x.cuda, 1, {{&i8.cuda, y1.cuda}, {&q8.cuda, y2.cuda}});
  const Status st = cuda_->Synchronize();
  EXPECT_FALSE(st.ok());
  EXPECT_NE(st.message().find("W8A8"), std::string::npos) << st.ToString();
  kernels::SetExactActivations(true);
}

}  // namespace
}  // namespace peng::cuda_test
