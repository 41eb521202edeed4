// Small helpers shared by the AVX-512 matmul translation units (matmul_avx512.cc,
// matmul_kquant_avx512.cc; included only by files compiled with AVX-512 flags). An anonymous
// namespace keeps one copy per unit, so no AVX-512 code can be merged into code run on older
// CPUs.
#pragma once

#include "kernels/cpu/avx512.h"

#include <algorithm>
#include <cstdint>
#include <cstring>

#include "core/dtype.h"

namespace peng::kernels {
namespace {

// Stores the first n (<= 16) lanes of v at y.
inline void StoreRows(float* y, __m512 v, int n) {
  _mm512_mask_storeu_ps(y, static_cast<__mmask16>(n >= 16 ? 0xFFFF : (1u << n) - 1), v);
}

// Row groups, the panels of the float and INT8 weights (PackPanels): per 16-row panel its four
// 4-row groups one after the other; a group holds its 4 rows chunk by chunk (chunk k of rows
// 4q..4q+3, then chunk k + 1), the rows padded with zeros to whole chunks, rows past the matrix
// repeating its last row. A 4-row register tile then reads one contiguous stream where
// row-major rows are four short ones, which the hardware prefetchers barely follow.
constexpr int64_t kFloatChunkValues = 16;  // float chunks: one zmm of values (TileF's step)
constexpr int64_t kInt8ChunkBytes = 64;    // INT8 chunks: TileW8A8's 64-column step
// A row group's chunk bytes for type t; 0 for the types packed otherwise (or not at all).
constexpr int64_t RowGroupChunk(DType t) {
  switch (t) {
    case DType::kF32: return kFloatChunkValues * 4;
    case DType::kF16:
    case DType::kBF16: return kFloatChunkValues * 2;
    case DType::kI8: return kInt8ChunkBytes;
    default: return 0;
  }
}
inline int64_t RowGroupBytes(int64_t row_bytes, int64_t chunk) {
  return (row_bytes + chunk - 1) / chunk * chunk * 4;
}
inline void PackRowGroups(const uint8_t* w, int64_t row_bytes, int64_t rows, int64_t chunk,
                          uint8_t* out) {
  for (int64_t q = 0; q < (rows + 15) / 16 * 16; q += 4)
    for (int64_t c = 0; c < row_bytes; c += chunk)
      for (int64_t i = q; i < q + 4; ++i, out += chunk) {
        const int64_t n = std::min(chunk, row_bytes - c);
        std::memcpy(out, w + std::min(i, rows - 1) * row_bytes + c, n);
        std::memset(out + n, 0, chunk - n);
      }
}

}  // namespace
}  // namespace peng::kernels
