// Conformance of the CUDA backend's mixture-of-experts ops against the host device (the
// harness: cuda_test_util.h; the same binaries as cuda_device_test.cc and cuda_fused_test.cc):
// prefill's grouped experts over quantized activations, the norm preparing the routed experts'
// input, the routed experts' activation inside their GEMV, the routed and shared experts' down
// projections in one kernel, and the routing inside the router's GEMV or the norm's products --
// each fusion bit for bit against the launches it replaces, with the launches counted.
#include <gtest/gtest.h>

#include <cstdint>
#include <initializer_list>
#include <memory>
#include <random>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "backend/device.h"
#include "cuda_test_util.h"
#include "kernels/ops.h"

namespace peng::cuda_test {
namespace {

// E random experts of type t [rows, n] with INT8's row scales, expert 6 another rank's (null
// among the views and scales UploadExperts takes: here, here_scales), and the ids of `pairs`
// (token, slot) pairs.
struct RoutedExperts {
  static constexpr int32_t kMissing = 6;  // (another rank's)
  std::vector<std::vector<uint8_t>> bytes;
  std::vector<std::vector<float>> scales;
  std::vector<TensorView> views;
  std::vector<const TensorView*> here;
  std::vector<const float*> here_scales;  // (INT8 only)
  std::vector<int32_t> ids;
  bool int8 = false;
  // The experts (INT8 as W8A8) and the ids on device d; null ids where an upload failed.
  std::pair<backend::DeviceExperts, int32_t*> Upload(Device* d, std::vector<void*>* allocs) const {
    auto w = d->UploadExperts(here, allocs, here_scales, int8);
    EXPECT_TRUE(w.ok()) << w.status().ToString();
    auto id = d->Alloc(static_cast<int64_t>(ids.size() * 4));
    if (!w.ok() || !id.ok() || !d->CopyToDevice(*id, ids.data(), ids.size() * 4).ok())
      return {backend::DeviceExperts{}, nullptr};
    return {std::move(*w), static_cast<int32_t*>(*id)};
  }
  // Whether some pair is routed to the missing expert and all its rows of y ([pairs, rows]) are
  // zeros.
  bool MissingRowsAreZero(const std::vector<float>& y, int64_t rows) const {
    bool any = false;
    for (size_t p = 0; p < ids.size(); ++p) {
      if (ids[p] != kMissing) continue;
      any = true;
      const float* row = y.data() + p * rows;
      if (std::any_of(row, row + rows, [](float v) { return v != 0.f; })) return false;
    }
    return any;
  }
};
RoutedExperts MakeRoutedExperts(DType t, int64_t E, int64_t rows, int64_t n, int64_t pairs,
                                std::mt19937_64* rng) {
  RoutedExperts x;
  x.int8 = t == DType::kI8;
  RandomExperts(t, static_cast<int>(E), rows, n, rng, &x.bytes, &x.views, &x.scales);
  for (int64_t e = 0; e < E; ++e) {
    x.here.push_back(e != RoutedExperts::kMissing ? &x.views[e] : nullptr);
    if (t == DType::kI8)
      x.here_scales.push_back(e != RoutedExperts::kMissing ? x.scales[e].data() : nullptr);
  }
  for (int64_t i = 0; i < pairs; ++i) x.ids.push_back(static_cast<int32_t>((i * 5 + 1) % E));
  return x;
}

// Prefill's experts (past 32 tokens: the pairs grouped by expert, GroupedExpertsMatMul) over
// activations quantized as the GEMVs quantize them (on the tensor cores in tiles of up to 32
// pairs, GroupedExpertsQMmaKernel, and by dp4a in tiles of 8 with PENG_CUDA_MMA_GEMV=0,
// GroupedExpertsQGemvKernel; a quantize launch before either; in a scratch of their own past
// the shared one's 512 rows): within 1e-5 of the host device's quantized path, per token and
// per slot, Q4_0, Q4_K, Q6_K and INT8 W8A8 experts (the odd ones another rank's: zeros), 37,
// 90 and 180 tokens of 3 slots each (14 to 68 pairs an expert: whole and partial tiles); 20
// tokens are grouped only where the tensor cores take them (from 16 tokens on; by dp4a a GEMV
// per pair up to 32).
TEST_F(CudaTest, GroupedExpertsOverQuantizedActivations) {
  const std::unique_ptr<Device> dp4a = DeviceWithout("PENG_CUDA_MMA_GEMV");
  ASSERT_NE(dp4a, nullptr);
  kernels::SetExactActivations(false);
  const int64_t E = 8, rows = 64, cols = 256;
  const int k = 3;
  for (DType type : {DType::kQ4_0, DType::kQ4_K, DType::kQ6_K, DType::kI8}) {
    std::vector<std::vector<uint8_t>> bytes;
    std::vector<std::vector<float>> scales;
    std::vector<TensorView> views;
    RandomExperts(type, E, rows, cols, &rng_, &bytes, &views, &scales);
    std::vector<const TensorView*> ep;
    std::vector<const float*> sp;
    for (int64_t e = 0; e < E; ++e) {
      ep.push_back(e % 2 ? nullptr : &views[e]);
      if (type == DType::kI8) sp.push_back(e % 2 ? nullptr : scales[e].data());
    }
    std::vector<void*> allocs_c, allocs_d, allocs_h;
    const bool w8a8 = type == DType::kI8;
    auto ec = cuda_->UploadExperts(ep, &allocs_c, sp, w8a8);
    auto ed = dp4a->UploadExperts(ep, &allocs_d, sp, w8a8);
    auto eh = host_->UploadExperts(ep, &allocs_h, sp, w8a8);
    ASSERT_TRUE(ec.ok() && ed.ok() && eh.ok());
    for (int64_t T : {20, 37, 90, 180}) {
      std::vector<int32_t> ids(T * k);
      for (int64_t i = 0; i < T * k; ++i) ids[i] = static_cast<int32_t>((i * 5 + i / 7) % E);
      auto ids_c = cuda_->Alloc(T * k * 4);
      ASSERT_TRUE(ids_c.ok());
      ASSERT_TRUE(cuda_->CopyToDevice(*ids_c, ids.data(), T * k * 4).ok());
      for (bool per_slot : {false, true}) {
        for (Device* dev : {cuda_.get(), dp4a.get()}) {
          const std::string tag = std::string(DTypeName(type)) + " T=" + std::to_string(T) +
                                  (per_slot ? " per slot" : " per token") +
                                  (dev == dp4a.get() ? " dp4a" : "");
          const Pair x = Upload(Random((per_slot ? T * k : T) * cols, -2.f, 2.f));
          const Pair y = Upload(std::vector<float>(T * k * rows, 7.f));
          const int64_t k0 = dev->KernelLaunches();
          dev->ExpertsMatMul(dev == dp4a.get() ? *ed : *ec, x.cuda, T,
                             static_cast<int32_t*>(*ids_c), k, per_slot, y.cuda);
          // Grouped: tiles, scatter, quantize, product; a GEMV per pair: quantize, product.
          const bool per_pair = dev == dp4a.get() && T <= 32;
          EXPECT_EQ(dev->KernelLaunches() - k0, per_pair ? 2 : 4) << tag;
          host_->ExpertsMatMul(*eh, x.host, T, ids.data(), k, per_slot, y.host);
          Expect(y, T * k * rows, 1e-5, "grouped experts " + tag);
        }
      }
    }
  }
  kernels::SetExactActivations(true);
}

// NormMatMuls told of the routed experts next (a DeepSeek MoE layer: the norm before the
// router) quantizes their input in the norm's kernel (here the Q4_K product's GEMV, which runs
// the norm: FusedQGemvKernel), so ExpertsMatMuls launches no quantize
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
    // the norm inside the Q4_K product's GEMV (+ the Q4_0 product, its quantization inside),
    // then the experts (+ quantize)
    EXPECT_EQ(k1 - k0, overwrite ? 2 : 1) << tag;
    EXPECT_EQ(cuda_->KernelLaunches() - k1, overwrite ? 2 : 1) << tag;
    Expect(a, T * 40, 3e-3, "NormMatMuls Q4_K" + tag);
    Expect(g, T * k * I, 3e-3, "ExpertsMatMuls Q4_0 after the norm" + tag);
    if (overwrite) Expect(b, T * 40, 1e-5, "MatMuls Q4_0 in between");
  }
  kernels::SetExactActivations(true);
}

// GatedExpertsMatMul computes the routed experts' activation inside their GEMV
// (GatedExpertsQGemvKernel) under the rule of the dense products' (at most 3 blocks a
// multiprocessor, a block taking up to 4 times its rows): one launch less, and the same bits
// as the gated kernel before the GEMV (PENG_CUDA_FUSED_INPUT=0), h included where it is not in
// place. Shapes: 6 pairs x 512 rows (64 blocks a pair, one pass), 6 x 2048 (4 passes), 12 x
// 2048 (past 3 blocks a multiprocessor: the gated kernel); Q4_0, Q4_K (blocks of 256) and INT8
// W8A8 experts; an expert missing (another rank's) gives zeros either way.
TEST_F(CudaTest, GatedExpertsInsideTheGemvEqualsItsKernel) {
  const std::unique_ptr<Device> unfused = DeviceWithout("PENG_CUDA_FUSED_INPUT");
  ASSERT_NE(unfused, nullptr);
  Device* plain = unfused.get();
  kernels::SetExactActivations(false);
  const int64_t n = 256, E = 8;
  const int k = 6;
  struct Case {
    int64_t T, rows;
    bool fused;
  };
  for (const Case& cs : {Case{1, 512, true}, Case{1, 2048, true}, Case{2, 2048, false}}) {
    for (DType type : {DType::kQ4_0, DType::kQ4_K, DType::kI8}) {
      const int64_t T = cs.T, rows = cs.rows, pairs = T * k;
      const RoutedExperts x = MakeRoutedExperts(type, E, rows, n, pairs, &rng_);
      const std::vector<float> g = Random(pairs * n, -4.f, 4.f), u = Random(pairs * n);
      for (bool in_place : {false, true}) {
        const std::string tag = std::string(DTypeName(type)) + ", " + std::to_string(pairs) +
                                " pairs x " + std::to_string(rows) + " rows" +
                                (in_place ? ", in place" : "");
        std::vector<float> h_out[2], y_out[2];
        int64_t launches[2];
        for (int which = 0; which < 2; ++which) {
          Device* d = which == 0 ? cuda_.get() : plain;
          std::vector<void*> allocs;
          const auto [w, id] = x.Upload(d, &allocs);
          ASSERT_NE(id, nullptr) << tag;
          float* G = *d->UploadFloats(g.data(), g.size());
          float* U = *d->UploadFloats(u.data(), u.size());
          auto zeros = [&](int64_t count) {
            return *d->UploadFloats(std::vector<float>(count).data(), count);
          };
          float* H = in_place ? G : zeros(pairs * n);
          float* Y = zeros(pairs * rows);
          const int64_t k0 = d->KernelLaunches();
          d->GatedExpertsMatMul(backend::GatedActivation::kSilu, G, U, H, T, k, n, w, id, Y);
          launches[which] = d->KernelLaunches() - k0;
          ASSERT_TRUE(d->Synchronize().ok()) << tag;
          h_out[which].resize(pairs * n);
          y_out[which].resize(pairs * rows);
          ASSERT_TRUE(d->CopyToHost(h_out[which].data(), H, pairs * n * 4).ok());
          ASSERT_TRUE(d->CopyToHost(y_out[which].data(), Y, pairs * rows * 4).ok());
        }
        EXPECT_EQ(launches[0], launches[1] - (cs.fused ? 1 : 0)) << tag;
        if (!in_place || !cs.fused) {
          EXPECT_EQ(h_out[0], h_out[1]) << tag << ": h";
        }
        EXPECT_EQ(y_out[0], y_out[1]) << tag << ": y";
        EXPECT_TRUE(x.MissingRowsAreZero(y_out[0], rows)) << tag;
      }
    }
  }
  kernels::SetExactActivations(true);
}

// MoeDown in one launch (MoeDownKernel: the routed pairs' and the shared experts' down
// projections, the last block of a token's rows summing them into out): the same bits as its
// default on the same device (GatedExpertsMatMul, then the shared experts' GatedMatMuls with the
// routed sum in their store, or SlotSum: two launches or more) -- out and the routed rows of ys
// --, within 1e-5 of the host device's quantized path; Q4_0, Q4_K and INT8 W8A8 experts (expert
// 6 another rank's: zeros), with shared experts of twice the routed width and without, 1 and 2
// tokens of 6 slots. 3 tokens' 21 pairs over 2048 rows would be more than 3 blocks a
// multiprocessor: the default. Each case runs twice over the same out, so a count not set back
// would show.
TEST_F(CudaTest, MoeDownInOneLaunchEqualsItsKernels) {
  kernels::SetExactActivations(false);
  const int64_t n = 256, sn = 512, E = 8;
  const int k = 6;
  struct Case {
    int64_t T, rows;
    bool shared, fused;
  };
  for (const Case& cs : {Case{1, 2048, true, true}, Case{1, 2048, false, true},
                         Case{2, 512, true, true}, Case{3, 2048, true, false}}) {
    for (DType type : {DType::kQ4_0, DType::kQ4_K, DType::kI8}) {
      const int64_t T = cs.T, rows = cs.rows, pairs = T * k;
      const std::string tag = std::string(DTypeName(type)) + ", T=" + std::to_string(T) +
                              ", " + std::to_string(rows) + " rows" +
                              (cs.shared ? ", shared experts" : "");
      RoutedExperts x = MakeRoutedExperts(type, E, rows, n, pairs, &rng_);
      const Uploaded sh = UploadRandom(cuda_.get(), host_.get(), type, rows, sn, &rng_, &x.bytes);
      const std::vector<float> g = Random(pairs * n, -4.f, 4.f), u = Random(pairs * n);
      const std::vector<float> sg = Random(T * sn, -4.f, 4.f), su = Random(T * sn);
      const std::vector<float> wts = Random(pairs, 0.f, 1.f), x0 = Random(T * rows);
      std::vector<float> out[3], ys[2];
      int64_t launches[2];
      for (int which = 0; which < 3; ++which) {  // fused, its default, the host device
        Device* d = which == 2 ? host_.get() : cuda_.get();
        std::vector<void*> allocs;
        const auto [w, id] = x.Upload(d, &allocs);
        ASSERT_NE(id, nullptr) << tag;
        float* Y = UploadTo(d, std::vector<float>(T * (k + 1) * rows));
        float* X = UploadTo(d, x0);
        const float* W = UploadTo(d, wts);
        for (int rep = 0; rep < 2; ++rep) {
          Device::SharedExperts shared;
          if (cs.shared)
            shared = {UploadTo(d, sg), UploadTo(d, su), sn, which == 2 ? &sh.host : &sh.cuda};
          const int64_t k0 = d->KernelLaunches();
          auto args = std::tuple(backend::GatedActivation::kSilu, UploadTo(d, g), UploadTo(d, u), T,
                                 k, n, w, id, W, shared, Y, X);
          if (which == 1) {
            std::apply([&](auto&&... a) { d->Device::MoeDown(a...); }, args);
          } else {
            std::apply([&](auto&&... a) { d->MoeDown(a...); }, args);
          }
          if (which < 2) launches[which] = d->KernelLaunches() - k0;
        }
        ASSERT_TRUE(d->Synchronize().ok()) << tag;
        out[which].resize(T * rows);
        ASSERT_TRUE(d->CopyToHost(out[which].data(), X, T * rows * 4).ok());
        if (which < 2) {
          ys[which].resize(pairs * rows);
          ASSERT_TRUE(d->CopyToHost(ys[which].data(), Y, pairs * rows * 4).ok());
        }
      }
      EXPECT_EQ(launches[0], cs.fused ? 1 : launches[1]) << tag;
      EXPECT_GE(launches[1], 2) << tag;
      EXPECT_EQ(out[0], out[1]) << tag << ": out";
      EXPECT_EQ(ys[0], ys[1]) << tag << ": the routed rows";
      EXPECT_TRUE(x.MissingRowsAreZero(ys[0], rows)) << tag;
      EXPECT_LE(device_test::RelativeDistance({out[2]}, {out[0]}), 1e-5) << tag << ": host";
    }
  }
  kernels::SetExactActivations(true);
}

// MatMulMoeRoute routes inside the router's GEMV (RouterKernel: its last block to finish
// routes) for up to 4 tokens and 256 experts: one launch, and the same logits, ids and weights
// as the router's GEMV and MoeRoute (its default on the same device: two launches), the ids
// equal to the host device's and the weights within 1e-5 (the logits summed in another order).
// V2-Lite's routing (64 experts,
// softmax, greedy top-6), V2's (160, 8 groups of which the best 3), V3's (256, sigmoid with a
// bias, the best 4 groups by their top-2 sums, normalized); F32 and BF16 routers; 5 tokens
// take the two launches. Each case runs twice, its outputs cleared before each, so a count not
// set back would show.
TEST_F(CudaTest, RoutingInsideTheRouterGemvEqualsItsKernel) {
  const int64_t D = 256;
  using Method = kernels::MoeRouting::Method;
  for (auto [E, method] : {std::pair{64, Method::kGreedy}, {160, Method::kGroupLimitedGreedy},
                           {256, Method::kNoauxTc}}) {
    kernels::MoeRouting p;
    p.n_experts = E;
    p.k = method == Method::kNoauxTc ? 8 : 6;
    p.n_group = method == Method::kGreedy ? 1 : 8;
    p.topk_group = method == Method::kNoauxTc ? 4 : 3;
    p.method = method;
    p.sigmoid = method == Method::kNoauxTc;
    p.norm_topk_prob = method == Method::kNoauxTc;
    p.routed_scaling_factor = method == Method::kGreedy ? 1.f : 2.5f;
    const Pair bias = Upload(Random(E, -0.1f, 0.1f));
    const float* bc = method == Method::kNoauxTc ? bias.cuda : nullptr;
    const float* bh = method == Method::kNoauxTc ? bias.host : nullptr;
    for (DType type : {DType::kF32, DType::kBF16}) {
      std::vector<std::vector<uint8_t>> bytes;
      const Uploaded r = UploadRandom(cuda_.get(), host_.get(), type, E, D, &rng_, &bytes);
      for (int64_t T : {1, 4, 5}) {
        const std::string tag = std::to_string(E) + " experts, " + DTypeName(type) +
                                ", T=" + std::to_string(T);
        const Pair x = Upload(Random(T * D, -2.f, 2.f));
        std::vector<int32_t> ids[3];
        std::vector<float> logits[2], w[3];
        for (int which = 0; which < 3; ++which) {
          Device* d = which == 2 ? host_.get() : cuda_.get();
          const Pair lg = Zeros(T * E), wt = Zeros(T * p.k);
          float* lgp = which == 2 ? lg.host : lg.cuda;
          float* wp = which == 2 ? wt.host : wt.cuda;
          auto id = d->Alloc(T * p.k * 4);
          ASSERT_TRUE(id.ok());
          int32_t* idp = static_cast<int32_t*>(*id);
          for (int rep = 0; rep < 2; ++rep) {
            d->Fill(idp, 0xff, T * p.k * 4);
            d->Fill(wp, 0, T * p.k * 4);
            const int64_t k0 = d->KernelLaunches();
            if (which == 1) {
              d->Device::MatMulMoeRoute(r.cuda, x.cuda, T, lgp, bc, p, idp, wp);
            } else {
              d->MatMulMoeRoute(which == 2 ? r.host : r.cuda, which == 2 ? x.host : x.cuda, T,
                                lgp, which == 2 ? bh : bc, p, idp, wp);
            }
            if (which == 0) {
              EXPECT_EQ(d->KernelLaunches() - k0, T <= 4 ? 1 : 2) << tag;
            }
          }
          ids[which].resize(T * p.k);
          w[which].resize(T * p.k);
          ASSERT_TRUE(d->CopyToHost(ids[which].data(), idp, T * p.k * 4).ok());
          ASSERT_TRUE(d->CopyToHost(w[which].data(), wp, T * p.k * 4).ok());
          if (which < 2) logits[which] = Download(lgp, T * E);
        }
        EXPECT_EQ(logits[0], logits[1]) << tag;
        EXPECT_EQ(ids[0], ids[1]) << tag;
        EXPECT_EQ(w[0], w[1]) << tag;
        EXPECT_EQ(ids[0], ids[2]) << tag << ": against the host device";
        EXPECT_LE(device_test::RelativeDistance({w[2]}, {w[0]}), 1e-5) << tag;
      }
    }
  }
}

// NormMatMuls' route (the MoE layer's router and routing over the norm's output) on the
// products' launch (RouteTail: blocks of their own multiply the F32 router with the norm's
// rows, the last of them routes): one launch for the norm, the shared experts' gate and up, the
// router and the routing, and the same bits -- the norm's rows, the products, the logits, ids
// and weights, and the routed experts' gate and up after it (their input still prepared by the
// norm: one launch) -- as the norm's products and MatMulMoeRoute after them (two launches); ids
// equal to the host device's, weights within 1e-5 of them. V2-Lite's, V2's and V3's routings
// over 1 and 4 tokens; 5 tokens (three launches), a BF16 router, and a product of too few blocks
// for the router's rows (128 rows: 16 blocks, 256 experts: 32) take the launches apart.
TEST_F(CudaTest, RoutingInsideTheNormsGemvEqualsItsKernels) {
  kernels::SetExactActivations(false);
  const int64_t D = 256, E = 256, I = 64;
  using Method = kernels::MoeRouting::Method;
  std::vector<std::vector<uint8_t>> bytes;
  std::vector<std::vector<float>> scales;
  std::vector<TensorView> views;
  RandomExperts(DType::kQ4_0, static_cast<int>(E), I, D, &rng_, &bytes, &views);
  std::vector<const TensorView*> ep;
  for (const TensorView& v : views) ep.push_back(&v);
  std::vector<void*> allocs;
  auto xc = cuda_->UploadExperts(ep, &allocs), xh = host_->UploadExperts(ep, &allocs);
  ASSERT_TRUE(xc.ok() && xh.ok());
  const Pair norm = Upload(Random(D, 0.5f, 1.5f));
  const Pair bias = Upload(Random(E, -0.1f, 0.1f));
  struct Case {
    int n_experts;
    Method method;
    DType router;
    int64_t shared_rows, T;
    bool fused;
  };
  for (const Case& cs :
       {Case{64, Method::kGreedy, DType::kF32, 512, 1, true},
        Case{160, Method::kGroupLimitedGreedy, DType::kF32, 512, 4, true},
        Case{256, Method::kNoauxTc, DType::kF32, 512, 4, true},
        Case{256, Method::kNoauxTc, DType::kF32, 512, 5, false},
        Case{64, Method::kGreedy, DType::kBF16, 512, 1, false},
        Case{256, Method::kNoauxTc, DType::kF32, 128, 1, false}}) {
    kernels::MoeRouting p;
    p.n_experts = cs.n_experts;
    p.k = cs.method == Method::kNoauxTc ? 8 : 6;
    p.n_group = cs.method == Method::kGreedy ? 1 : 8;
    p.topk_group = cs.method == Method::kNoauxTc ? 4 : 3;
    p.method = cs.method;
    p.sigmoid = cs.method == Method::kNoauxTc;
    p.norm_topk_prob = cs.method == Method::kNoauxTc;
    p.routed_scaling_factor = cs.method == Method::kGreedy ? 1.f : 2.5f;
    const int64_t T = cs.T, n_e = cs.n_experts, rows = cs.shared_rows;
    const std::string tag = std::to_string(n_e) + " experts, " + DTypeName(cs.router) + ", T=" +
                            std::to_string(T) + ", " + std::to_string(rows) + " shared rows";
    const Uploaded r = UploadRandom(cuda_.get(), host_.get(), cs.router, n_e, D, &rng_, &bytes);
    const Uploaded g = UploadRandom(cuda_.get(), host_.get(), DType::kQ4_0, rows, D, &rng_, &bytes);
    const Uploaded u = UploadRandom(cuda_.get(), host_.get(), DType::kQ4_0, rows, D, &rng_, &bytes);
    const Pair x = Upload(Random(T * D, -2.f, 2.f));
    const float* bc = cs.method == Method::kNoauxTc ? bias.cuda : nullptr;
    const float* bh = cs.method == Method::kNoauxTc ? bias.host : nullptr;
    // Per run: the norm's rows, gate, up, logits, ids, weights, the routed gate and up.
    std::vector<float> out[3][7];
    std::vector<int32_t> ids[3];
    int64_t launches[2][2];
    for (int which = 0; which < 3; ++which) {  // one launch, two, the host device
      Device* d = which == 2 ? host_.get() : cuda_.get();
      const bool h = which == 2;
      const Pair y = Zeros(T * D), G = Zeros(T * rows), U = Zeros(T * rows), lg = Zeros(T * n_e);
      const Pair wt = Zeros(T * p.k), eg = Zeros(T * p.k * I), eu = Zeros(T * p.k * I);
      auto id = d->Alloc(T * p.k * 4);
      ASSERT_TRUE(id.ok());
      int32_t* idp = static_cast<int32_t*>(*id);
      auto pick = [h](const Pair& v) { return h ? v.host : v.cuda; };
      const Device::MoeRouteOut route{h ? &r.host : &r.cuda, pick(lg), h ? bh : bc, p, idp,
                                      pick(wt)};
      for (int rep = 0; rep < 2; ++rep) {
        d->Fill(idp, 0xff, T * p.k * 4);
        const int64_t k0 = d->KernelLaunches();
        const std::initializer_list<Device::MatMulOut> outs = {
            {h ? &g.host : &g.cuda, pick(G)}, {h ? &u.host : &u.cuda, pick(U)}};
        const backend::DeviceExperts& xe = h ? *xh : *xc;
        if (which == 1) {
          d->NormMatMuls(pick(x), pick(norm), 0.f, 1e-6f, pick(y), T, D, outs, &xe);
          d->MatMulMoeRoute(*route.router, pick(y), T, route.logits, route.bias, p, idp,
                            route.w);
        } else {
          d->NormMatMuls(pick(x), pick(norm), 0.f, 1e-6f, pick(y), T, D, outs, &xe, &route);
        }
        const int64_t k1 = d->KernelLaunches();
        d->ExpertsMatMuls(pick(y), T, idp, p.k, false, {{&xe, pick(eg)}, {&xe, pick(eu)}});
        if (!h) launches[which][0] = k1 - k0, launches[which][1] = d->KernelLaunches() - k1;
      }
      ASSERT_TRUE(d->Synchronize().ok()) << tag;
      int i = 0;
      for (auto [v, count] : {std::pair{&y, T * D}, {&G, T * rows}, {&U, T * rows},
                              {&lg, T * n_e}, {&wt, T * p.k}, {&eg, T * p.k * I},
                              {&eu, T * p.k * I}}) {
        out[which][i] = h ? std::vector<float>(v->host, v->host + count) : Download(v->cuda, count);
        ++i;
      }
      ids[which].resize(T * p.k);
      ASSERT_TRUE(d->CopyToHost(ids[which].data(), idp, T * p.k * 4).ok());
    }
    const int64_t apart = T <= 4 ? 2 : 3;  // (past 4 tokens the routing is a launch of its own)
    EXPECT_EQ(launches[0][0], cs.fused ? 1 : apart) << tag;
    EXPECT_EQ(launches[1][0], apart) << tag;
    EXPECT_EQ(launches[0][1], 1) << tag << ": the routed experts' input prepared";
    EXPECT_EQ(launches[1][1], 1) << tag;
    for (int i = 0; i < 7; ++i) EXPECT_EQ(out[0][i], out[1][i]) << tag << ": output " << i;
    EXPECT_EQ(ids[0], ids[1]) << tag;
    EXPECT_EQ(ids[0], ids[2]) << tag << ": against the host device";
    EXPECT_LE(device_test::RelativeDistance({out[2][4]}, {out[0][4]}), 1e-5) << tag;
    EXPECT_LE(device_test::RelativeDistance({out[2][5]}, {out[0][5]}), 1e-5) << tag;
  }
  kernels::SetExactActivations(true);
}

}  // namespace
}  // namespace peng::cuda_test
