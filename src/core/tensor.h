// TensorView: a non-owning view of a tensor's bytes (usually inside a memory-mapped model
// file). Shapes are in PyTorch order, outermost first: a weight matrix is [rows, cols] =
// [out_features, in_features], each row `cols` values stored contiguously (for quantized types,
// cols/block_size whole blocks). The owner of the bytes (a MappedFile, a buffer) must outlive
// the view.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/dtype.h"

namespace peng {

struct TensorView {
  std::string name;
  DType dtype = DType::kF32;
  std::vector<int64_t> shape;
  const void* data = nullptr;
  size_t size_bytes = 0;
  // The same matrix repacked at load time into the active ISA's panel layout
  // (kernels::PackPanels; its owner keeps it alive), or null. Only the kernels of the ISA that
  // packed it read it; everything else reads `data`.
  const uint8_t* panels = nullptr;

  int64_t numel() const {
    int64_t n = 1;
    for (int64_t d : shape) n *= d;
    return n;
  }
  int ndim() const { return static_cast<int>(shape.size()); }
  int64_t dim(int i) const { return shape[i < 0 ? shape.size() + i : i]; }
  // Rows of a 2-D (or flattened N-D) matrix: all dims but the last.
  int64_t rows() const {
    if (shape.empty()) return 0;
    int64_t n = 1;
    for (size_t i = 0; i + 1 < shape.size(); ++i) n *= shape[i];
    return n;
  }
  int64_t cols() const { return shape.empty() ? 0 : shape.back(); }
  size_t row_bytes() const { return RowBytes(dtype, cols()); }
  const uint8_t* row(int64_t r) const {
    return static_cast<const uint8_t*>(data) + static_cast<size_t>(r) * row_bytes();
  }
  std::string ShapeString() const;  // "[576, 49152]"
};

}  // namespace peng
