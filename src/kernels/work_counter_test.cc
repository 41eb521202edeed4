// The kernels' work counts (work_counter.h) on known workloads, computed independently from
// the shapes, and the machine-peak probes (probe.h): every ISA's loops agree with the scalar
// reference on what they compute.
#include <cstdlib>
#include <cstring>
#include <memory>
#include <random>
#include <vector>

#include <gtest/gtest.h>

#include "kernels/cpu/probe_simd.h"
#include "kernels/isa.h"
#include "kernels/mla.h"
#include "kernels/ops.h"
#include "kernels/probe.h"
#include "kernels/test_util.h"
#include "kernels/work_counter.h"

namespace peng::kernels {
namespace {

using test_util::View;

TEST(WorkCounter, MatMulCountsTheWeightBytesOnceAndTwoOpsPerMultiplyAdd) {
  ThreadPool pool(2);
  const int64_t rows = 96, cols = 256, n_tokens = 5;
  for (DType t : {DType::kQ4_0, DType::kQ8_0, DType::kQ4_K, DType::kF16, DType::kF32}) {
    std::vector<uint8_t> w(RowBytes(t, cols) * rows, 0);  // zero scales: finite, fine
    std::vector<float> x(cols * n_tokens, 1.f), y(rows * n_tokens);
    const WorkCounts before = ThreadWork();
    MatMul(View(t, rows, cols, w), x.data(), n_tokens, y.data(), &pool);
    const WorkCounts d = ThreadWork() - before;
    EXPECT_EQ(d.weight_bytes, static_cast<int64_t>(w.size())) << DTypeName(t);
    const bool quant = t != DType::kF16 && t != DType::kF32;
    EXPECT_EQ(quant ? d.ops_int8 : d.flops_f32, 2 * rows * cols * n_tokens) << DTypeName(t);
    EXPECT_EQ(quant ? d.flops_f32 : d.ops_int8, 0) << DTypeName(t);
    EXPECT_EQ(d.kv_bytes, 0);
  }
}

TEST(WorkCounter, PagedAttentionCountsEachVisiblePositionOnce) {
  const int bs = 4, kvh = 2, hd = 8, heads = 4;
  const int64_t blocks = 4;
  std::vector<uint16_t> k(blocks * bs * kvh * hd, 0), v(k.size(), 0);
  KvLayerView kv;
  kv.k = k.data();
  kv.v = v.data();
  kv.dtype = DType::kF16;
  kv.num_blocks = blocks;
  kv.block_size = bs;
  kv.n_kv_heads = kvh;
  kv.head_dim = hd;
  kv.v_head_dim = hd;
  const int32_t table[4] = {0, 1, 2, 3};
  AttentionParams p;
  p.n_heads = heads;
  p.scale = 0.5f;
  const int64_t n_q = 3, pos0 = 5;  // queries at 5, 6, 7 see 6, 7, 8 keys
  std::vector<float> q(n_q * heads * hd, 0.1f), out(n_q * heads * hd);
  WorkCounts before = ThreadWork();
  PagedAttention(q.data(), n_q, pos0, kv, table, p, out.data(), nullptr);
  WorkCounts d = ThreadWork() - before;
  EXPECT_EQ(d.kv_bytes, 8 * kvh * (hd + hd) * 2);              // positions 0..7, F16 K and V
  EXPECT_EQ(d.flops_f32, (6 + 7 + 8) * heads * 2 * (hd + hd));  // dot + axpy per (query, key)
  EXPECT_EQ(d.weight_bytes, 0);
  p.sliding_window = 4;  // each query sees its last 4 keys: positions 2..7 are read
  before = ThreadWork();
  PagedAttention(q.data(), n_q, pos0, kv, table, p, out.data(), nullptr);
  d = ThreadWork() - before;
  EXPECT_EQ(d.kv_bytes, 6 * kvh * (hd + hd) * 2);
  EXPECT_EQ(d.flops_f32, 3 * 4 * heads * 2 * (hd + hd));
}

TEST(WorkCounter, WorkCaptureMovesPoolTaskCountsToTheCaller) {
  ThreadPool pool(2);
  const int64_t rows = 32, cols = 64;
  std::vector<uint8_t> w(RowBytes(DType::kF32, cols) * rows, 0);
  std::vector<float> x(cols, 1.f);
  std::vector<std::vector<float>> y(2, std::vector<float>(rows));
  std::vector<WorkCounts> work(2);
  const WorkCounts before = ThreadWork();
  pool.Run([&](int ti, int) {
    WorkCapture capture;
    MatMul(View(DType::kF32, rows, cols, w), x.data(), 1, y[ti].data(), nullptr);
    work[ti] = capture.Take();
  });
  for (const WorkCounts& wc : work) ThreadWork() += wc;
  const WorkCounts d = ThreadWork() - before;
  EXPECT_EQ(d.weight_bytes, 2 * static_cast<int64_t>(w.size()));  // not 3x, whoever ran task 0
  EXPECT_EQ(d.flops_f32, 2 * 2 * rows * cols);
}

// Every ISA's probe loops compute what the scalar reference computes.
TEST(Probe, SimdLoopsAgreeWithTheReference) {
  const int64_t n = 64 * 1024;
  struct Free { void operator()(void* p) const { std::free(p); } };
  std::unique_ptr<uint8_t, Free> buf(static_cast<uint8_t*>(std::aligned_alloc(64, n)));
  std::mt19937_64 rng(7);
  for (int64_t i = 0; i < n; i += 8) {
    const uint64_t v = rng();
    std::memcpy(buf.get() + i, &v, 8);
  }
  const uint64_t want = ref::ReadSum(buf.get(), n);
  float fs;
  int32_t is;
  EXPECT_EQ(ref::FmaLoop(10, &fs), 10 * 8 * 2);
  EXPECT_EQ(ref::Int8DotLoop(10, &is), 10 * 8 * 2);
#if defined(__x86_64__)
  if (IsaSupported(Isa::kAvx2)) {
    EXPECT_EQ(avx2::ReadSum(buf.get(), n), want);
    EXPECT_EQ(avx2::FmaLoop(10, &fs), 10 * 12 * 8 * 2);
    EXPECT_EQ(avx2::Int8DotLoop(10, &is), 10 * 8 * 32 * 2);
    EXPECT_EQ(is, 8 * 8 * 10 * (4 * (3 * -2)) + 8 * 28);  // 8 lanes x 8 chains, k = 0..7
  }
  if (IsaSupported(Isa::kAvx512)) {
    EXPECT_EQ(avx512::ReadSum(buf.get(), n), want);
    EXPECT_EQ(avx512::FmaLoop(10, &fs), 10 * 12 * 16 * 2);
    EXPECT_EQ(avx512::Int8DotLoop(10, &is), 10 * 12 * 64 * 2);
    EXPECT_EQ(is, 16 * 12 * 10 * (4 * (3 * -2)) + 16 * 66);  // 16 lanes x 12 chains, k = 0..11
  }
#endif
#if defined(__aarch64__)
  if (IsaSupported(Isa::kNeon)) {
    EXPECT_EQ(neon::ReadSum(buf.get(), n), want);
    EXPECT_EQ(neon::FmaLoop(10, &fs), 10 * 12 * 4 * 2);
    EXPECT_EQ(neon::Int8DotLoop(10, &is), 10 * 12 * 16 * 2);
    EXPECT_EQ(is, 4 * 12 * 10 * (4 * (3 * -2)) + 4 * 66);  // 4 lanes x 12 chains, k = 0..11
  }
  if (IsaSupported(Isa::kNeonDot)) {
    EXPECT_EQ(dotprod::ReadSum(buf.get(), n), want);
    EXPECT_EQ(dotprod::FmaLoop(10, &fs), 10 * 12 * 4 * 2);
    EXPECT_EQ(dotprod::Int8DotLoop(10, &is), 10 * 12 * 16 * 2);
    EXPECT_EQ(is, 4 * 12 * 10 * (4 * (3 * -2)) + 4 * 66);
  }
  if (IsaSupported(Isa::kNeonI8mm)) {
    EXPECT_EQ(i8mm::ReadSum(buf.get(), n), want);
    EXPECT_EQ(i8mm::FmaLoop(10, &fs), 10 * 12 * 4 * 2);
    EXPECT_EQ(i8mm::Int8DotLoop(10, &is), 10 * 12 * 32 * 2);
    EXPECT_EQ(is, 4 * 12 * 10 * (8 * (3 * -2)) + 4 * 66);  // smmla: 8 products per lane
  }
#endif
}

TEST(Probe, PeaksArePositiveAndCachedPerProcess) {
  ThreadPool pool(2);
  const MachinePeaks a = MeasureMachinePeaks(&pool);
  EXPECT_GT(a.read_bytes_per_s, 1e8);
  EXPECT_GT(a.flops_f32_per_s, 1e8);
  EXPECT_GT(a.ops_int8_per_s, 1e8);
  const MachinePeaks b = MeasureMachinePeaks(&pool);
  EXPECT_EQ(a.read_bytes_per_s, b.read_bytes_per_s);
  EXPECT_GT(MeasureReadBandwidth(nullptr, 4 << 20, 1), 1e8);
}

}  // namespace
}  // namespace peng::kernels
