// Random tensor bytes of any weight type peng reads, for benchmarks at a model's real shapes
// (bench/random_gguf.cc) and conformance tests of the device kernels: float types get values
// uniform in [lo, hi]; block-quantized types get random bytes with every fp16 scale field set
// to a small finite value (so every block decodes to finite weights of magnitude ~0.1); INT8
// gets random values in [-127, 127] (its scales are separate tensors).
#pragma once

#include <cstdint>
#include <random>

#include "core/dtype.h"
#include "core/status.h"

namespace peng {

// n_values must be a multiple of t's block size; out holds RowBytes(t, n_values) bytes.
Status FillRandomWeights(DType t, int64_t n_values, uint8_t* out, std::mt19937_64* rng,
                         float lo = -1.f, float hi = 1.f);

}  // namespace peng
