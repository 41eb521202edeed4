// Conformance of the CUDA backend's quantized and fused ops against the host device (the
// harness: cuda_test_util.h; the single ops: cuda_device_test.cc, the same binaries): the
// quantized GEMVs against the CPU's quantized path, the combinations a decode step runs back to
// back (norm + products, gated + products, plain products -- each input kernel also inside the
// GEMV --, attention + output projection, the experts' gated down projection, MLA's latent
// norm), their launch counts, and what is refused; the mixture-of-experts fusions are in
// cuda_moe_test.cc.
#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdio>
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

// The fused ops of a DeepSeek layer against their parts on the host device: the routed
// experts' gated down projection (GatedExpertsMatMul; quantized mode: the GEMV's blocks compute
// and quantize the activation, GatedExpertsQGemvKernel) and MLA's latent norm inside
// RopeKvWrite.
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
    if (exact)  // (quantized: computed inside the GEMV, gate left unwritten)
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
// (AttentionMatMuls, Q4_1: blocks of 32 -- and Q4_K, 256, quantized inside its GEMV; a step
// with a prompt of 21 tokens: the FP32 tiles in exact mode, else the tensor cores; heads of 64
// and 256),
// and SlotSum folded into a product's store (MatMulOut::slots), against the host device.
TEST_F(CudaTest, FusedAttentionOutputAndSlotSum) {
  AttnBatch a;
  BuildBatch(cuda_.get(), &a);
  const int64_t T = a.host.n_tokens;
  std::vector<std::vector<uint8_t>> bytes;
  // Heads of 64 (AttentionMmaKernel on the tensor cores) and 256 (AttentionMmaWideKernel).
  for (auto [H, KV, hd] : {std::array<int, 3>{8, 2, 64}, {4, 1, 256}}) {
    const Uploaded wo4_1 = UploadRandom(cuda_.get(), host_.get(), DType::kQ4_1, 96, H * hd,
                                        &rng_, &bytes);
    const Uploaded wo4_k = UploadRandom(cuda_.get(), host_.get(), DType::kQ4_K, 96, H * hd,
                                        &rng_, &bytes);
    kernels::KvLayerView kc, kh;
    RandomCache(DType::kF16, KV, hd, hd, &kc, &kh);
    const Pair q = Upload(Random(T * H * hd));
    const kernels::AttentionParams p = AttnParams(H, hd);
    for (bool exact : {true, false}) {
      kernels::SetExactActivations(exact);
      for (const Uploaded* wo : {&wo4_1, &wo4_k}) {
        const std::string tag = std::string(DTypeName(wo->cuda.dtype)) + " hd " +
                                std::to_string(hd) + (exact ? " exact" : " quantized");
        const Pair o = Zeros(T * H * hd), y = Upload(Random(T * 96));
        cuda_->AttentionMatMuls(q.cuda, kc, a.cuda, p, o.cuda,
                                {{&wo->cuda, y.cuda, nullptr, true}});
        host_->AttentionMatMuls(q.host, kh, a.host, p, o.host,
                                {{&wo->host, y.host, nullptr, true}});
        // (outside exact mode the prompt's attention runs on the tensor cores: FP16 operands)
        Expect(o, T * H * hd, exact ? 1e-4 : 1e-3, "AttentionMatMuls: attention " + tag);
        Expect(y, T * 96, exact ? 1e-4 : 3e-3, "AttentionMatMuls: o " + tag);
      }
    }
  }
  const int H = 8, hd = 64;
  const Uploaded wo4_1 = UploadRandom(cuda_.get(), host_.get(), DType::kQ4_1, 96, H * hd, &rng_,
                                      &bytes);
  for (bool exact : {true, false}) {
    kernels::SetExactActivations(exact);
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
// columns: 88 units (lanes take 2-3 each), 11 K-quant super-blocks. From 16 tokens on the
// products are the tensor cores' (QMmaKernel: 77 rows, five tiles of 16, the last with 13
// rows (3 past the matrix); 88 units, the block's eight warps taking 12 or 8 each, in groups of
// 4; so few rows take blocks of 8 tokens); 17 and 40 tokens end inside a tile of 8.
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
  for (int64_t T : {1, 3, 9, 17, 32, 40, 64}) {
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
  // The dp4a GEMV at such counts of tokens (PENG_CUDA_MMA_GEMV=0), every type: the path the
  // tensor cores' products replace from 16 tokens on.
  {
    const std::unique_ptr<Device> dp4a = DeviceWithout("PENG_CUDA_MMA_GEMV");
    ASSERT_NE(dp4a, nullptr);
    std::vector<Uploaded> ws;  // (uploaded there: an upload sizes the device's scratch)
    for (DType t : types)
      ws.push_back(UploadRandom(dp4a.get(), host_.get(), t, rows, cols, &rng_, &bytes));
    for (int64_t T : {17, 64}) {
      const Pair x = Upload(Random(T * cols, -3.f, 3.f));
      for (size_t i = 0; i < types.size(); ++i) {
        const Pair y = Zeros(T * rows);
        dp4a->MatMul(ws[i].cuda, x.cuda, T, y.cuda);
        host_->MatMul(ws[i].host, x.host, T, y.host);
        Expect(y, T * rows, 1e-5,
               std::string("dp4a MatMul ") + DTypeName(types[i]) + " T=" + std::to_string(T));
      }
    }
  }
  // The other row splits of the GEMV (backend/cuda/cuda_device.cu, LaunchQGemv): many rows a
  // warp each (2200 rows: at least 16 warps a multiprocessor up to 137 of them), few long rows
  // four warps each (144 units); on the tensor cores, a matrix of fewer units than a block's
  // warps take at once (512 columns: 16 units, warps 0-3 of 8), blocks of 16 tokens (2200
  // rows: 138 tiles of 16 rows, fewer than two blocks a multiprocessor with 32 tokens a block)
  // and of 32 (4400 rows: 275 tiles).
  for (auto [r2, c2] : {std::pair<int64_t, int64_t>{2200, 512}, {77, 4608}, {4400, 256}}) {
    for (DType t : {DType::kQ4_1, DType::kQ6_K}) {
      const Uploaded w = UploadRandom(cuda_.get(), host_.get(), t, r2, c2, &rng_, &bytes);
      for (int64_t T : {1, 11, 24}) {
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
    for (int64_t T : {1, 5, 21}) {
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
        // act(gate) * up into h, then the second type's product with bias, added to c; again
        // in place (into gate), where the CUDA backend leaves gate unwritten when it computes
        // the activation inside the product's GEMV (quantized mode).
        const Pair g = Upload(Random(T * cols, -4.f, 4.f)), u = Upload(Random(T * cols));
        for (bool in_place : {false, true}) {
          const std::string how = in_place ? " in place" : "";
          const Pair hg = Zeros(T * cols);
          const Pair& out = in_place ? g : hg;
          cuda_->GatedMatMuls(backend::GatedActivation::kSilu, g.cuda, u.cuda, out.cuda, T, cols,
                              {{&wc[1], c.cuda, bias.cuda, true}});
          host_->GatedMatMuls(backend::GatedActivation::kSilu, g.host, u.host, out.host, T, cols,
                              {{&wh[1], c.host, bias.host, true}});
          if (!in_place || exact)
            Expect(out, T * cols, 1e-5, "GatedMatMuls: SiLU * up" + how + tag);
          Expect(c, T * rows, tol, "GatedMatMuls " + n1 + " + bias, accumulated" + how + tag);
        }
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

// The kernel that produces a GEMV's activations runs inside the first product's GEMV
// (FusedQGemvKernel) where the block's tile of tokens fits its shared memory: NormMatMuls' norm,
// GatedMatMuls' activation (into h, and in place into gate where every product is quantized),
// MatMuls' quantization. One launch less, and the same bits as the kernel of its own before
// the GEMV (PENG_CUDA_FUSED_INPUT=0) -- its output (h), its quantized rows read by the next
// launch (another type) and the FP32 product over it included. Shapes: a row a warp and a token
// tile (T = 3, 9), two and four warps a row (T = 5 x 2048, T = 1 x 4096), four rows a warp
// (4096 rows: a block takes 4 times its rows to stay within 3 blocks a multiprocessor); T = 2 x
// 4096 exceeds the tile budget, and 16384 rows stay past 3 blocks a multiprocessor even so:
// those keep the kernel of their own.
TEST_F(CudaTest, InputInsideTheGemvEqualsItsKernel) {
  const std::unique_ptr<Device> unfused = DeviceWithout("PENG_CUDA_FUSED_INPUT");
  ASSERT_NE(unfused, nullptr);
  Device* plain = unfused.get();
  kernels::SetExactActivations(false);
  std::mt19937_64 rng(7);
  struct Case {
    int64_t T, cols, rows;
    bool fused;
  };
  enum Input { kNorm, kGated, kGatedInPlace, kPlain };
  const char* const kInputNames[] = {"norm", "gated", "gated in place", "plain"};
  for (const Case& cs : {Case{3, 512, 96, true}, Case{9, 1024, 96, true},
                         Case{5, 2048, 96, true}, Case{1, 4096, 96, true},
                         Case{2, 4096, 96, false}, Case{3, 512, 4096, true},
                         Case{1, 256, 16384, false}}) {
    const int64_t T = cs.T, cols = cs.cols, rows = cs.rows;
    for (auto [t0, t1] : {std::pair{DType::kQ4_K, DType::kQ8_0}, {DType::kQ4_0, DType::kQ6_K},
                          {DType::kI8, DType::kF32}}) {
      std::vector<std::vector<uint8_t>> bytes;
      std::vector<float> scales0, scales1;
      bytes.push_back(RandomMatrix(t0, rows, cols, &rng, &scales0));
      bytes.push_back(RandomMatrix(t1, rows, cols, &rng, &scales1));
      const std::vector<float> x = Random(T * cols, -2.f, 2.f), nw = Random(cols, 0.5f, 1.5f);
      const std::vector<float> u = Random(T * cols), bias = Random(rows), acc = Random(T * rows);
      for (Input input : {kNorm, kGated, kGatedInPlace, kPlain}) {
        // In place: only where every product is quantized (the first type twice).
        const bool in_place = input == kGatedInPlace;
        const std::string tag = std::string(kInputNames[input]) + ", " + DTypeName(t0) +
                                " then " + DTypeName(in_place ? t0 : t1) + ", T=" +
                                std::to_string(T) + " x " + std::to_string(cols) + ", " +
                                std::to_string(rows) + " rows";
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
          float* X = UploadTo(d, x);
          float* U = UploadTo(d, u);
          float* NW = UploadTo(d, nw);
          float* BI = UploadTo(d, bias);
          float* H = in_place ? X : UploadTo(d, std::vector<float>(T * cols));
          float* A = UploadTo(d, std::vector<float>(T * rows));
          float* B = UploadTo(d, acc);
          float* C = UploadTo(d, acc);
          const backend::DeviceMatrix& w1 = w[in_place ? 0 : 1];
          const int64_t k0 = d->KernelLaunches();
          const std::initializer_list<Device::MatMulOut> outs = {
              {&w[0], A, BI}, {&w1, B, nullptr, true}, {&w[0], C, BI, true}};
          switch (input) {
            case kNorm: d->NormMatMuls(X, NW, 1.f, 1e-6f, H, T, cols, outs); break;
            case kGated:
            case kGatedInPlace:
              d->GatedMatMuls(backend::GatedActivation::kSilu, X, U, H, T, cols, outs);
              break;
            case kPlain: d->MatMuls(X, T, outs); break;
          }
          launches[which] = d->KernelLaunches() - k0;
          ASSERT_TRUE(d->Synchronize().ok()) << tag;
          int i = 0;
          for (auto [p, n] :
               {std::pair{H, T * cols}, {A, T * rows}, {B, T * rows}, {C, T * rows}}) {
            out[which][i].resize(n);
            ASSERT_TRUE(d->CopyToHost(out[which][i++].data(), p, n * 4).ok());
          }
        }
        EXPECT_EQ(launches[0], launches[1] - (cs.fused ? 1 : 0)) << tag;
        for (int i = in_place && cs.fused ? 1 : 0; i < 4; ++i)  // (gate unwritten when fused)
          EXPECT_EQ(out[0][i], out[1][i]) << tag << ": output " << "habc"[i];
      }
    }
  }
  kernels::SetExactActivations(true);
}

// AddRmsNorm (Gemma's post-norms into the residual stream) in one kernel: the same bits as its
// default on the same device (RmsNorm, then Add: two launches), within 1e-5 of the host device;
// rows of a head's size (128 threads a block) and of Gemma 3 270M's hidden size (256).
TEST_F(CudaTest, AddRmsNormEqualsNormThenAdd) {
  for (int64_t n : {64, 640}) {
    const int64_t rows = 5;
    const std::string tag = "n=" + std::to_string(n);
    const std::vector<float> x = Random(rows * n, -3.f, 3.f), y0 = Random(rows * n);
    const Pair w = Upload(Random(n));
    const Pair xf = Upload(x), yf = Upload(y0), xp = Upload(x), yp = Upload(y0);
    int64_t k0 = cuda_->KernelLaunches();
    cuda_->AddRmsNorm(yf.cuda, xf.cuda, w.cuda, 1.f, rows, n, 1e-6f);
    EXPECT_EQ(cuda_->KernelLaunches() - k0, 1) << tag;
    k0 = cuda_->KernelLaunches();
    cuda_->Device::AddRmsNorm(yp.cuda, xp.cuda, w.cuda, 1.f, rows, n, 1e-6f);
    EXPECT_EQ(cuda_->KernelLaunches() - k0, 2) << tag;
    EXPECT_EQ(Download(yf.cuda, rows * n), Download(yp.cuda, rows * n)) << tag;
    host_->AddRmsNorm(yf.host, xf.host, w.host, 1.f, rows, n, 1e-6f);
    Expect(yf, rows * n, 1e-5, "AddRmsNorm " + tag);
  }
}

// AttentionMatMuls given RopeKvWrite's arguments (and the heads' norms) normalizes and rotates q
// and k and stores the token's k and v inside the attention kernel where every sequence has one
// token in the step (AttnRope): one launch less (three with the norms), and the same bits as
// RmsNorm and RopeKvKernel before the attention (PENG_CUDA_FUSED_ROPE=0) -- the attention's
// output, the projection over it, every byte of the cache --, and within 1e-4 of the host
// device. Decode steps (a sequence at position 0, whose only key is its own, and two further
// on) over F32 and F16 caches, head sizes 64, 128 and 256 (GQA, 8 heads over 2), whole and half
// rotations in both pair styles, YaRN's attention factor, a sliding window, Gemma's head norms
// (weights + 1); a step with a prefill among its sequences takes the kernels of their own on
// both.
TEST_F(CudaTest, RopeInsideTheAttentionEqualsItsKernel) {
  const std::unique_ptr<Device> unfused = DeviceWithout("PENG_CUDA_FUSED_ROPE");
  ASSERT_NE(unfused, nullptr);
  Device* plain = unfused.get();
  const int H = 8, KV = 2;
  for (bool decode : {true, false}) {
    AttnBatch a, b;  // (the same batch on the two CUDA devices)
    const std::array<int64_t, 3> n = decode ? std::array<int64_t, 3>{1, 1, 1}
                                            : std::array<int64_t, 3>{21, 1, 5};
    BuildBatch(cuda_.get(), &a, {0, 40, 30}, n);
    BuildBatch(plain, &b, {0, 40, 30}, n);
    const int64_t T = a.host.n_tokens;
    for (DType kv_type : {DType::kF32, DType::kF16, DType::kQ8_0}) {
      for (int hd : {64, 128, 256}) {
        for (int variant = 0; variant < 3; ++variant) {
          kernels::RopeConfig rope;
          const bool half = variant == 1;
          rope.rot_dim = half ? hd / 2 : hd;
          rope.style = half ? kernels::RopeStyle::kInterleaved : kernels::RopeStyle::kNeox;
          rope.theta = 10000.f;
          rope.attention_factor = half ? 1.2f : 1.f;
          const kernels::AttentionParams p = AttnParams(H, hd, half ? 8 : 0);
          const char* const kVariants[] = {" neox", " half interleaved, window 8",
                                           " neox, the heads' norms"};
          const std::string tag = std::string(decode ? "decode" : "mixed") + " " +
                                  DTypeName(kv_type) + " hd=" + std::to_string(hd) +
                                  kVariants[variant];
          std::vector<float> inv(rope.rot_dim / 2);
          kernels::ComputeRopeInvFreq(rope, inv.data());
          kernels::KvLayerView kc, kh;
          RandomCache(kv_type, KV, hd, hd, &kc, &kh);
          const int64_t bytes = CacheBytes(kh, false);  // (K and V alike)
          const kernels::KvLayerView kp = CopyCache(plain, kh);  // (the plain device's copy)
          std::vector<float> scales;
          std::vector<uint8_t> wo_bytes = RandomMatrix(DType::kQ8_0, 96, H * hd, &rng_, &scales);
          const std::vector<float> q = Random(T * H * hd), k = Random(T * KV * hd),
                                   v = Random(T * KV * hd), y0 = Random(T * 96),
                                   qn = Random(hd, 0.5f, 1.5f), kn = Random(hd, -0.5f, 0.5f);
          std::vector<float> out[3][2];  // [fused, plain, host][o, y]
          std::vector<uint8_t> cache[2][2];  // [fused, plain][k, v]
          int64_t launches[2] = {0, 0};
          for (int which = 0; which < 3; ++which) {
            Device* d = which == 0 ? cuda_.get() : which == 1 ? plain : host_.get();
            const kernels::KvLayerView& kv = which == 0 ? kc : which == 1 ? kp : kh;
            const backend::StepBatch& sb = which == 0 ? a.cuda : which == 1 ? b.cuda : a.host;
            TensorView w;
            w.name = "wo";
            w.dtype = DType::kQ8_0;
            w.shape = {96, H * hd};
            w.data = wo_bytes.data();
            w.size_bytes = wo_bytes.size();
            auto wo = d->Upload(w, nullptr);
            ASSERT_TRUE(wo.ok()) << wo.status().ToString();
            float* Q = UploadTo(d, q);
            float* K = UploadTo(d, k);
            float* V = UploadTo(d, v);
            float* F = UploadTo(d, inv);
            float* O = UploadTo(d, std::vector<float>(T * H * hd));
            float* Y = UploadTo(d, y0);
            backend::HeadNorms norms;  // (Gemma's: weights + 1)
            if (variant == 2) norms = {UploadTo(d, qn), UploadTo(d, kn), 1.f, 1e-6f, hd};
            const Device::RopeKv r{{Q, H, hd, H * hd}, {K, KV, hd, KV * hd}, &rope, F, K, V, {},
                                   norms};
            const int64_t k0 = d->KernelLaunches();
            d->AttentionMatMuls(Q, kv, sb, p, O, {{&*wo, Y, nullptr, true}}, &r);
            if (which < 2) launches[which] = d->KernelLaunches() - k0;
            ASSERT_TRUE(d->Synchronize().ok()) << tag;
            int i = 0;
            for (auto [ptr, count] : {std::pair{O, T * H * hd}, {Y, T * 96}}) {
              out[which][i].resize(count);
              ASSERT_TRUE(d->CopyToHost(out[which][i++].data(), ptr, count * 4).ok());
            }
            if (which == 2) continue;
            for (int c = 0; c < 2; ++c) {
              cache[which][c].resize(bytes);
              ASSERT_TRUE(d->CopyToHost(cache[which][c].data(), c ? kv.v : kv.k, bytes).ok());
            }
          }
          EXPECT_EQ(launches[0], launches[1] - (decode ? variant == 2 ? 3 : 1 : 0)) << tag;
          EXPECT_EQ(out[0][0], out[1][0]) << tag << ": the attention's output";
          EXPECT_EQ(out[0][1], out[1][1]) << tag << ": the projection";
          EXPECT_TRUE(cache[0][0] == cache[1][0] && cache[0][1] == cache[1][1]) << tag;
          EXPECT_LE(device_test::RelativeDistance({out[2][0]}, {out[0][0]}), 1e-4)
              << tag << ": against the host device";
        }
      }
    }
  }
}

// RopeMlaAbsorbQuery normalizes the latent, rotates q_pe and k_pe and stores the cache row inside
// the absorption kernel (MlaRopeKv) in any step -- the attention that reads the cache is the next
// launch: one launch less, and the same bits as RopeKvKernel before it (PENG_CUDA_FUSED_ROPE=0)
// -- the absorbed query and every byte of the latent cache --, and the absorbed query within
// 1e-4 of the host device's. V2-Lite's shapes over a prefill, a decode and a chunk, and over a
// step of 71 tokens (the products one batched GEMM); F32, F16 and Q8_0 caches; DeepSeek's
// interleaved pairs and half-apart ones with YaRN's attention factor.
TEST_F(CudaTest, MlaRopeInsideTheAbsorptionEqualsItsKernel) {
  const std::unique_ptr<Device> unfused = DeviceWithout("PENG_CUDA_FUSED_ROPE");
  ASSERT_NE(unfused, nullptr);
  Device* plain = unfused.get();
  for (bool prefill : {false, true}) {
    AttnBatch a, b;  // (the same batch on the two CUDA devices)
    if (prefill) {  // (the absorption's products one batched GEMM: CudaDevice::MlaGemm)
      BuildBatch(cuda_.get(), &a, {0, 3, 9}, {40, 1, 30});
      BuildBatch(plain, &b, {0, 3, 9}, {40, 1, 30});
    } else {
      BuildBatch(cuda_.get(), &a);
      BuildBatch(plain, &b);
    }
    const int64_t T = a.host.n_tokens;
    const kernels::MlaParams p = LiteMla();
    const int64_t H = p.n_heads, r = p.kv_lora_rank, dr = p.d_rope;
    const int64_t row = r + dr, dqk = p.d_nope + dr;
    const std::vector<float> kvb = Random(H * (p.d_nope + p.d_v) * r, -0.05f, 0.05f);
    const std::vector<float> q = Random(T * H * dqk), ckv = Random(T * row), nw = Random(r);
    for (DType kv_type : {DType::kF32, DType::kF16, DType::kQ8_0}) {
      for (bool interleaved : {true, false}) {
        kernels::RopeConfig rope;
        rope.rot_dim = static_cast<int>(dr);
        rope.style = interleaved ? kernels::RopeStyle::kInterleaved : kernels::RopeStyle::kNeox;
        rope.theta = 10000.f;
        rope.attention_factor = interleaved ? 1.f : 1.2f;
        std::vector<float> inv(dr / 2);
        kernels::ComputeRopeInvFreq(rope, inv.data());
        const std::string tag = std::string(DTypeName(kv_type)) +
                                (interleaved ? " interleaved" : " half apart, factor 1.2") +
                                (prefill ? ", 71 tokens" : "");
        kernels::KvLayerView kc, kh;  // the latent cache: one row of r + d_rope values, no V
        RandomCache(kv_type, 1, static_cast<int>(row), 0, &kc, &kh);
        const int64_t bytes = CacheBytes(kh, false);
        const kernels::KvLayerView kp = CopyCache(plain, kh);  // (the plain device's copy)
        std::vector<float> out[3];  // fused, plain, host
        std::vector<uint8_t> cache[2];
        int64_t launches[2] = {0, 0};
        for (int which = 0; which < 3; ++which) {
          Device* d = which == 0 ? cuda_.get() : which == 1 ? plain : host_.get();
          const kernels::KvLayerView& kv = which == 0 ? kc : which == 1 ? kp : kh;
          const backend::StepBatch& sb = which == 0 ? a.cuda : which == 1 ? b.cuda : a.host;
          backend::MlaWeights w;  // the FP32 copy only
          w.kvb = UploadTo(d, kvb);
          float* Q = UploadTo(d, q);
          float* C = UploadTo(d, ckv);
          float* NW = UploadTo(d, nw);
          float* F = UploadTo(d, inv);
          float* O = UploadTo(d, std::vector<float>(T * H * row));
          const Device::RopeKv rk{{Q + p.d_nope, H, dqk, H * dqk}, {C + r, 1, row, row}, &rope, F,
                                  C, nullptr, {C, NW, 1e-6f, r, row}, {}};
          const int64_t k0 = d->KernelLaunches();
          d->RopeMlaAbsorbQuery(rk, kv, Q, sb, w, p, O);
          if (which < 2) launches[which] = d->KernelLaunches() - k0;
          ASSERT_TRUE(d->Synchronize().ok()) << tag;
          out[which].resize(T * H * row);
          ASSERT_TRUE(d->CopyToHost(out[which].data(), O, T * H * row * 4).ok());
          if (which == 2) continue;
          cache[which].resize(bytes);
          ASSERT_TRUE(d->CopyToHost(cache[which].data(), kv.k, bytes).ok());
        }
        EXPECT_EQ(launches[0], launches[1] - 1) << tag;
        EXPECT_EQ(out[0], out[1]) << tag << ": the absorbed query";
        EXPECT_TRUE(cache[0] == cache[1]) << tag << ": the latent cache";
        EXPECT_LE(device_test::RelativeDistance({out[2]}, {out[0]}), 1e-4)
            << tag << ": against the host device";
      }
    }
  }
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
