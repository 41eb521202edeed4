// The CUDA emulator itself (src/backend/cuda/emulator.h): that it runs kernels as CUDA would
// -- every thread, barriers, shuffles (and WarpButterfly's one exchange), votes, graph capture --
// and that it reports the misuses it is there to find instead of passing them: a shuffle after
// lanes have returned, a deadlock between __syncthreads and a warp's barrier, launches beyond
// the hardware's limits, vector loads not aligned to their size, allocations and host copies
// inside a captured graph.
#define PENG_CUDA_EMULATOR 1
#include "backend/cuda/runtime.h"
#include "backend/cuda/weight_layout.h"

#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstdint>
#include <numeric>
#include <vector>

namespace peng::backend::cuda {
namespace {

__global__ void IndexKernel(int* out) {
  const int i = (blockIdx.y * gridDim.x + blockIdx.x) * blockDim.x * blockDim.y +
                threadIdx.y * blockDim.x + threadIdx.x;
  out[i] = i;
}

// Block sums: a warp butterfly, then warp 0 over the warps' sums in shared memory.
__global__ void SumKernel(const float* x, float* out) {
  __shared__ float part[32];
  float v = x[blockIdx.x * blockDim.x + threadIdx.x];
  for (int o = 16; o > 0; o /= 2) v += __shfl_xor_sync(0xffffffffu, v, o);
  if (threadIdx.x % 32 == 0) part[threadIdx.x / 32] = v;
  __syncthreads();
  if (threadIdx.x == 0) {
    float s = 0.f;
    for (unsigned w = 0; w < blockDim.x / 32; ++w) s += part[w];
    out[blockIdx.x] = s;
  }
}

// Lanes 16-31 return, then lanes 0-15 shuffle with the full mask: undefined on a GPU.
__global__ void EarlyReturnShuffleKernel(float* out) {
  if (threadIdx.x >= 16) return;
  out[threadIdx.x] = __shfl_xor_sync(0xffffffffu, 1.f, 1);
}

// Lanes 0-15 wait at __syncthreads for lanes 16-31, which wait at a shuffle for lanes 0-15.
__global__ void DeadlockKernel(float* out) {
  float v = 1.f;
  if (threadIdx.x < 16) {
    __syncthreads();
  } else {
    v = __shfl_xor_sync(0xffffffffu, v, 1);
  }
  out[threadIdx.x] = v;
}

__global__ void AddKernel(float* x, float v) { x[threadIdx.x] += v; }

struct Plus {
  template <typename T>
  T operator()(T a, T b) const { return a + b; }
};
struct Max {
  float operator()(float a, float b) const { return fmaxf(a, b); }
};
// Each lane's results of three butterflies (sums over the warp and over each 16 lanes, the
// maximum) by WarpButterfly (runtime.h: one exchange in the emulator) in out[0..2] and by the
// shuffles it stands for in out[3..5].
__global__ void ButterflyKernel(const float* x, float* out) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  const float v = x[i];
  const int n = static_cast<int>(v * 8.f) % 1000;
  float* o = out + 6 * i;
  o[0] = WarpButterfly(v, Plus{});
  o[1] = static_cast<float>(WarpButterfly<8>(n, Plus{}));
  o[2] = WarpButterfly(v, Max{});
  float s = v, m = v;
  int k = n;
  for (int d = 16; d > 0; d /= 2) s += __shfl_xor_sync(0xffffffffu, s, d);
  for (int d = 8; d > 0; d /= 2) k += __shfl_xor_sync(0xffffffffu, k, d);
  for (int d = 16; d > 0; d /= 2) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, d));
  o[3] = s;
  o[4] = static_cast<float>(k);
  o[5] = m;
}

// WarpButterfly after lanes 16-31 have returned: the same misuse as a shuffle's.
__global__ void EarlyReturnButterflyKernel(float* out) {
  if (threadIdx.x >= 16) return;
  out[threadIdx.x] = WarpButterfly(1.f, Plus{});
}

// Two races: every thread reads its right neighbour's shared value with no barrier after the
// writes, and every block reads its left neighbour's output (out[0] holds 100 before the launch).
__global__ void RacingKernel(int* out, int* shared_seen) {
  __shared__ int v[64];
  v[threadIdx.x] = static_cast<int>(1000 * blockIdx.x + threadIdx.x) + 1;
  shared_seen[blockIdx.x * blockDim.x + threadIdx.x] = v[(threadIdx.x + 1) % blockDim.x];
  __syncthreads();
  if (threadIdx.x == 0) out[blockIdx.x + 1] = out[blockIdx.x] + 1;
}

// AddKernel as the backend's kernels start (runtime.h): GridWait before any memory is touched.
__global__ void WaitingAddKernel(float* x, float v) {
  GridLaunchDependents();
  GridWait();
  x[threadIdx.x] += v;
}

// One warp: D = A B + C twice over (A 16 x 16 and B 16 x 8 FP16 values as floats, C 16 x 8),
// each lane's fragments taken from the matrices by PTX's formulas for mma.m16n8k16's elements
// (A's a0..a7, B's b0..b3, C's c0..c3: two elements a register).
__global__ void MmaKernel(const float* a, const float* b, const float* c, float* out) {
  const int g = threadIdx.x / 4, t = threadIdx.x % 4;
  float e[8];
  for (int i = 0; i < 8; ++i) {
    const int row = (i < 2 || (i >= 4 && i < 6)) ? g : g + 8;
    const int col = t * 2 + (i & 1) + (i >= 4 ? 8 : 0);
    e[i] = a[row * 16 + col];
  }
  const uint32_t ra[4] = {HalfPair(e[0], e[1]), HalfPair(e[2], e[3]), HalfPair(e[4], e[5]),
                          HalfPair(e[6], e[7])};
  for (int i = 0; i < 4; ++i) e[i] = b[(t * 2 + (i & 1) + (i >= 2 ? 8 : 0)) * 8 + g];
  const uint32_t rb[2] = {HalfPair(e[0], e[1]), HalfPair(e[2], e[3])};
  float d[4];
  for (int i = 0; i < 4; ++i) d[i] = c[(i < 2 ? g : g + 8) * 8 + t * 2 + (i & 1)];
  MmaF16(d, ra, rb);
  MmaF16(d, ra, rb);
  for (int i = 0; i < 4; ++i) out[(i < 2 ? g : g + 8) * 8 + t * 2 + (i & 1)] = d[i];
}

// One warp: D = A B + C twice over for int8 A (16 x 16) and B (16 x 8), C int32, each lane's
// fragments taken by PTX's formulas for mma.m16n8k16's .s8 elements (A's a0..a7, B's b0..b3:
// four a register, the first in the low byte; C's c0..c3).
__global__ void MmaS8Kernel(const int8_t* a, const int8_t* b, const int* c, int* out) {
  const int g = threadIdx.x / 4, t = threadIdx.x % 4;
  uint32_t ra[2] = {0, 0}, rb = 0;
  for (int i = 0; i < 8; ++i) {
    const int row = i < 4 ? g : g + 8, col = t * 4 + (i & 3);
    ra[i / 4] |= uint32_t{static_cast<uint8_t>(a[row * 16 + col])} << (8 * (i & 3));
  }
  for (int i = 0; i < 4; ++i)
    rb |= uint32_t{static_cast<uint8_t>(b[(t * 4 + i) * 8 + g])} << (8 * i);
  int d[4];
  for (int i = 0; i < 4; ++i) d[i] = c[(i < 2 ? g : g + 8) * 8 + t * 2 + (i & 1)];
  MmaS8(d, ra, rb);
  MmaS8(d, ra, rb);
  for (int i = 0; i < 4; ++i) out[(i < 2 ? g : g + 8) * 8 + t * 2 + (i & 1)] = d[i];
}

TEST(CudaEmulator, EveryThreadOfEveryBlockRuns) {
  int* d = nullptr;
  ASSERT_EQ(cudaMalloc(reinterpret_cast<void**>(&d), 6 * 64 * 4), cudaSuccess);
  Launch(IndexKernel, dim3(3, 2), dim3(16, 4), nullptr, d);
  ASSERT_EQ(cudaGetLastError(), cudaSuccess);
  std::vector<int> want(6 * 64), got(6 * 64);
  std::iota(want.begin(), want.end(), 0);
  cudaMemcpyAsync(got.data(), d, got.size() * 4, cudaMemcpyDeviceToHost, nullptr);
  EXPECT_EQ(got, want);
  cudaFree(d);
}

TEST(CudaEmulator, ShufflesAndBarriers) {
  std::vector<float> x(4 * 256);
  for (size_t i = 0; i < x.size(); ++i) x[i] = static_cast<float>(i % 7) - 3.f;
  float *dx = nullptr, *dy = nullptr;
  ASSERT_EQ(cudaMalloc(reinterpret_cast<void**>(&dx), x.size() * 4), cudaSuccess);
  ASSERT_EQ(cudaMalloc(reinterpret_cast<void**>(&dy), 16), cudaSuccess);
  cudaMemcpyAsync(dx, x.data(), x.size() * 4, cudaMemcpyHostToDevice, nullptr);
  Launch(SumKernel, 4, 256, nullptr, dx, dy);
  ASSERT_EQ(cudaGetLastError(), cudaSuccess);
  float y[4];
  cudaMemcpyAsync(y, dy, 16, cudaMemcpyDeviceToHost, nullptr);
  for (int b = 0; b < 4; ++b)
    EXPECT_EQ(y[b], std::accumulate(x.begin() + 256 * b, x.begin() + 256 * (b + 1), 0.f)) << b;
  cudaFree(dx);
  cudaFree(dy);
}

// The emulator's WarpButterfly (one exchange, the rounds computed by the last lane) gives every
// lane the same bits as the shuffles, in both orders, on values whose float sum depends on the
// order of the additions.
TEST(CudaEmulator, ButterflyInOneExchangeEqualsTheShuffles) {
  std::vector<float> x(2 * 64);
  for (size_t i = 0; i < x.size(); ++i)
    x[i] = std::ldexp(static_cast<float>(i % 5) + 0.1f * static_cast<float>(i % 3),
                      static_cast<int>(i * 7 % 41) - 20) * (i % 2 ? -1.f : 1.f);
  // The first warp: 1e8, fifteen 1s, -1e8, ...: added in lane order, the 1s are lost.
  x[0] = 1e8f;
  for (int l = 1; l < 16; ++l) x[l] = 1.f;
  x[16] = -1e8f;
  float *dx = nullptr, *dout = nullptr;
  ASSERT_EQ(cudaMalloc(reinterpret_cast<void**>(&dx), x.size() * 4), cudaSuccess);
  ASSERT_EQ(cudaMalloc(reinterpret_cast<void**>(&dout), 6 * x.size() * 4), cudaSuccess);
  cudaMemcpyAsync(dx, x.data(), x.size() * 4, cudaMemcpyHostToDevice, nullptr);
  for (const bool reversed : {false, true}) {
    emu::SetReversedOrder(reversed);
    Launch(ButterflyKernel, 2, 64, nullptr, dx, dout);
    ASSERT_EQ(cudaGetLastError(), cudaSuccess);
    std::vector<float> out(6 * x.size());
    cudaMemcpyAsync(out.data(), dout, out.size() * 4, cudaMemcpyDeviceToHost, nullptr);
    for (size_t i = 0; i < x.size(); ++i) {
      for (int k = 0; k < 3; ++k) {
        EXPECT_EQ(std::bit_cast<uint32_t>(out[6 * i + k]),
                  std::bit_cast<uint32_t>(out[6 * i + 3 + k]))
            << "lane " << i << ", result " << k << (reversed ? ", reversed" : "");
      }
    }
    // (the order matters for these values: the first warp's sum in lane order is another)
    float plain = 0.f;
    for (int l = 0; l < 32; ++l) plain += x[l];
    EXPECT_NE(out[0], plain);
  }
  emu::SetReversedOrder(false);
  cudaFree(dx);
  cudaFree(dout);
}

// Each lane's votes: the lanes whose value equals its own, the lanes whose predicate holds, and
// the first of each (__match_any_sync, __ballot_sync, __ffs, __popc).
__global__ void VoteKernel(const int* v, unsigned* out) {
  const int t = blockIdx.x * blockDim.x + threadIdx.x;
  const unsigned same = __match_any_sync(0xffffffffu, v[t]);
  const unsigned odd = __ballot_sync(0xffffffffu, v[t] % 2);
  out[4 * t] = same;
  out[4 * t + 1] = odd;
  out[4 * t + 2] = static_cast<unsigned>(__ffs(static_cast<int>(same)));
  out[4 * t + 3] = static_cast<unsigned>(__popc(same));
}

TEST(CudaEmulator, VotesOfAWarp) {
  std::vector<int> v(64);
  for (int t = 0; t < 64; ++t) v[t] = (t * 7 + t / 32) % 5;  // (the second warp: other values)
  int* dv = nullptr;
  unsigned* dout = nullptr;
  ASSERT_EQ(cudaMalloc(reinterpret_cast<void**>(&dv), v.size() * 4), cudaSuccess);
  ASSERT_EQ(cudaMalloc(reinterpret_cast<void**>(&dout), 4 * v.size() * 4), cudaSuccess);
  cudaMemcpyAsync(dv, v.data(), v.size() * 4, cudaMemcpyHostToDevice, nullptr);
  Launch(VoteKernel, 2, 32, nullptr, dv, dout);
  ASSERT_EQ(cudaGetLastError(), cudaSuccess);
  std::vector<unsigned> out(4 * v.size());
  cudaMemcpyAsync(out.data(), dout, out.size() * 4, cudaMemcpyDeviceToHost, nullptr);
  for (int t = 0; t < 64; ++t) {
    const int w = t / 32 * 32;
    unsigned same = 0, odd = 0;
    for (int l = 0; l < 32; ++l) {
      same |= static_cast<unsigned>(v[w + l] == v[t]) << l;
      odd |= static_cast<unsigned>(v[w + l] % 2) << l;
    }
    EXPECT_EQ(out[4 * t], same) << t;
    EXPECT_EQ(out[4 * t + 1], odd) << t;
    EXPECT_EQ(out[4 * t + 2], static_cast<unsigned>(std::countr_zero(same) + 1)) << t;
    EXPECT_EQ(out[4 * t + 3], static_cast<unsigned>(std::popcount(same))) << t;
  }
  cudaFree(dv);
  cudaFree(dout);
}

// The emulator's tensor-core product (runtime.h, MmaF16: the tiles gathered from the lanes'
// fragments by the last lane to arrive) against the product of the matrices, in both orders.
TEST(CudaEmulator, TensorCoreProductOfFragments) {
  std::vector<float> a(16 * 16), b(16 * 8), c(16 * 8);
  for (size_t i = 0; i < a.size(); ++i) a[i] = F16ToF32(F32ToF16(std::sin(1.3f * i) * 3.f));
  for (size_t i = 0; i < b.size(); ++i) b[i] = F16ToF32(F32ToF16(std::cos(0.7f * i + 0.2f)));
  for (size_t i = 0; i < c.size(); ++i) c[i] = static_cast<float>(i % 11) - 5.f;
  float* d[4];
  for (size_t k = 0; k < 4; ++k)
    ASSERT_EQ(cudaMalloc(reinterpret_cast<void**>(&d[k]), 16 * 16 * 4), cudaSuccess);
  cudaMemcpyAsync(d[0], a.data(), a.size() * 4, cudaMemcpyHostToDevice, nullptr);
  cudaMemcpyAsync(d[1], b.data(), b.size() * 4, cudaMemcpyHostToDevice, nullptr);
  cudaMemcpyAsync(d[2], c.data(), c.size() * 4, cudaMemcpyHostToDevice, nullptr);
  for (const bool reversed : {false, true}) {
    emu::SetReversedOrder(reversed);
    Launch(MmaKernel, 1, 32, nullptr, d[0], d[1], d[2], d[3]);
    ASSERT_EQ(cudaGetLastError(), cudaSuccess);
    std::vector<float> got(16 * 8);
    cudaMemcpyAsync(got.data(), d[3], got.size() * 4, cudaMemcpyDeviceToHost, nullptr);
    for (int i = 0; i < 16; ++i) {
      for (int j = 0; j < 8; ++j) {
        double want = c[i * 8 + j];
        for (int k = 0; k < 16; ++k) want += 2.0 * a[i * 16 + k] * b[k * 8 + j];
        EXPECT_NEAR(got[i * 8 + j], want, 1e-4) << i << ", " << j;
      }
    }
  }
  emu::SetReversedOrder(false);
  for (float* p : d) cudaFree(p);
}

// The int8 product (runtime.h, MmaS8) against the product of the matrices: exact, the extreme
// values included.
TEST(CudaEmulator, Int8TensorCoreProductOfFragments) {
  std::vector<int8_t> a(16 * 16), b(16 * 8);
  std::vector<int> c(16 * 8);
  for (size_t i = 0; i < a.size(); ++i) a[i] = static_cast<int8_t>((i * 37 + 11) % 256 - 128);
  for (size_t i = 0; i < b.size(); ++i) b[i] = static_cast<int8_t>((i * 53 + 7) % 256 - 128);
  a[0] = b[0] = -128;
  for (size_t i = 0; i < c.size(); ++i) c[i] = static_cast<int>(i * 1000) - 60000;
  int8_t *da = nullptr, *db = nullptr;
  int *dc = nullptr, *dout = nullptr;
  ASSERT_EQ(cudaMalloc(reinterpret_cast<void**>(&da), a.size()), cudaSuccess);
  ASSERT_EQ(cudaMalloc(reinterpret_cast<void**>(&db), b.size()), cudaSuccess);
  ASSERT_EQ(cudaMalloc(reinterpret_cast<void**>(&dc), c.size() * 4), cudaSuccess);
  ASSERT_EQ(cudaMalloc(reinterpret_cast<void**>(&dout), c.size() * 4), cudaSuccess);
  cudaMemcpyAsync(da, a.data(), a.size(), cudaMemcpyHostToDevice, nullptr);
  cudaMemcpyAsync(db, b.data(), b.size(), cudaMemcpyHostToDevice, nullptr);
  cudaMemcpyAsync(dc, c.data(), c.size() * 4, cudaMemcpyHostToDevice, nullptr);
  for (const bool reversed : {false, true}) {
    emu::SetReversedOrder(reversed);
    Launch(MmaS8Kernel, 1, 32, nullptr, da, db, dc, dout);
    ASSERT_EQ(cudaGetLastError(), cudaSuccess);
    std::vector<int> got(16 * 8);
    cudaMemcpyAsync(got.data(), dout, got.size() * 4, cudaMemcpyDeviceToHost, nullptr);
    for (int i = 0; i < 16; ++i) {
      for (int j = 0; j < 8; ++j) {
        int want = c[i * 8 + j];
        for (int k = 0; k < 16; ++k) want += 2 * a[i * 16 + k] * b[k * 8 + j];
        EXPECT_EQ(got[i * 8 + j], want) << i << ", " << j;
      }
    }
  }
  emu::SetReversedOrder(false);
  cudaFree(da);
  cudaFree(db);
  cudaFree(dc);
  cudaFree(dout);
}

// Each order reads what the other does not, so a result that depends on the order shows in one
// of the two runs: cuda_emulator_test runs the backend's kernels in both.
TEST(CudaEmulator, RacesGiveDifferentResultsInTheTwoOrders) {
  int *out = nullptr, *seen = nullptr;
  ASSERT_EQ(cudaMalloc(reinterpret_cast<void**>(&out), 4 * 4), cudaSuccess);
  ASSERT_EQ(cudaMalloc(reinterpret_cast<void**>(&seen), 3 * 64 * 4), cudaSuccess);
  auto run = [&](bool reversed) {
    emu::SetReversedOrder(reversed);
    const std::vector<int> init{100, 0, 0, 0};
    cudaMemcpyAsync(out, init.data(), 16, cudaMemcpyHostToDevice, nullptr);
    cudaMemsetAsync(seen, 0, 3 * 64 * 4, nullptr);
    Launch(RacingKernel, 3, 64, nullptr, out, seen);
    EXPECT_EQ(cudaGetLastError(), cudaSuccess);
    std::vector<int> o(4), sh(3 * 64);
    cudaMemcpyAsync(o.data(), out, 16, cudaMemcpyDeviceToHost, nullptr);
    cudaMemcpyAsync(sh.data(), seen, sh.size() * 4, cudaMemcpyDeviceToHost, nullptr);
    return std::pair{o, sh};
  };
  const auto [fwd_out, fwd_seen] = run(false);
  const auto [rev_out, rev_seen] = run(true);
  emu::SetReversedOrder(false);
  // First to last: each block sees its left neighbour's result; last to first: not yet written.
  EXPECT_EQ(fwd_out, (std::vector<int>{100, 101, 102, 103}));
  EXPECT_EQ(rev_out, (std::vector<int>{100, 101, 1, 1}));
  // Thread t of block b reads v[t + 1], 1000 b + t + 2 once its neighbour has run: in this
  // block when the turn passes downwards, else what the block before it left in shared memory
  // (which the emulator keeps, as a GPU may). Thread 63 reads v[0] the other way round.
  for (int b = 0; b < 3; ++b) {
    for (int t = 0; t < 63; ++t) {
      EXPECT_EQ(rev_seen[b * 64 + t], 1000 * b + t + 2) << b << " " << t;
      EXPECT_NE(fwd_seen[b * 64 + t], 1000 * b + t + 2) << b << " " << t;
    }
    EXPECT_EQ(fwd_seen[b * 64 + 63], 1000 * b + 1) << b;
  }
  EXPECT_EQ(rev_seen[0 * 64 + 63], 1001);  // block 1's, which ran before block 0
  EXPECT_EQ(rev_seen[1 * 64 + 63], 2001);
  cudaFree(out);
  cudaFree(seen);
}

// Thread 0 reads 16 bytes at `offset` bytes past x -- a float4 (LoadVector), or four words of
// the weight layout (layout::Load16) -- and stores their first 4.
__global__ void VectorLoadKernel(const float* x, int offset, bool layout_load, float* out) {
  if (threadIdx.x != 0) return;
  const auto* b = reinterpret_cast<const uint8_t*>(x) + offset;
  if (layout_load) {
    uint32_t w[4];
    layout::Load16(b, w);
    std::memcpy(out, w, 4);
  } else {
    out[0] = LoadVector<float4>(b).x;
  }
}

TEST(CudaEmulator, FindsMisuse) {
  float* d = nullptr;
  ASSERT_EQ(cudaMalloc(reinterpret_cast<void**>(&d), 1024 * 4), cudaSuccess);
  Launch(EarlyReturnShuffleKernel, 1, 32, nullptr, d);
  EXPECT_EQ(cudaGetLastError(), cudaErrorLaunchFailure) << "shuffle after lanes returned";
  Launch(EarlyReturnButterflyKernel, 1, 32, nullptr, d);
  EXPECT_EQ(cudaGetLastError(), cudaErrorLaunchFailure) << "butterfly after lanes returned";
  Launch(DeadlockKernel, 1, 32, nullptr, d);
  EXPECT_EQ(cudaGetLastError(), cudaErrorLaunchFailure) << "deadlock";
  Launch(AddKernel, 1, 1025, nullptr, d, 1.f);
  EXPECT_EQ(cudaGetLastError(), cudaErrorInvalidConfiguration) << "1025 threads a block";
  Launch(AddKernel, dim3(1, 65536), 32, nullptr, d, 1.f);
  EXPECT_EQ(cudaGetLastError(), cudaErrorInvalidConfiguration) << "grid.y 65536";
  EXPECT_EQ(cudaGetLastError(), cudaSuccess) << "the error is read once";
  for (bool layout_load : {false, true}) {
    Launch(VectorLoadKernel, 1, 32, nullptr, d, 16, layout_load, d + 512);
    EXPECT_EQ(cudaGetLastError(), cudaSuccess) << "16 bytes at 16, " << layout_load;
    for (int offset : {4, 8}) {
      Launch(VectorLoadKernel, 1, 32, nullptr, d, offset, layout_load, d + 512);
      EXPECT_EQ(cudaGetLastError(), cudaErrorLaunchFailure)
          << "16 bytes at " << offset << ", " << layout_load;
    }
  }
  // (Host code reading the weight layout is not checked.)
  const uint32_t words[8] = {1, 2, 3, 4, 5};
  uint32_t w[4];
  layout::Load16(reinterpret_cast<const uint8_t*>(words) + 4, w);
  EXPECT_EQ(w[0], 2u);
  EXPECT_EQ(cudaGetLastError(), cudaSuccess);
  // The emulator goes on after a finding.
  Launch(AddKernel, 1, 32, nullptr, d, 1.f);
  EXPECT_EQ(cudaGetLastError(), cudaSuccess);
  cudaFree(d);
}

// Under programmatic dependent launch a kernel may start before the one before it ends: every
// thread must pass GridWait (runtime.h), and one that returns without it is reported. Launches
// are counted where the stream says so, and every kernel run (replays too) by KernelsRun.
TEST(CudaEmulator, ProgrammaticDependentLaunchAndCounts) {
  float* d = nullptr;
  ASSERT_EQ(cudaMalloc(reinterpret_cast<void**>(&d), 32 * 4), cudaSuccess);
  ASSERT_EQ(cudaMemsetAsync(d, 0, 32 * 4, nullptr), cudaSuccess);
  int64_t launches = 0;
  const LaunchStream pdl(nullptr, true, &launches);
  const uint64_t run0 = emu::KernelsRun();
  Launch(WaitingAddKernel, 1, 32, pdl, d, 1.f);
  EXPECT_EQ(cudaGetLastError(), cudaSuccess);
  float h[32];
  cudaMemcpyAsync(h, d, 128, cudaMemcpyDeviceToHost, nullptr);
  EXPECT_EQ(h[31], 1.f);
  Launch(AddKernel, 1, 32, pdl, d, 1.f);
  EXPECT_EQ(cudaGetLastError(), cudaErrorLaunchFailure) << "a thread without GridWait";
  Launch(AddKernel, 1, 32, nullptr, d, 1.f);  // (without pdl nothing needs to wait)
  EXPECT_EQ(cudaGetLastError(), cudaSuccess);
  EXPECT_EQ(launches, 2);
  EXPECT_EQ(emu::KernelsRun() - run0, 3u);
  cudaFree(d);
}

// A captured graph replays its launches with the arguments they had when captured, and no
// allocation or copy to the host may happen while capturing.
TEST(CudaEmulator, GraphCapture) {
  cudaStream_t s = nullptr;
  ASSERT_EQ(cudaStreamCreate(&s), cudaSuccess);
  float* d = nullptr;
  ASSERT_EQ(cudaMalloc(reinterpret_cast<void**>(&d), 32 * 4), cudaSuccess);
  ASSERT_EQ(cudaMemsetAsync(d, 0, 32 * 4, s), cudaSuccess);
  ASSERT_EQ(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal), cudaSuccess);
  float v = 2.f;
  Launch(AddKernel, 1, 32, s, d, v);
  v = 100.f;  // (not seen by the recording)
  void* p = nullptr;
  EXPECT_EQ(cudaMalloc(&p, 16), cudaErrorStreamCaptureUnsupported);
  EXPECT_EQ(cudaGetLastError(), cudaErrorStreamCaptureUnsupported);
  cudaGraph_t g = nullptr;
  ASSERT_EQ(cudaStreamEndCapture(s, &g), cudaSuccess);
  cudaGraphExec_t exec = nullptr;
  ASSERT_EQ(cudaGraphInstantiate(&exec, g, 0), cudaSuccess);
  float h[32];
  cudaMemcpyAsync(h, d, 128, cudaMemcpyDeviceToHost, s);
  EXPECT_EQ(h[5], 0.f) << "captured work does not run while capturing";
  cudaGraphLaunch(exec, s);
  cudaGraphLaunch(exec, s);
  cudaMemcpyAsync(h, d, 128, cudaMemcpyDeviceToHost, s);
  EXPECT_EQ(h[5], 4.f);
  // A copy to the host invalidates the capture.
  ASSERT_EQ(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal), cudaSuccess);
  EXPECT_EQ(cudaMemcpyAsync(h, d, 128, cudaMemcpyDeviceToHost, s),
            cudaErrorStreamCaptureUnsupported);
  cudaGraph_t bad = nullptr;
  EXPECT_EQ(cudaStreamEndCapture(s, &bad), cudaErrorStreamCaptureInvalidated);
  EXPECT_EQ(cudaGetLastError(), cudaErrorStreamCaptureUnsupported);
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(g);
  cudaFree(d);
  cudaStreamDestroy(s);
}

}  // namespace
}  // namespace peng::backend::cuda
