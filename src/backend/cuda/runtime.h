// What the CUDA backend's sources (cuda_device.cu, kernels.cuh, moe_kernels.cuh) see of CUDA:
// the toolkit's runtime, FP16 and cuBLAS headers, or -- when compiled as C++ with
// PENG_CUDA_EMULATOR (cuda_device_emulated.cc) -- the emulator's stand-ins for the same names
// (emulator.h), which run the kernels on the CPU for the tests. Kernels are launched with
// Launch(kernel, grid, block, stream, args...) rather than with CUDA's launch syntax, so that
// one source serves both. Blocks are of at most 256 threads (any kernel's registers fit then:
// 255 x 256 of a multiprocessor's 65536) except for kernels that declare as much with
// __launch_bounds__, which ptxas then keeps within it.
//
// Programmatic dependent launch (sm_90 and later; LaunchStream::pdl): a kernel may be launched
// while the kernel before it on the stream still runs. Every kernel of the backend calls
// GridWait() before it touches memory that another kernel writes or reads (its first statement;
// a GEMV first prefetches its weights, which no kernel writes), and GridLaunchDependents() at
// its start, so that the next kernel's blocks are placed, and prefetch their weights, while
// this one finishes: the gaps between the hundreds of small kernels of a decode step shrink.
// Without pdl, or before sm_90, both calls do nothing and launches are ordered as usual.
#pragma once

#if defined(PENG_CUDA_EMULATOR)
#include "backend/cuda/emulator.h"
#else
#include <cublas_v2.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#endif

#include <cstdint>
#include <cstring>
#include <tuple>
#include <type_traits>
#include <utility>

namespace peng::backend::cuda {

// Whether e loses the context (CUDA's "sticky" errors: a kernel's fault, an assert,
// uncorrectable ECC; every later call fails the same way until the process ends).
inline bool LosesTheContext(cudaError_t e) {
  switch (e) {
    case cudaErrorIllegalAddress:
    case cudaErrorLaunchTimeout:
    case cudaErrorAssert:
    case cudaErrorHardwareStackError:
    case cudaErrorIllegalInstruction:
    case cudaErrorMisalignedAddress:
    case cudaErrorInvalidAddressSpace:
    case cudaErrorInvalidPc:
    case cudaErrorLaunchFailure:
    case cudaErrorECCUncorrectable:
      return true;
    default:
      return false;
  }
}

// Where a kernel is launched: the stream, and whether with programmatic dependent launch.
struct LaunchStream {
  LaunchStream(cudaStream_t s = nullptr, bool p = false, int64_t* n = nullptr)  // NOLINT
      : stream(s), pdl(p), launches(n) {}
  cudaStream_t stream;
  bool pdl;
  int64_t* launches;  // counts the launches where set
};

// Two floats rounded to FP16, the first in the low half (a register of MmaF16's operands), and
// value i of such a pair.
__device__ __forceinline__ uint32_t HalfPair(float lo, float hi) {
  return uint32_t{__half_as_ushort(__float2half_rn(lo))} |
         (uint32_t{__half_as_ushort(__float2half_rn(hi))} << 16);
}
__device__ __forceinline__ float HalfOfPair(uint32_t pair, int i) {
  return __half2float(__ushort_as_half(static_cast<unsigned short>(i ? pair >> 16 : pair)));
}

#if defined(PENG_CUDA_EMULATOR)
// The emulator runs a launch's blocks one after another, so programmatic dependent launch
// changes nothing there but the check that every thread waits.
template <typename... P, typename... A>
void Launch(void (*kernel)(P...), dim3 grid, dim3 block, LaunchStream s, A&&... args) {
  if (s.launches) ++*s.launches;
  emu::Enqueue(s.stream, grid, block, s.pdl,
               [kernel, a = std::tuple<std::decay_t<P>...>(std::forward<A>(args)...)] {
                 std::apply(kernel, a);
               });
}
inline void GridWait() { emu::GridWait(); }
inline void GridLaunchDependents() {}
inline void PrefetchL2(const void*) {}
// WarpButterfly (below) in one exchange: the last lane to arrive runs the rounds for all 32
// lanes, each op on the same operands as on the GPU (bit for bit the shuffles' result, for a
// fifth of the coroutine switches). Op is stateless: the rounds construct their own.
template <int kFirst, typename T, typename Op>
void ButterflyRounds(uint64_t* slots) {
  T x[32], y[32];
  for (int l = 0; l < 32; ++l) std::memcpy(&x[l], &slots[l], sizeof(T));
  for (int o = kFirst; o > 0; o /= 2) {
    for (int l = 0; l < 32; ++l) y[l] = Op{}(x[l], x[l ^ o]);
    std::memcpy(x, y, sizeof(x));
  }
  for (int l = 0; l < 32; ++l) std::memcpy(&slots[l], &x[l], sizeof(T));
}
template <int kFirst = 16, typename T, typename Op>
T WarpButterfly(T v, Op) {
  static_assert(sizeof(T) <= 8 && std::is_trivially_copyable_v<T> && std::is_empty_v<Op>);
  uint64_t b = 0;
  std::memcpy(&b, &v, sizeof(T));
  b = emu::ExchangeThen(b, &ButterflyRounds<kFirst, T, Op>);
  std::memcpy(&v, &b, sizeof(T));
  return v;
}
// MmaF16 and MmaS8 (below) in one exchange: each lane passes the address of its operands, and
// the last lane to arrive gathers the three tiles from the 32 lanes by PTX's fragment layout --
// A and B by the operands' own (Operands::Gather), the accumulator's shared: lane l's d[0..1]
// D(l / 4, 2 (l % 4) ..), d[2..3] D(l / 4 + 8, ..) --, adds A B to D in the operands' Value
// (FP32 for FP16 operands, whose products are exact in it; int32 for int8, exact) and writes
// each lane's d.
template <typename Operands>
void MmaRounds(uint64_t* slots) {
  using Value = typename Operands::Value;
  Value a[16][16], b[16][8], d[16][8];
  auto lane = [slots](int l) {
    return reinterpret_cast<const Operands*>(static_cast<uintptr_t>(slots[l]));
  };
  for (int l = 0; l < 32; ++l) {
    lane(l)->Gather(l, a, b);
    for (int i = 0; i < 2; ++i) {
      d[l / 4][2 * (l % 4) + i] = lane(l)->d[i];
      d[l / 4 + 8][2 * (l % 4) + i] = lane(l)->d[2 + i];
    }
  }
  for (int i = 0; i < 16; ++i) {
    for (int j = 0; j < 8; ++j) {
      Value s{};
      for (int k = 0; k < 16; ++k) s += a[i][k] * b[k][j];
      d[i][j] += s;
    }
  }
  for (int l = 0; l < 32; ++l) {
    for (int i = 0; i < 2; ++i) {
      lane(l)->d[i] = d[l / 4][2 * (l % 4) + i];
      lane(l)->d[2 + i] = d[l / 4 + 8][2 * (l % 4) + i];
    }
  }
}
struct MmaF16Operands {
  using Value = float;
  const uint32_t* a;
  const uint32_t* b;
  float* d;
  void Gather(int l, float (&ta)[16][16], float (&tb)[16][8]) const {
    const int g = l / 4, c = 2 * (l % 4);
    for (int i = 0; i < 2; ++i) {
      ta[g][c + i] = HalfOfPair(a[0], i);
      ta[g + 8][c + i] = HalfOfPair(a[1], i);
      ta[g][c + 8 + i] = HalfOfPair(a[2], i);
      ta[g + 8][c + 8 + i] = HalfOfPair(a[3], i);
      tb[c + i][g] = HalfOfPair(b[0], i);
      tb[c + 8 + i][g] = HalfOfPair(b[1], i);
    }
  }
};
struct MmaS8Operands {
  using Value = int;
  const uint32_t* a;
  uint32_t b;
  int* d;
  void Gather(int l, int (&ta)[16][16], int (&tb)[16][8]) const {
    const int g = l / 4, c = 4 * (l % 4);
    auto byte = [](uint32_t w, int i) { return int{static_cast<int8_t>(w >> (8 * i))}; };
    for (int i = 0; i < 4; ++i) {
      ta[g][c + i] = byte(a[0], i);
      ta[g + 8][c + i] = byte(a[1], i);
      tb[c + i][g] = byte(b, i);
    }
  }
};
inline void MmaF16(float (&d)[4], const uint32_t (&a)[4], const uint32_t (&b)[2]) {
  MmaF16Operands m{a, b, d};
  (void)emu::ExchangeThen(reinterpret_cast<uintptr_t>(&m), &MmaRounds<MmaF16Operands>);
}
inline void MmaS8(int (&d)[4], const uint32_t (&a)[2], uint32_t b) {
  MmaS8Operands m{a, b, d};
  (void)emu::ExchangeThen(reinterpret_cast<uintptr_t>(&m), &MmaRounds<MmaS8Operands>);
}
#else
// The launch, with no dynamic shared memory (no kernel uses any).
template <typename... P, typename... A>
void Launch(void (*kernel)(P...), dim3 grid, dim3 block, LaunchStream s, A&&... args) {
  cudaLaunchAttribute attr[1];
  attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr[0].val.programmaticStreamSerializationAllowed = 1;
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = grid;
  cfg.blockDim = block;
  cfg.dynamicSmemBytes = 0;
  cfg.stream = s.stream;
  cfg.attrs = attr;
  cfg.numAttrs = s.pdl ? 1 : 0;
  cudaLaunchKernelEx(&cfg, kernel, std::forward<A>(args)...);
  if (s.launches) ++*s.launches;
}

// Waits until the kernels this one depends on have finished and their writes are visible.
__device__ __forceinline__ void GridWait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}
// Lets the next kernel on the stream be launched (its blocks then wait in GridWait).
__device__ __forceinline__ void GridLaunchDependents() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}
// op over the lanes' v by a butterfly of xor shuffles (offsets kFirst, ..., 2, 1; 16: over the
// warp, 8: over each half, ...): every lane gets op(own, partner's) each round.
template <int kFirst = 16, typename T, typename Op>
__device__ __forceinline__ T WarpButterfly(T v, Op op) {
  for (int o = kFirst; o > 0; o /= 2) v = op(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}
// Starts bringing the 128-byte line at p into the L2 cache.
__device__ __forceinline__ void PrefetchL2(const void* p) {
#if defined(__CUDA_ARCH__)
  asm volatile("prefetch.global.L2 [%0];" ::"l"(p));
#endif
}
#endif

#if !defined(PENG_CUDA_EMULATOR)
// D += A B over one tile of 16 x 8 x 16 on the tensor cores (mma.sync m16n8k16, sm_80 and
// later: FP16 operands, FP32 accumulation); every lane of the warp calls it together. The tiles
// are spread over the lanes by PTX's fragment layout -- with g = lane / 4 and c = 2 (lane % 4),
// each register two FP16 values of consecutive columns (or rows of B), the first in its low
// half: a[0] holds A(g, c..c+1), a[1] A(g+8, c..c+1), a[2] A(g, c+8..c+9), a[3] A(g+8,
// c+8..c+9); b[0] B(c..c+1, g), b[1] B(c+8..c+9, g); d[0..1] D(g, c..c+1), d[2..3] D(g+8,
// c..c+1). (The emulator's MmaF16 gathers the tiles by the same layout.)
__device__ __forceinline__ void MmaF16(float (&d)[4], const uint32_t (&a)[4],
                                       const uint32_t (&b)[2]) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
      "{%8, %9}, {%0, %1, %2, %3};"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
#endif
}
// D += A B over one tile of 16 x 8 x 16 int8 values (mma.sync m16n8k16, sm_80 and later: int32
// accumulation, exact). With g = lane / 4 and c = 4 (lane % 4), each register four int8
// values of consecutive columns (or rows of B), the first in its low byte: a[0] holds A(g,
// c..c+3), a[1] A(g+8, c..c+3); b B(c..c+3, g); d[0..1] D(g, 2 (lane % 4) ..), d[2..3]
// D(g+8, 2 (lane % 4) ..). (The emulator's MmaS8 gathers the tiles by the same layout.)
__device__ __forceinline__ void MmaS8(int (&d)[4], const uint32_t (&a)[2], uint32_t b) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm("mma.sync.aligned.m16n8k16.row.col.s32.s8.s8.s32 {%0, %1, %2, %3}, {%4, %5}, {%6}, "
      "{%0, %1, %2, %3};"
      : "+r"(d[0]), "+r"(d[1]), "+r"(d[2]), "+r"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(b));
#endif
}
#endif

// A vector load (uint4, float4, int2) of the value at p, which is aligned to its size (on a GPU
// a misaligned one faults; the emulator reports it).
template <typename V>
__device__ __forceinline__ V LoadVector(const void* p) {
#if defined(PENG_CUDA_EMULATOR)
  if (reinterpret_cast<uintptr_t>(p) % sizeof(V) != 0) emu::Misaligned(p, sizeof(V));
  V v;
  std::memcpy(&v, p, sizeof(V));
  return v;
#else
  return *reinterpret_cast<const V*>(p);
#endif
}

// A vector store of v at p, aligned to its size (as LoadVector).
template <typename V>
__device__ __forceinline__ void StoreVector(void* p, const V& v) {
#if defined(PENG_CUDA_EMULATOR)
  if (reinterpret_cast<uintptr_t>(p) % sizeof(V) != 0) emu::Misaligned(p, sizeof(V));
  std::memcpy(p, &v, sizeof(V));
#else
  *reinterpret_cast<V*>(p) = v;
#endif
}

}  // namespace peng::backend::cuda
