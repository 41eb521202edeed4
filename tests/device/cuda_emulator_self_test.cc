// The CUDA emulator itself (src/backend/cuda/emulator.h): that it runs kernels as CUDA would
// -- every thread, barriers, shuffles, graph capture -- and that it reports the misuses it is
// there to find instead of passing them: a shuffle after lanes have returned, a deadlock
// between __syncthreads and a warp's barrier, launches beyond the hardware's limits,
// allocations and host copies inside a captured graph.
#define PENG_CUDA_EMULATOR 1
#include "backend/cuda/runtime.h"

#include <gtest/gtest.h>

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

TEST(CudaEmulator, FindsMisuse) {
  float* d = nullptr;
  ASSERT_EQ(cudaMalloc(reinterpret_cast<void**>(&d), 1024 * 4), cudaSuccess);
  Launch(EarlyReturnShuffleKernel, 1, 32, nullptr, d);
  EXPECT_EQ(cudaGetLastError(), cudaErrorLaunchFailure) << "shuffle after lanes returned";
  Launch(DeadlockKernel, 1, 32, nullptr, d);
  EXPECT_EQ(cudaGetLastError(), cudaErrorLaunchFailure) << "deadlock";
  Launch(AddKernel, 1, 1025, nullptr, d, 1.f);
  EXPECT_EQ(cudaGetLastError(), cudaErrorInvalidConfiguration) << "1025 threads a block";
  Launch(AddKernel, dim3(1, 65536), 32, nullptr, d, 1.f);
  EXPECT_EQ(cudaGetLastError(), cudaErrorInvalidConfiguration) << "grid.y 65536";
  EXPECT_EQ(cudaGetLastError(), cudaSuccess) << "the error is read once";
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
