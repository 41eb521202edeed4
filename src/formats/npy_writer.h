// WriteNpy: saves a float32 array as a NumPy .npy file (format version 1.0), so tensors from
// peng can be compared with PyTorch/NumPy references (`numpy.load(path)`). The header is
// "{'descr': '<f4', 'fortran_order': False, 'shape': (d0, d1, ...), }", space-padded and
// ending in '\n' so that the data starts at a multiple of 64 bytes; the data follows in C
// (row-major) order, little-endian. A rank-0 shape {} writes one scalar. Stateless; safe to
// call from any thread (for distinct paths).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/status.h"

namespace peng {

// The complete .npy header (magic, version, length, dict, padding) for a '<f4' array.
// InvalidArgument if a dimension is negative or the header would not fit version 1.0.
StatusOr<std::string> NpyHeader(const std::vector<int64_t>& shape);

// Writes `data` (product(shape) floats) to `path`, replacing any existing file.
Status WriteNpy(const std::string& path, const float* data, const std::vector<int64_t>& shape);

}  // namespace peng
