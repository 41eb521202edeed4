// Helpers shared by the kernel tests.
#pragma once

#include <cstdint>
#include <vector>

#include "core/tensor.h"

namespace peng::kernels::test_util {

// A [rows, cols] weight matrix of type t over the bytes of w (GGUF row layout).
inline TensorView View(DType t, int64_t rows, int64_t cols, const std::vector<uint8_t>& w) {
  TensorView v;
  v.dtype = t;
  v.shape = {rows, cols};
  v.data = w.data();
  v.size_bytes = w.size();
  return v;
}

}  // namespace peng::kernels::test_util
