// The CUDA emulator: the part of CUDA that the CUDA backend uses (runtime calls, streams, graph
// capture, FP16, warp shuffles and votes, barriers, cublasGemmEx), implemented on the CPU, so
// that the backend's own sources -- compiled as C++ by cuda_device_emulated.cc -- run in CI on
// machines without a GPU and are checked against the host device by cuda_device_test
// (tests: cuda_emulator_test, device "cuda-emu").
//
// What it checks: the kernels' index arithmetic (lanes, warps, blocks, row splits, token
// tiles), launch configurations against the hardware's limits, barrier and shuffle usage (every
// lane of a warp at a full-mask shuffle or vote, no lane leaving while its warp waits, no
// deadlock between __syncthreads and a warp's barrier), vector loads aligned to their size
// (LoadVector, the weight layout's loads), allocations during graph capture, and what a
// replayed graph reads (the arguments as captured), and races between blocks or between threads
// outside barriers where the two orders it runs in (SetReversedOrder) give different results.
// Built with AddressSanitizer (scripts/sanitize.sh), accesses past a device allocation too.
// What it does not: timing, memory coalescing, races that give the same result in both
// orders, and the code under __CUDA_ARCH__ (weight_layout.h's device-only branches: the
// emulator runs their host twins, which weight_layout_test checks against the CPU kernels).
//
// Model: a launch runs its blocks one after another on the calling thread; a block's threads
// are coroutines (their own stacks) switched at barriers, one at a time: __syncthreads waits
// for every thread of the block that has not returned, a shuffle or __syncwarp for the warp's.
// Work on a stream runs at once, except between cudaStreamBeginCapture and
// cudaStreamEndCapture, when it is recorded (arguments by value) and runs at each
// cudaGraphLaunch.
// Cost: a switch is mostly the wait for the next thread's stack, cold after the block's other
// threads ran (stacks are staggered across cache sets, and the next one prefetched); a shuffle
// is a switch a lane, so the backend's xor-butterfly reductions (runtime.h, WarpButterfly) take
// one exchange here, the last lane computing every lane's rounds as the shuffles would.
#pragma once

#include <bit>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <functional>
#include <string>
#include <tuple>
#include <type_traits>
#include <utility>

#include "core/half.h"

#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __launch_bounds__(...)
#define __shared__ static thread_local  // a block's threads share the OS thread that runs them

namespace peng::backend::cuda {

// ---- vector and FP16 types
struct dim3 {
  unsigned x, y, z;
  constexpr dim3(unsigned x_ = 1, unsigned y_ = 1, unsigned z_ = 1) : x(x_), y(y_), z(z_) {}
};
struct uint3 {
  unsigned x, y, z;
};
struct alignas(8) int2 {
  int x, y;
};
struct alignas(8) float2 {
  float x, y;
};
struct alignas(16) float4 {
  float x, y, z, w;
};
struct alignas(16) uint4 {
  unsigned x, y, z, w;
};
struct __half {
  uint16_t bits;
};
struct alignas(4) __half2 {
  __half x, y;
};
inline float __half2float(__half h) { return F16ToF32(h.bits); }
inline __half __float2half_rn(float f) { return {F32ToF16(f)}; }
inline __half __ushort_as_half(unsigned short b) { return {b}; }
inline unsigned short __half_as_ushort(__half h) { return h.bits; }
inline float2 __half22float2(__half2 h) { return {__half2float(h.x), __half2float(h.y)}; }
// IEEE operations rounded to nearest, never fused (the host build has no FMA contraction).
inline float __fadd_rn(float a, float b) { return a + b; }
inline float __fsub_rn(float a, float b) { return a - b; }
inline float __fmul_rn(float a, float b) { return a * b; }
inline float __fdiv_rn(float a, float b) { return a / b; }
inline float __uint_as_float(unsigned u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

// ---- the runtime
enum cudaError_t {
  cudaSuccess = 0,
  cudaErrorInvalidValue = 1,
  cudaErrorMemoryAllocation = 2,
  cudaErrorInvalidConfiguration = 9,
  cudaErrorInvalidDevice = 101,
  cudaErrorECCUncorrectable = 214,
  cudaErrorIllegalAddress = 700,  // (PENG_EMULATOR_FAULT: emulator.cc)
  cudaErrorLaunchTimeout = 702,
  cudaErrorAssert = 710,
  cudaErrorHardwareStackError = 714,
  cudaErrorIllegalInstruction = 715,
  cudaErrorMisalignedAddress = 716,
  cudaErrorInvalidAddressSpace = 717,
  cudaErrorInvalidPc = 718,
  cudaErrorLaunchFailure = 719,
  cudaErrorStreamCaptureUnsupported = 900,
  cudaErrorStreamCaptureInvalidated = 901,
};
enum cudaMemcpyKind {
  cudaMemcpyHostToHost,
  cudaMemcpyHostToDevice,
  cudaMemcpyDeviceToHost,
  cudaMemcpyDeviceToDevice
};
enum cudaStreamCaptureMode { cudaStreamCaptureModeGlobal, cudaStreamCaptureModeThreadLocal };
constexpr unsigned cudaStreamNonBlocking = 1;

struct cudaDeviceProp {
  char name[256];
  size_t totalGlobalMem;
  int multiProcessorCount;
  int major, minor;
};

namespace emu {
struct Stream;
struct Graph;
struct Event;
}  // namespace emu
using cudaStream_t = emu::Stream*;
using cudaGraph_t = emu::Graph*;
using cudaGraphExec_t = emu::Graph*;
using cudaEvent_t = emu::Event*;

const char* cudaGetErrorString(cudaError_t e);
cudaError_t cudaGetLastError();
cudaError_t cudaGetDeviceCount(int* n);
cudaError_t cudaSetDevice(int i);
cudaError_t cudaGetDeviceProperties(cudaDeviceProp* p, int i);
cudaError_t cudaMemGetInfo(size_t* free, size_t* total);
cudaError_t cudaMalloc(void** p, size_t bytes);
cudaError_t cudaFree(void* p);
cudaError_t cudaMallocHost(void** p, size_t bytes);
cudaError_t cudaFreeHost(void* p);
cudaError_t cudaMemcpyAsync(void* dst, const void* src, size_t bytes, cudaMemcpyKind kind,
                            cudaStream_t s);
cudaError_t cudaMemsetAsync(void* dst, int value, size_t bytes, cudaStream_t s);
cudaError_t cudaStreamCreate(cudaStream_t* s);
cudaError_t cudaStreamCreateWithFlags(cudaStream_t* s, unsigned flags);
cudaError_t cudaStreamDestroy(cudaStream_t s);
cudaError_t cudaStreamSynchronize(cudaStream_t s);
cudaError_t cudaStreamBeginCapture(cudaStream_t s, cudaStreamCaptureMode mode);
cudaError_t cudaStreamEndCapture(cudaStream_t s, cudaGraph_t* g);
cudaError_t cudaGraphInstantiate(cudaGraphExec_t* exec, cudaGraph_t g, unsigned long long flags);
cudaError_t cudaGraphDestroy(cudaGraph_t g);
cudaError_t cudaGraphExecDestroy(cudaGraphExec_t g);
cudaError_t cudaGraphLaunch(cudaGraphExec_t g, cudaStream_t s);
cudaError_t cudaEventCreate(cudaEvent_t* e);
cudaError_t cudaEventDestroy(cudaEvent_t e);
cudaError_t cudaEventRecord(cudaEvent_t e, cudaStream_t s);
cudaError_t cudaEventSynchronize(cudaEvent_t e);
cudaError_t cudaEventElapsedTime(float* ms, cudaEvent_t a, cudaEvent_t b);

// ---- cuBLAS: cublasGemmEx (and strided batches of it) over FP16 / FP32 column-major matrices,
// FP32 results
using cublasHandle_t = emu::Stream**;  // (the stream it runs on)
enum cublasStatus_t {
  CUBLAS_STATUS_SUCCESS = 0,
  CUBLAS_STATUS_INVALID_VALUE = 7,
  CUBLAS_STATUS_NOT_SUPPORTED = 15
};
enum cublasOperation_t { CUBLAS_OP_N, CUBLAS_OP_T };
enum cudaDataType { CUDA_R_32F, CUDA_R_16F, CUDA_R_16BF };
enum cublasComputeType_t { CUBLAS_COMPUTE_32F };
enum cublasGemmAlgo_t { CUBLAS_GEMM_DEFAULT = -1 };
cublasStatus_t cublasCreate(cublasHandle_t* h);
cublasStatus_t cublasDestroy(cublasHandle_t h);
cublasStatus_t cublasSetStream(cublasHandle_t h, cudaStream_t s);
cublasStatus_t cublasGemmEx(cublasHandle_t h, cublasOperation_t op_a, cublasOperation_t op_b, int m,
                            int n, int k, const void* alpha, const void* a, cudaDataType type_a,
                            int lda, const void* b, cudaDataType type_b, int ldb, const void* beta,
                            void* c, cudaDataType type_c, int ldc, cublasComputeType_t compute,
                            cublasGemmAlgo_t algo);
// cublasGemmEx for each of `batch` matrices, A, B and C stride_a / _b / _c elements apart.
cublasStatus_t cublasGemmStridedBatchedEx(
    cublasHandle_t h, cublasOperation_t op_a, cublasOperation_t op_b, int m, int n, int k,
    const void* alpha, const void* a, cudaDataType type_a, int lda, long long stride_a,
    const void* b, cudaDataType type_b, int ldb, long long stride_b, const void* beta, void* c,
    cudaDataType type_c, int ldc, long long stride_c, int batch, cublasComputeType_t compute,
    cublasGemmAlgo_t algo);

// ---- threads, barriers and launches
namespace emu {
struct ThreadState {
  uint3 idx;
  int lane = 0;         // in its warp
  bool waited = false;  // GridWait called
};
struct BlockState {
  uint3 idx;
  dim3 dim, grid;
  bool pdl = false;  // launched with programmatic dependent launch
};
extern thread_local ThreadState* current_thread;
extern thread_local BlockState* current_block;

inline int Lane() { return current_thread->lane; }
void SyncThreads();
void SyncWarp(unsigned mask);
// Every lane of the warp passes `bits` and gets lane `src`'s (a full-mask shuffle).
uint64_t Exchange(unsigned mask, uint64_t bits, int src);
// Every lane of the warp passes `bits`; the last to arrive calls all(slots) on the 32 lanes'
// values (in lane order), which it may rewrite; each lane gets its own slot then (a full-mask
// exchange).
uint64_t ExchangeThen(uint64_t bits, void (*all)(uint64_t* slots));
// Runs body on every thread of the grid now, or records it when s is being captured. With
// pdl, every thread must call GridWait before it returns (a finding otherwise).
void Enqueue(cudaStream_t s, dim3 grid, dim3 block, bool pdl, std::function<void()> body);
void GridWait();
// Blocks run first to last, and a block's turn passes from a thread to the next ready one above
// it; reversed (or with PENG_EMU_ORDER=reverse), last to first and to the one below. A kernel
// whose result depends on that order -- a block reading what another block of the launch writes,
// a thread reading shared memory another writes with no barrier between -- gives a different
// result in one of the two orders (a GPU promises neither).
void SetReversedOrder(bool reversed);
// Kernels run since the process started (each replay of a recorded one counts).
uint64_t KernelsRun();
// A kernel's load of `bytes` at p, not aligned to its size (a GPU faults there): a finding.
void Misaligned(const void* p, int bytes);
// Whether s is being captured into a graph.
bool IsCapturing(cudaStream_t s);
// Runs op now, or records it when s is being captured: a stream's work other than kernels (the
// emulated NCCL's collectives).
void Submit(cudaStream_t s, std::function<void()> op);
// A failure of such work once recorded: cudaGetLastError's sticky error, as a launch's.
void ReportFailure(const std::string& what);
}  // namespace emu

#define threadIdx (::peng::backend::cuda::emu::current_thread->idx)
#define blockIdx (::peng::backend::cuda::emu::current_block->idx)
#define blockDim (::peng::backend::cuda::emu::current_block->dim)
#define gridDim (::peng::backend::cuda::emu::current_block->grid)

inline void __syncthreads() { emu::SyncThreads(); }
inline void __syncwarp(unsigned mask = 0xffffffffu) { emu::SyncWarp(mask); }

template <typename T>
T __shfl_sync(unsigned mask, T v, int src, int width = 32) {
  static_assert(sizeof(T) <= 8 && std::is_trivially_copyable_v<T>);
  uint64_t b = 0;
  std::memcpy(&b, &v, sizeof(T));
  b = emu::Exchange(mask, b, emu::Lane() / width * width + src % width);
  T r;
  std::memcpy(&r, &b, sizeof(T));
  return r;
}
template <typename T>
T __shfl_xor_sync(unsigned mask, T v, int lane_mask, int width = 32) {
  return __shfl_sync(mask, v, (emu::Lane() ^ lane_mask) % width, width);
}

namespace emu {
// The last lane's rounds of a vote (ExchangeThen): each slot becomes the mask of the lanes whose
// value equals its own (__match_any_sync), or of those whose value is not 0 (__ballot_sync).
inline void MatchRounds(uint64_t* slots) {
  uint64_t m[32] = {};
  for (int l = 0; l < 32; ++l)
    for (int o = 0; o < 32; ++o) m[l] |= uint64_t{slots[o] == slots[l]} << o;
  std::memcpy(slots, m, sizeof(m));
}
inline void BallotRounds(uint64_t* slots) {
  uint64_t m = 0;
  for (int l = 0; l < 32; ++l) m |= uint64_t{slots[l] != 0} << l;
  for (int l = 0; l < 32; ++l) slots[l] = m;
}
}  // namespace emu
// (Full masks only, as the shuffles.)
template <typename T>
unsigned __match_any_sync(unsigned mask, T v) {
  static_assert(sizeof(T) <= 8 && std::is_trivially_copyable_v<T>);
  if (mask != 0xffffffffu) emu::SyncWarp(mask);  // (reported: a partial mask)
  uint64_t b = 0;
  std::memcpy(&b, &v, sizeof(T));
  return static_cast<unsigned>(emu::ExchangeThen(b, &emu::MatchRounds));
}
inline unsigned __ballot_sync(unsigned mask, int predicate) {
  if (mask != 0xffffffffu) emu::SyncWarp(mask);  // (reported: a partial mask)
  return static_cast<unsigned>(emu::ExchangeThen(predicate != 0, &emu::BallotRounds));
}
inline int __popc(unsigned x) { return std::popcount(x); }
inline int __ffs(int x) { return x ? std::countr_zero(static_cast<unsigned>(x)) + 1 : 0; }

// (A launch's blocks run one after another: every store is visible to the blocks after.)
inline void __threadfence() {}
template <typename T>
T __ldcg(const T* p) {
  return *p;
}

// (The threads of a block run one at a time between barriers: a plain add is atomic.)
template <typename T>
T atomicAdd(T* p, T v) {
  const T old = *p;
  *p = old + v;
  return old;
}

template <typename T>
T atomicMin(T* p, T v) {
  const T old = *p;
  if (v < old) *p = v;
  return old;
}

// The emulated device (registered as "cuda-emu" by cuda_device_emulated.cc).
}  // namespace peng::backend::cuda
