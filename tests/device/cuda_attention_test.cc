// The CUDA backend's attention beyond the single decode step (cuda_device_test.cc's binary; the
// harness: cuda_test_util.h): the tiled attention of steps with prompt tokens on the FP32 cores
// and on the tensor cores, each against the host device, and long contexts' decode split over
// blocks.
#include <gtest/gtest.h>

#include <array>
#include <cmath>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "backend/device.h"
#include "cuda_test_util.h"
#include "kernels/ops.h"

namespace peng::cuda_test {
namespace {

// The attention of steps with prompt tokens in tiles of (token, head) rows (AttentionTileKernel)
// and in a block a (token, head) (PENG_CUDA_TILED_ATTENTION=0), each against the host device:
// KV groups of 4, 7 (tiles that end inside a token) and 1 query heads, a mixed step and one with
// prompts longer than a chunk of keys, head sizes 64 / 128 / 256, both caches, a sliding window
// and a softcap; MLA's latent cache (V2-Lite's shapes).
TEST_F(CudaTest, TiledAttentionAndThePerTokenKernel) {
  const std::unique_ptr<Device> untiled = DeviceWithout("PENG_CUDA_TILED_ATTENTION");
  ASSERT_NE(untiled, nullptr);
  Device* plain = untiled.get();
  for (int shape = 0; shape < 2; ++shape) {
    const std::array<int64_t, 3> pos0 = shape ? std::array<int64_t, 3>{0, 3, 9}
                                              : std::array<int64_t, 3>{0, 40, 30};
    const std::array<int64_t, 3> n = shape ? std::array<int64_t, 3>{40, 1, 30}
                                           : std::array<int64_t, 3>{21, 1, 5};
    AttnBatch a, b;  // (the same batch on the two CUDA devices)
    BuildBatch(cuda_.get(), &a, pos0, n);
    BuildBatch(plain, &b, pos0, n);
    const int64_t T = a.host.n_tokens;
    const std::string batch = shape ? "prompts of 40 and 30" : "mixed";
    for (DType kv_type : {DType::kF32, DType::kF16, DType::kQ8_0}) {
      for (auto [H, KV, hd] : {std::array<int, 3>{8, 2, 64}, {7, 1, 128}, {4, 4, 256}}) {
        kernels::KvLayerView kc, kh;
        RandomCache(kv_type, KV, hd, hd, &kc, &kh);
        const kernels::KvLayerView kp = CopyCache(plain, kh);
        const std::vector<float> k = Random(T * KV * hd), v = Random(T * KV * hd);
        const std::vector<float> q = Random(T * H * hd);
        float* dq[2];
        for (int i = 0; i < 2; ++i) {
          Device* d = i ? plain : cuda_.get();
          float* dk = *d->UploadFloats(k.data(), T * KV * hd);
          float* dv = *d->UploadFloats(v.data(), T * KV * hd);
          d->KvWrite(i ? kp : kc, i ? b.cuda : a.cuda, dk, dv);
          dq[i] = *d->UploadFloats(q.data(), T * H * hd);
        }
        host_->KvWrite(kh, a.host, k.data(), v.data());
        for (auto [window, softcap] : {std::pair{0, 0.f}, {8, 0.f}, {0, 20.f}}) {
          const kernels::AttentionParams p = AttnParams(H, hd, window, softcap);
          std::vector<float> ref(T * H * hd);
          host_->PagedAttention(q.data(), kh, a.host, p, ref.data());
          for (int i = 0; i < 2; ++i) {
            Device* d = i ? plain : cuda_.get();
            float* o = *d->UploadFloats(std::vector<float>(T * H * hd).data(), T * H * hd);
            d->PagedAttention(dq[i], i ? kp : kc, i ? b.cuda : a.cuda, p, o);
            ExpectNear(d, o, ref, 1e-4,
                 std::string(i ? "per token " : "tiled ") + batch + " " + DTypeName(kv_type) +
                     " H" + std::to_string(H) + "/" + std::to_string(KV) + " hd" +
                     std::to_string(hd) + " window " + std::to_string(window) +
                     (softcap > 0 ? " softcap" : ""));
          }
        }
      }
      // MLA: one latent row of r + d_rope values a token, the value its first r.
      const kernels::MlaParams p = LiteMla();
      const int64_t H = p.n_heads, r = p.kv_lora_rank, row = r + p.d_rope;
      kernels::KvLayerView kc, kh;
      RandomCache(kv_type, 1, static_cast<int>(row), 0, &kc, &kh);
      const kernels::KvLayerView kp = CopyCache(plain, kh);
      const std::vector<float> ckv = Random(T * row), qa = Random(T * H * row);
      std::vector<float> ref(T * H * r);
      host_->KvWrite(kh, a.host, ckv.data(), nullptr);
      host_->MlaAttention(qa.data(), kh, a.host, p, ref.data());
      for (int i = 0; i < 2; ++i) {
        Device* d = i ? plain : cuda_.get();
        d->KvWrite(i ? kp : kc, i ? b.cuda : a.cuda, *d->UploadFloats(ckv.data(), T * row),
                   nullptr);
        float* o = *d->UploadFloats(std::vector<float>(T * H * r).data(), T * H * r);
        d->MlaAttention(*d->UploadFloats(qa.data(), T * H * row), i ? kp : kc,
                        i ? b.cuda : a.cuda, p, o);
        ExpectNear(d, o, ref, 1e-4,
                   std::string(i ? "per token " : "tiled ") + batch + " MLA " +
                       DTypeName(kv_type));
      }
    }
  }
}

// The attention of prompts on the tensor cores (AttentionMmaKernel; AttentionMmaWideKernel for
// heads above 128 and MLA's latent rows: outside exact mode; queries and weights rounded to FP16,
// FP32 accumulation) against the host device's FP32 attention: within 1e-3 of the largest output
// (2e-3 for MLA's rows of 576, with wider scores: 5-7e-4 in the emulator), where the FP32 tiles
// (PENG_CUDA_MMA_ATTENTION=0) are within 1e-4 and differ from it (so the tensor cores ran). A
// mixed step, prompts of 40 and 30, and a prompt of 150 tokens after 60 in the cache (several
// chunks of keys, three tiles a KV head where its group is 1); head sizes 64, 128, 48, 96, 256,
// 192 and 160 (the head padded to 64 / 128 / 256), KV groups of 4, 7, 1, 2 and 3, F16 and Q8_0
// caches (the queries rotated in shared memory, the blocks scaled into FP16, the output rotated
// back); causal, sliding windows of 8 and 100, a softcap; MLA's latent rows over both caches.
// (The output quantized for the output projection: FusedAttentionOutputAndSlotSum.)
TEST_F(CudaTest, PromptAttentionOnTheTensorCores) {
  kernels::SetExactActivations(false);
  const std::unique_ptr<Device> fp32 = DeviceWithout("PENG_CUDA_MMA_ATTENTION");
  ASSERT_NE(fp32, nullptr);
  // run(d, i, o) on the tensor cores (i = 0) and on the FP32 tiles (1), each into a zeroed o of
  // ref.size() values, checked against ref; the two outputs must differ.
  const auto both = [&](const std::vector<float>& ref, double tol, const std::string& tag,
                        const std::function<void(Device*, int, float*)>& run) {
    std::vector<float> got[2];
    for (int i = 0; i < 2; ++i) {
      Device* d = i ? fp32.get() : cuda_.get();
      float* o = *d->UploadFloats(std::vector<float>(ref.size()).data(), ref.size());
      run(d, i, o);
      ExpectNear(d, o, ref, i ? 1e-4 : tol, (i ? "fp32 tiles " : "tensor cores ") + tag);
      got[i].resize(ref.size());
      ASSERT_TRUE(d->CopyToHost(got[i].data(), o, ref.size() * 4).ok());
    }
    EXPECT_NE(got[0], got[1]) << tag << ": the tensor cores' output is the FP32 tiles'";
  };
  for (int shape = 0; shape < 3; ++shape) {
    const std::array<std::array<int64_t, 3>, 3> pos0 = {{{0, 40, 30}, {0, 3, 9}, {60, 3, 0}}};
    const std::array<std::array<int64_t, 3>, 3> n = {{{21, 1, 5}, {40, 1, 30}, {150, 1, 40}}};
    std::vector<std::vector<int32_t>> tables;
    int64_t n_blocks = 9;
    if (shape == 2) {  // (210 positions: 14 blocks, in reverse)
      tables.resize(3);
      for (int32_t blk = 0; blk < 14; ++blk) tables[0].push_back(13 - blk);
      tables[1] = {14};
      tables[2] = {15, 16, 17};
      n_blocks = 18;
    }
    AttnBatch a, b;
    BuildBatch(cuda_.get(), &a, pos0[shape], n[shape], tables);
    BuildBatch(fp32.get(), &b, pos0[shape], n[shape], tables);
    const int64_t T = a.host.n_tokens;
    for (auto [H, KV, hd, q8] : {std::array<int, 4>{8, 2, 64, 0}, {7, 1, 128, 0},
                                 {2, 2, 48, 0}, {4, 2, 96, 0}, {8, 2, 64, 1}, {7, 1, 128, 1},
                                 {4, 2, 32, 1}, {4, 1, 256, 0}, {4, 1, 256, 1}, {6, 2, 192, 0},
                                 {3, 1, 160, 1}}) {
      const DType kv_type = q8 ? DType::kQ8_0 : DType::kF16;
      kernels::KvLayerView kc, kh;
      RandomCache(kv_type, KV, hd, hd, &kc, &kh, n_blocks);
      const kernels::KvLayerView kp = CopyCache(fp32.get(), kh);
      const std::vector<float> k = Random(T * KV * hd), v = Random(T * KV * hd);
      const std::vector<float> q = Random(T * H * hd, -2.f, 2.f);
      float* dq[2];
      for (int i = 0; i < 2; ++i) {
        Device* d = i ? fp32.get() : cuda_.get();
        d->KvWrite(i ? kp : kc, i ? b.cuda : a.cuda, *d->UploadFloats(k.data(), T * KV * hd),
                   *d->UploadFloats(v.data(), T * KV * hd));
        dq[i] = *d->UploadFloats(q.data(), T * H * hd);
      }
      host_->KvWrite(kh, a.host, k.data(), v.data());
      for (auto [window, softcap] : {std::pair{0, 0.f}, {8, 0.f}, {100, 0.f}, {0, 20.f}}) {
        const kernels::AttentionParams p = AttnParams(H, hd, window, softcap);
        std::vector<float> ref(T * H * hd);
        host_->PagedAttention(q.data(), kh, a.host, p, ref.data());
        const std::string tag = "shape " + std::to_string(shape) + " " + DTypeName(kv_type) +
                                " H" + std::to_string(H) + "/" + std::to_string(KV) + " hd" +
                                std::to_string(hd) +
                                " window " + std::to_string(window) +
                                (softcap > 0 ? " softcap" : "");
        both(ref, 1e-3, tag, [&](Device* d, int i, float* o) {
          d->PagedAttention(dq[i], i ? kp : kc, i ? b.cuda : a.cuda, p, o);
        });
      }
    }
    // MLA's latent rows (AttentionMmaWideKernel): V2-Lite's (16 heads, 512 + 64 values a row)
    // over both caches and rows of 32 + 16 (the key's quarters and the value's padded, some
    // warps idle).
    for (auto [rank, kv_type] : {std::pair{512, DType::kF16}, {512, DType::kQ8_0},
                                 {32, DType::kF16}}) {
      kernels::MlaParams p = LiteMla();
      if (rank == 32) p.kv_lora_rank = 32, p.d_rope = 16, p.n_heads = 5;
      const int64_t H = p.n_heads, r = p.kv_lora_rank, row = r + p.d_rope;
      kernels::KvLayerView kc, kh;
      RandomCache(kv_type, 1, static_cast<int>(row), 0, &kc, &kh, n_blocks);
      const kernels::KvLayerView kp = CopyCache(fp32.get(), kh);
      const std::vector<float> ckv = Random(T * row), qa = Random(T * H * row, -2.f, 2.f);
      std::vector<float> ref(T * H * r);
      host_->KvWrite(kh, a.host, ckv.data(), nullptr);
      host_->MlaAttention(qa.data(), kh, a.host, p, ref.data());
      const std::string tag = "shape " + std::to_string(shape) + " MLA " + std::to_string(r) +
                              " + " + std::to_string(p.d_rope) + " " + DTypeName(kv_type);
      both(ref, 2e-3, tag, [&](Device* d, int i, float* o) {
        d->KvWrite(i ? kp : kc, i ? b.cuda : a.cuda, *d->UploadFloats(ckv.data(), T * row),
                   nullptr);
        d->MlaAttention(*d->UploadFloats(qa.data(), T * H * row), i ? kp : kc,
                        i ? b.cuda : a.cuda, p, o);
      });
    }
  }
}

// Decode over long contexts, the keys split over blocks (AttentionKernel's parts, merged by the
// last to finish) and not (PENG_CUDA_ATTN_SPLIT=0), each against the host device: three decode
// tokens at positions 1000, 300 and 40 (4, 2 and 1 parts of at least 256 keys), tables spread
// over 96 blocks, head sizes 64 and 128, both caches, a sliding window of 300; the output
// quantized for o (AttentionMatMuls) with RoPE and the KV write inside, whose cache rows the two
// paths store alike; MLA's latent rows. Each case twice: a count of parts not set back fails it.
TEST_F(CudaTest, LongContextDecodeSplitsItsKeys) {
  const std::unique_ptr<Device> unsplit = DeviceWithout("PENG_CUDA_ATTN_SPLIT");
  ASSERT_NE(unsplit, nullptr);
  Device* plain = unsplit.get();
  std::vector<std::vector<int32_t>> tables(3);
  for (int32_t b = 0; b < 63; ++b) tables[0].push_back(62 - b);  // (reversed)
  for (int32_t b = 63; b < 82; ++b) tables[1].push_back(b);
  for (int32_t b = 82; b < 85; ++b) tables[2].push_back(b);
  AttnBatch a, b;  // (the same batch on the two CUDA devices)
  BuildBatch(cuda_.get(), &a, {1000, 300, 40}, {1, 1, 1}, tables);
  BuildBatch(plain, &b, {1000, 300, 40}, {1, 1, 1}, tables);
  const int64_t T = 3, n_blocks = 96;
  for (DType kv_type : {DType::kF32, DType::kF16, DType::kQ8_0}) {
    for (int hd : {64, 128}) {
      const int H = 8, KV = 2;
      kernels::KvLayerView kc, kh;
      RandomCache(kv_type, KV, hd, hd, &kc, &kh, n_blocks);
      const int64_t bytes = CacheBytes(kh, false);  // (K and V alike)
      const kernels::KvLayerView kp = CopyCache(plain, kh);
      const std::vector<float> q = Random(T * H * hd);
      for (int window : {0, 300}) {
        const kernels::AttentionParams p = AttnParams(H, hd, window);
        const std::string tag = std::string(DTypeName(kv_type)) + " hd " + std::to_string(hd) +
                                " window " + std::to_string(window);
        std::vector<float> ref(T * H * hd);
        host_->PagedAttention(q.data(), kh, a.host, p, ref.data());
        for (int i = 0; i < 2; ++i) {
          Device* d = i ? plain : cuda_.get();
          float* dq = *d->UploadFloats(q.data(), q.size());
          float* o = *d->UploadFloats(std::vector<float>(T * H * hd).data(), T * H * hd);
          for (int twice = 0; twice < 2; ++twice) {
            d->PagedAttention(dq, i ? kp : kc, i ? b.cuda : a.cuda, p, o);
            ExpectNear(d, o, ref, 1e-4, std::string(i ? "unsplit " : "split ") + tag);
          }
        }
      }
      // RoPE and the KV write inside, the output quantized for a Q8_0 o (quantized mode): the
      // cache rows stored alike, the outputs within the quantization's noise of each other.
      kernels::SetExactActivations(false);
      kernels::RopeConfig rope;
      rope.rot_dim = hd;
      rope.theta = 10000.f;
      std::vector<float> inv(hd / 2);
      kernels::ComputeRopeInvFreq(rope, inv.data());
      std::vector<std::vector<uint8_t>> keep;
      const Uploaded wo = UploadRandom(cuda_.get(), plain, DType::kQ8_0, 96, H * hd, &rng_, &keep);
      const std::vector<float> k = Random(T * KV * hd), v = Random(T * KV * hd);
      float* ys[2];
      std::vector<uint8_t> caches[2];
      for (int i = 0; i < 2; ++i) {
        Device* d = i ? plain : cuda_.get();
        const kernels::KvLayerView& kv = i ? kp : kc;
        float* Q = UploadTo(d, q);
        float* K = UploadTo(d, k);
        float* V = UploadTo(d, v);
        float* F = UploadTo(d, inv);
        float* O = UploadTo(d, std::vector<float>(T * H * hd));
        float* Y = UploadTo(d, std::vector<float>(T * 96));
        const Device::RopeKv r{{Q, H, hd, H * hd}, {K, KV, hd, KV * hd}, &rope, F, K, V, {}, {}};
        const kernels::AttentionParams p = AttnParams(H, hd);
        d->AttentionMatMuls(Q, kv, i ? b.cuda : a.cuda, p, O,
                            {{i ? &wo.host : &wo.cuda, Y, nullptr, true}}, &r);
        ASSERT_TRUE(d->Synchronize().ok());
        ys[i] = Y;
        caches[i].resize(2 * bytes);
        ASSERT_TRUE(d->CopyToHost(caches[i].data(), kv.k, bytes).ok());
        ASSERT_TRUE(d->CopyToHost(caches[i].data() + bytes, kv.v, bytes).ok());
      }
      kernels::SetExactActivations(true);
      EXPECT_TRUE(caches[0] == caches[1]) << "the cache rows stored inside the attention";
      std::vector<float> y_unsplit(T * 96);
      ASSERT_TRUE(plain->CopyToHost(y_unsplit.data(), ys[1], T * 96 * 4).ok());
      ExpectNear(cuda_.get(), ys[0], y_unsplit, 3e-3,
                 "o after split / unsplit " + std::string(DTypeName(kv_type)) + " hd " +
                     std::to_string(hd));
    }
    // MLA: the latent rows (key = row, value = its first r values), 16 heads.
    const kernels::MlaParams p = LiteMla();
    const int64_t H = p.n_heads, r = p.kv_lora_rank, row = r + p.d_rope;
    kernels::KvLayerView kc, kh;
    RandomCache(kv_type, 1, static_cast<int>(row), 0, &kc, &kh, n_blocks);
    const kernels::KvLayerView kp = CopyCache(plain, kh);
    const std::vector<float> qa = Random(T * H * row);
    std::vector<float> ref(T * H * r);
    host_->MlaAttention(qa.data(), kh, a.host, p, ref.data());
    for (int i = 0; i < 2; ++i) {
      Device* d = i ? plain : cuda_.get();
      float* o = *d->UploadFloats(std::vector<float>(T * H * r).data(), T * H * r);
      d->MlaAttention(*d->UploadFloats(qa.data(), qa.size()), i ? kp : kc, i ? b.cuda : a.cuda, p,
                      o);
      ExpectNear(d, o, ref, 1e-4,
                 std::string(i ? "unsplit MLA " : "split MLA ") + DTypeName(kv_type));
    }
  }
}

}  // namespace
}  // namespace peng::cuda_test
