// Conformance of the CUDA backend, its ops (the quantized and fused ops: cuda_fused_test.cc; the
// prompts' and long contexts' attention: cuda_attention_test.cc; the graphs: cuda_graph_test.cc,
// the same binary; the harness: cuda_test_util.h) (ctest label `cuda`;
// every test skips itself -- reported as skipped by ctest -- where no GPU is present;
// scripts/gpu_check.sh runs them on a GPU machine).
// The same source is also built as cuda_emulator_test (label unit, every CI run), whose device
// is the CUDA emulator ("cuda-emu": the backend's own sources run on the CPU,
// src/backend/cuda/emulator.h).
//
// 1. Every op against the host device (the CPU kernels; matrices in exact mode: FP32
//    activations times the dequantized weights) on random inputs. Tolerances, relative to the
//    largest |value| of the reference output:
//      GEMV (<= 64 tokens, FP32 throughout)          1e-4
//      GEMM (prefill, FP16 / BF16 operands, FP32     1e-2
//      accumulation)
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
#include <functional>
#include <limits>
#include <random>
#include <tuple>

#include "backend/device.h"
#include "core/half.h"
#include "cuda_test_util.h"
#include "engine/sampler.h"
#include "kernels/ops.h"
#include "kernels/ref/ops_ref.h"
#include "model/kv_cache.h"
#include "quant/random_weights.h"

namespace peng::cuda_test {
namespace {

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

// The prefill GEMM over activations past FP16's range (65504): a gated FFN's outlier, or a whole
// row of them, would be inf in the FP16 copy. Each token row against the host's FP32 product
// within 1e-2 of that row's largest |value|: rows of values up to 1e6, one outlier of 2e5
// among values of 1, values just under 65504 (near the overflow of a rounding) and values of 1e-3
// (unscaled). With and without the residual add (of the products' size) and the bias. F16 and
// BF16 matrices are read as uploaded (BF16 ones with BF16 activations; PENG_CUDA_BF16_GEMM=0:
// decoded into FP16), the others decoded into an FP16 copy: the kernels launched say which.
// BF16 activations have FP32's range: no store of their own but the bias.
TEST_F(CudaTest, PrefillGemmOfActivationsPastFp16sRange) {
  const int64_t rows = 96, cols = 512, T = 80;
  std::vector<float> xv = Random(T * cols);
  for (int64_t t = 0; t < T; ++t) {
    float* r = &xv[t * cols];
    switch (t % 4) {
      case 0: for (int64_t c = 0; c < cols; ++c) r[c] *= 1e6f; break;
      case 1: r[t % cols] = 2e5f; break;
      case 2: for (int64_t c = 0; c < cols; ++c) r[c] = std::copysign(65000.f - c, r[c]); break;
      default: for (int64_t c = 0; c < cols; ++c) r[c] *= 1e-3f;
    }
  }
  const std::vector<float> bias = Random(rows);
  // BF16 weights take BF16 activations, or FP16 ones on a device without them.
  std::unique_ptr<Device> fp16_only = DeviceWithout("PENG_CUDA_BF16_GEMM");
  for (auto [d, t] : {std::pair{cuda_.get(), DType::kF16}, {cuda_.get(), DType::kBF16},
                      {fp16_only.get(), DType::kBF16}, {cuda_.get(), DType::kQ4_0}}) {
    std::vector<std::vector<uint8_t>> keep;
    const Uploaded w = UploadRandom(d, host_.get(), t, rows, cols, &rng_, &keep);
    const std::string what = std::string(DTypeName(t)) + (d == cuda_.get() ? "" : " (FP16 x)");
    // The residual the products add to: of their size, row by row (the host's products,
    // shifted by a column and scaled), so that a row scaled for FP16 must have it scaled too.
    std::vector<float> y0(T * rows);
    host_->MatMuls(xv.data(), T, {{&w.host, y0.data()}});
    for (int64_t tk = 0; tk < T; ++tk)
      std::rotate(&y0[tk * rows], &y0[tk * rows + 1], &y0[(tk + 1) * rows]);
    for (float& v : y0) v *= 1.5f;
    for (bool add : {false, true}) {
      std::vector<float> ref = y0;
      float* y = UploadTo(d, y0);
      const float* xd = UploadTo(d, xv);
      const float* bd = add ? UploadTo(d, bias) : nullptr;
      const int64_t k0 = d->KernelLaunches();
      d->MatMuls(xd, T, {{&w.cuda, y, bd, add}});
      // x's copy, the GEMM and the store; a matrix not read as uploaded decoded first; BF16
      // activations never scaled: the bias alone, where there is one.
      const bool bf16 = t == DType::kBF16 && d == cuda_.get();
      const bool as_uploaded = t == DType::kF16 || bf16;
      EXPECT_EQ(d->KernelLaunches() - k0, bf16 ? 2 + add : as_uploaded ? 3 : 4) << what;
      host_->MatMuls(xv.data(), T, {{&w.host, ref.data(), add ? bias.data() : nullptr, add}});
      ASSERT_TRUE(d->Synchronize().ok());
      std::vector<float> got(T * rows);
      ASSERT_TRUE(d->CopyToHost(got.data(), y, got.size() * 4).ok());
      double worst = 0;
      for (int64_t tk = 0; tk < T; ++tk) {
        double scale = 1e-30, diff = 0;
        for (int64_t r = 0; r < rows; ++r) {
          scale = std::max(scale, std::abs(double{ref[tk * rows + r]}));
          const double g = got[tk * rows + r];
          diff = std::isfinite(g) ? std::max(diff, std::abs(g - ref[tk * rows + r])) : HUGE_VAL;
        }
        worst = std::max(worst, diff / scale);
      }
      std::printf("[cuda] prefill GEMM %s%s: worst row max |d| / its max |ref| = %.2e\n",
                  what.c_str(), add ? ", residual add and bias" : "", worst);
      EXPECT_LE(worst, 1e-2) << what << (add ? " accumulating" : "");
    }
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
// 8192, -0.0 next to +0.0, NaN and +inf, a last chunk shorter than k, rows of equal values; k
// from 1 to Device::kTopLogitsMax (256), and past it (a block a row) to kTopLogitsWide (4096).
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
    for (int k : {1, 5, 40, 64, 200, backend::Device::kTopLogitsMax, 257, 1000,
                  backend::Device::kTopLogitsWide}) {
      if (k > n) continue;
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

// EditLogits: the engine's changes to rows (LogitEdits) -- biases, one id twice, a grammar's
// mask (rows 0 and 2: a random third of the ids allowed, the last word partly past the row),
// bans, the penalties on positive and negative logits, past the float range, on a banned or
// masked id, on NaN, ids outside the row -- give the host device's values bit for bit, and the
// host's are what the engine and the sampler do to a whole row (the biases added, the ids the
// mask does not allow and the bans set to -inf, then Sampler::ApplyPenalties).
TEST_F(CudaTest, EditLogitsEqualTheHost) {
  using Row = backend::Device::LogitEditRow;
  using Edit = backend::Device::LogitEdit;
  const int64_t n = 5000, rows = 3;
  std::vector<float> x = Random(rows * n, -8.f, 8.f);
  x[2 * n + 100] = 3e38f;  // past the range once penalized (row 2's repetition 0.7)
  x[n + 7] = std::numeric_limits<float>::quiet_NaN();  // NaN stays NaN
  std::vector<Edit> edits;
  std::vector<Row> hdr(rows);
  std::vector<float> want = x;
  const int64_t W = (n + 31) / 32;  // (grammar::MaskWords)
  std::vector<uint32_t> masks(2 * W);
  std::bernoulli_distribution allowed(1.0 / 3);
  for (int64_t id = 0; id < 2 * W * 32; ++id)
    if (allowed(rng_) || id % (W * 32) == 100) masks[id / 32] |= 1u << (id % 32);
  for (int64_t r = 0; r < rows; ++r) {
    Row& h = hdr[r];
    h.mask = r == 1 ? -1 : static_cast<int32_t>(r / 2 * W);
    h.bias = static_cast<int32_t>(edits.size());
    const std::vector<std::pair<int32_t, float>> bias = {{5, 2.5f}, {9, -100.f}, {5, 0.25f}};
    for (const auto& [id, v] : bias) edits.push_back({id, v});
    h.ban = static_cast<int32_t>(edits.size());
    for (int32_t id : {11, 12, static_cast<int32_t>(n) + 3}) edits.push_back({id, 0.f});
    h.history = static_cast<int32_t>(edits.size());
    std::vector<int32_t> prompt = {100, 11, 7, 40, 41};
    TokenHistory history(prompt);
    for (int32_t id : {7, 7, 300, 301, 12, 4999}) history.Append(id);
    for (const TokenHistory::Entry& e : history.distinct())
      edits.push_back({e.id, static_cast<float>(e.output_count)});
    edits.push_back({-1, 1.f});  // (outside: skipped)
    h.end = static_cast<int32_t>(edits.size());
    SamplingParams p;
    p.repetition_penalty = r == 0 ? 1.3f : (r == 1 ? 1.f : 0.7f);
    p.presence_penalty = r == 2 ? -0.5f : 0.4f;
    p.frequency_penalty = r == 1 ? 0.f : 0.9f;
    h.repetition = p.repetition_penalty;
    h.presence = p.presence_penalty;
    h.frequency = p.frequency_penalty;
    float* w = want.data() + r * n;  // the engine's and the sampler's changes
    for (const auto& [id, v] : bias) w[id] += v;
    for (int64_t id = 0; id < n && h.mask >= 0; ++id)
      if (!(masks[h.mask + id / 32] >> (id % 32) & 1u))
        w[id] = -std::numeric_limits<float>::infinity();
    for (int32_t id : {11, 12}) w[id] = -std::numeric_limits<float>::infinity();
    Sampler(p).ApplyPenalties(w, n, history);
  }
  const Pair d = Upload(x);
  host_->EditLogits(d.host, rows, n, hdr.data(), edits.data(), masks.data());
  auto hc = cuda_->Alloc(rows * sizeof(Row));
  auto ec = cuda_->Alloc(edits.size() * sizeof(Edit));
  auto mc = cuda_->Alloc(masks.size() * sizeof(uint32_t));
  ASSERT_TRUE(hc.ok() && ec.ok() && mc.ok());
  ASSERT_TRUE(cuda_->CopyToDevice(*hc, hdr.data(), rows * sizeof(Row)).ok());
  ASSERT_TRUE(cuda_->CopyToDevice(*ec, edits.data(), edits.size() * sizeof(Edit)).ok());
  ASSERT_TRUE(cuda_->CopyToDevice(*mc, masks.data(), masks.size() * sizeof(uint32_t)).ok());
  cuda_->EditLogits(d.cuda, rows, n, static_cast<const Row*>(*hc), static_cast<const Edit*>(*ec),
                    static_cast<const uint32_t*>(*mc));
  ASSERT_TRUE(cuda_->Synchronize().ok());
  std::vector<float> got(rows * n);
  ASSERT_TRUE(cuda_->CopyToHost(got.data(), d.cuda, rows * n * 4).ok());
  EXPECT_EQ(std::memcmp(got.data(), d.host, rows * n * 4), 0);
  EXPECT_EQ(std::memcmp(d.host, want.data(), rows * n * 4), 0);
  EXPECT_EQ(d.host[2 * n + 100], std::numeric_limits<float>::max());  // (allowed: bit 100)
  int64_t masked = 0;
  for (int64_t id = 0; id < n; ++id) masked += std::isinf(d.host[id]) && d.host[id] < 0;
  EXPECT_GT(masked, n / 2);  // (row 0: two thirds of its ids)
  EXPECT_TRUE(std::isnan(d.host[n + 7]));
  EXPECT_NE(std::memcmp(d.host, x.data(), rows * n * 4), 0);
  cuda_->Free(*hc);
  cuda_->Free(*ec);
  cuda_->Free(*mc);
}

// DrawTokens: plain temperature sampling's draw over each row, the same ids as the host device's
// (kernels::DrawInIdOrder, the sampler's) for rows of ties, of one value far above the rest,
// flat, masked but for a few values, at temperatures 0.3 / 1 / 2.5, with uniforms from 0 to the
// last double below 1 (u * total rounding up to the total); -1 for rows that draw nothing (an
// inverse temperature of 0, a best value of -inf or +inf, a row that asks for its totals
// alone), the drawn tokens' logits equal. The totals (kernels::TemperatureTotal, and
// LogSoftmaxTotal where asked) within 1e-12 of the host's.
TEST_F(CudaTest, DrawTokensEqualTheHost) {
  const float inf = std::numeric_limits<float>::infinity();
  std::uniform_real_distribution<double> uni(0.0, 1.0);
  for (int64_t n : {int64_t{1000}, int64_t{40000}, int64_t{151936}}) {
    const int64_t rows = 8;
    std::vector<float> x = Random(rows * n, -6.f, 6.f);
    for (float& v : x) v = std::round(v * 8.f) / 8.f;  // ties
    float* r = x.data();
    r[1 * n + n / 3] = 40.f;                                 // one value far above
    std::fill(r + 2 * n, r + 3 * n, 0.5f);                   // flat
    std::fill(r + 3 * n, r + 4 * n, -inf);                   // masked but for three
    r[3 * n + 5] = 1.f, r[3 * n + n / 2] = 2.f, r[4 * n - 1] = 1.5f;
    std::fill(r + 5 * n, r + 6 * n, -inf);                   // masked whole
    r[6 * n + 9] = inf;                                      // +inf
    std::vector<float> best(rows);
    std::vector<int32_t> best_id(rows), bad(rows);
    host_->TopLogits(x.data(), rows, n, 1, best.data(), best_id.data(), bad.data(), nullptr);
    const Pair d = Upload(x);
    const Pair b = Upload(best);
    auto draws_c = cuda_->Alloc(rows * sizeof(backend::Device::TokenDraw));
    auto out_c = cuda_->Alloc(rows * 24);  // [drawn | drawn_logit | total | log_total]
    ASSERT_TRUE(draws_c.ok() && out_c.ok());
    const backend::Device::DrawResults co{
        static_cast<int32_t*>(*out_c), static_cast<float*>(*out_c) + rows,
        static_cast<double*>(*out_c) + rows, static_cast<double*>(*out_c) + 2 * rows};
    const int reps = n > 100000 ? 4 : 12;
    for (int rep = 0; rep < reps; ++rep) {
      SCOPED_TRACE(testing::Message() << "n " << n << " rep " << rep);
      std::vector<backend::Device::TokenDraw> draws(rows);
      for (int64_t i = 0; i < rows; ++i) {
        const float temps[] = {0.3f, 1.f, 2.5f};
        draws[i].inv_temperature = 1.0f / temps[(i + rep) % 3];
        draws[i].uniform = rep == 0 ? 0.0 : rep == 1 ? 1.0 - 0x1.0p-53 : uni(rng_);
        draws[i].flags = (i + rep) % 2 == 0 || i == 7 ? backend::Device::kLogSoftmaxTotal : 0;
      }
      draws[7].inv_temperature = 0.f;  // (no temperature: the log-softmax's total alone)
      draws[4].uniform = -1.0;          // (the totals alone)
      std::vector<int32_t> hd(rows, -7), cd(rows, -7);
      std::vector<float> hl(rows, -7), cl(rows, -7);
      std::vector<double> ht(rows, -7), ct(rows, -7), hlt(rows, -7), clt(rows, -7);
      host_->DrawTokens(x.data(), rows, n, best.data(), 1, draws.data(),
                        {hd.data(), hl.data(), ht.data(), hlt.data()});
      ASSERT_TRUE(cuda_->CopyToDevice(*draws_c, draws.data(), rows * sizeof(draws[0])).ok());
      cuda_->DrawTokens(d.cuda, rows, n, b.cuda, 1,
                        static_cast<const backend::Device::TokenDraw*>(*draws_c), co);
      ASSERT_TRUE(cuda_->Synchronize().ok());
      ASSERT_TRUE(cuda_->CopyToHost(cd.data(), co.drawn, rows * 4).ok());
      ASSERT_TRUE(cuda_->CopyToHost(cl.data(), co.drawn_logit, rows * 4).ok());
      ASSERT_TRUE(cuda_->CopyToHost(ct.data(), co.total, rows * 8).ok());
      ASSERT_TRUE(cuda_->CopyToHost(clt.data(), co.log_total, rows * 8).ok());
      EXPECT_EQ(cd, hd);
      EXPECT_EQ(cl, hl);
      for (int64_t i = 0; i < rows; ++i) {
        SCOPED_TRACE(testing::Message() << "row " << i);
        EXPECT_NEAR(ct[i], ht[i], 1e-12 * ht[i]);
        EXPECT_NEAR(clt[i], hlt[i], 1e-12 * hlt[i]);
        const float* ri = r + i * n;
        const bool on = std::isfinite(best[i]);
        EXPECT_EQ(ht[i], on && i != 7 ? kernels::TemperatureTotal(ri, n, best[i],
                                                                  draws[i].inv_temperature)
                                      : 0.0);
        EXPECT_EQ(hlt[i], on && draws[i].flags ? kernels::LogSoftmaxTotal(ri, n, best[i]) : 0.0);
        EXPECT_EQ(hl[i], hd[i] >= 0 ? ri[hd[i]] : 0.f);
      }
      EXPECT_GT(hlt[7], 1.0);
      EXPECT_EQ(hd[4], -1);
      EXPECT_GT(ht[4], 1.0);
      EXPECT_EQ(hd[5], -1);  // (the host's answers, as built)
      EXPECT_EQ(hd[6], -1);
      EXPECT_EQ(hd[7], -1);
      EXPECT_TRUE(hd[3] == 5 || hd[3] == n / 2 || hd[3] == n - 1) << hd[3];
      if (rep == 0) {
        EXPECT_EQ(hd[2], 0);
        EXPECT_EQ(hd[3], 5);
      }
      if (rep == 1) {
        EXPECT_EQ(hd[2], n - 1);
        EXPECT_EQ(hd[3], n - 1);
      }
    }
    cuda_->Free(*draws_c);
    cuda_->Free(*out_c);
  }
}

TEST_F(CudaTest, RopeKvWriteAndPagedAttention) {
  AttnBatch a;
  BuildBatch(cuda_.get(), &a);
  const int64_t T = a.host.n_tokens;
  for (DType kv_type : {DType::kF32, DType::kF16, DType::kQ8_0}) {
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
      const int64_t bytes = static_cast<int64_t>(RowBytes(kv_type, 9 * 16 * KV * hd));
      const Pair k = Upload(Random(T * KV * hd)), v = Upload(Random(T * KV * hd));
      cuda_->KvWrite(kc, a.cuda, k.cuda, v.cuda);
      host_->KvWrite(kh, a.host, k.host, v.host);
      const Pair q = Upload(Random(T * H * hd));
      for (int window : {0, 8}) {
        for (float softcap : {0.f, 20.f}) {
          const kernels::AttentionParams p = AttnParams(H, hd, window, softcap);
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
      if (kv_type == DType::kQ8_0) {
        // A Q8_0 cache's rows: the rotated, quantized bytes of the reference's functions.
        const size_t row_bytes = RowBytes(kv_type, KV * hd);
        for (int64_t t = 0; t < T; ++t) {
          for (int part = 0; part < 2; ++part) {
            std::vector<float> x((part ? v_rows : k_rot).begin() + t * KV * hd,
                                 (part ? v_rows : k_rot).begin() + (t + 1) * KV * hd);
            kernels::ref::HadamardRows(x.data(), 1, KV * hd, kernels::RotationBlock(hd));
            std::vector<uint8_t> want(row_bytes);
            kernels::ref::F32ToQ8_0Row(x.data(), want.data(), KV * hd);
            const uint8_t* got = (part ? vcache : kcache).data() + a.slot[t] * row_bytes;
            ASSERT_EQ(std::memcmp(got, want.data(), row_bytes), 0)
                << tag << (part ? " v " : " k ") << t;
          }
        }
        continue;
      }
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
  AttnBatch a;
  BuildBatch(cuda_.get(), &a);
  const int64_t T = a.host.n_tokens;
  const kernels::MlaParams p = LiteMla();
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
  for (DType kv_type : {DType::kF32, DType::kF16, DType::kQ8_0}) {
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
// quantizes them). Again in a step of 71 tokens (Q8_0 k_b, Q4_K v_b), where the FP32 copy's
// products are one batched GEMM (CudaDevice::MlaGemm) and the decode token's rows are then
// replaced.
TEST_F(CudaTest, MlaStoredHeads) {
  for (bool prefill : {false, true}) {
    AttnBatch a;
    if (prefill) {
      BuildBatch(cuda_.get(), &a, {0, 3, 9}, {40, 1, 30});
    } else {
      BuildBatch(cuda_.get(), &a);
    }
    const int64_t T = a.host.n_tokens;
    const kernels::MlaParams p = LiteMla();
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
      if (prefill && kt != DType::kQ8_0) continue;  // (the GEMM's rows: one pair of types)
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
                                (exact ? ", exact" : ", quantized") + (prefill ? ", T 71" : "");
        const Pair qa = Zeros(T * H * row), out = Zeros(T * H * p.d_v);
        cuda_->MlaAbsorbQuery(q.cuda, a.cuda, wc, p, qa.cuda);
        host_->MlaAbsorbQuery(q.host, a.host, wh, p, qa.host);
        Expect(qa, T * H * row, 1e-5, "MlaAbsorbQuery" + tag);
        cuda_->MlaProjectOutput(ol.cuda, a.cuda, wc, p, out.cuda);
        host_->MlaProjectOutput(ol.host, a.host, wh, p, out.host);
        Expect(out, T * H * p.d_v, 1e-5, "MlaProjectOutput" + tag);
        // The decode token's row is the stored heads' product: kernels::MlaAbsorbQueryHeads.
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
        // (71 tokens: o is the FP16 GEMM of prefill)
        Expect(y, T * 64, prefill ? 1e-2 : exact ? 1e-4 : 3e-3, "MlaProjectMatMuls: o" + tag);
      }
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

}  // namespace
}  // namespace peng::cuda_test
