// What the CUDA backend's sources (cuda_device.cu, kernels.cuh) see of CUDA: the toolkit's
// runtime, FP16 and cuBLAS headers, or -- when compiled as C++ with PENG_CUDA_EMULATOR
// (cuda_device_emulated.cc) -- the emulator's stand-ins for the same names (emulator.h), which
// run the kernels on the CPU for the tests. Kernels are launched with Launch(kernel, grid,
// block, stream, args...) rather than with CUDA's launch syntax, so that one source serves
// both.
#pragma once

#if defined(PENG_CUDA_EMULATOR)
#include "backend/cuda/emulator.h"
#else
#include <cublas_v2.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <utility>

namespace peng::backend::cuda {

// The launch, with no dynamic shared memory (no kernel uses any).
template <typename... P, typename... A>
void Launch(void (*kernel)(P...), dim3 grid, dim3 block, cudaStream_t stream, A&&... args) {
  // clang-format off
  kernel<<<grid, block, 0, stream>>>(std::forward<A>(args)...);
  // clang-format on
}

}  // namespace peng::backend::cuda
#endif
