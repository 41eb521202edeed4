// The CUDA backend's weight layout on the host side: row sizes and the repacking Upload does
// (weight_layout.h). Plain C++: built with or without CUDA, so CI checks it on every run.
#include "backend/cuda/weight_layout.h"

#include <algorithm>

namespace peng::backend::layout {

void (*misaligned_load_hook)(const void* p, int bytes) = nullptr;

namespace {

// Block b's fields in the file's layout (kernels/quant_blocks.h) for the field-array formats.
template <DType T>
void RepackFields(const uint8_t* src, int64_t n, uint8_t* dst) {
  constexpr bool kMin = T == DType::kQ4_1 || T == DType::kQ5_1;
  constexpr bool kFive = T == DType::kQ5_0 || T == DType::kQ5_1;
  const size_t block = RowBytes(T, 32);
  const int dm = kMin ? 4 : 2;  // d (and m) bytes
  for (int64_t u = 0; u < n; ++u) {
    const uint8_t* b = src + u * block;
    if (kFive) std::memcpy(dst + 4 * u, b + dm, 4);                 // qh
    std::memcpy(dst + (kFive ? 4 * n : 0) + dm * u, b, dm);          // d (, m)
    std::memcpy(dst + QsOffset<T>(n) + kQsBytes<T> * u, b + dm + (kFive ? 4 : 0),
                kQsBytes<T>);                                          // qs
  }
}

}  // namespace

bool Repacked(DType t) {
  switch (t) {
    case DType::kQ4_0:
    case DType::kQ4_1:
    case DType::kQ5_0:
    case DType::kQ5_1:
    case DType::kQ8_0:
    case DType::kQ6_K: return true;
    default: return false;
  }
}

size_t DeviceRowBytes(DType t, int64_t cols) {
  const int64_t n = cols / 32;
  switch (t) {
    case DType::kQ4_0: return static_cast<size_t>(QsOffset<DType::kQ4_0>(n) + 16 * n);
    case DType::kQ4_1: return static_cast<size_t>(QsOffset<DType::kQ4_1>(n) + 16 * n);
    case DType::kQ5_0: return static_cast<size_t>(QsOffset<DType::kQ5_0>(n) + 16 * n);
    case DType::kQ5_1: return static_cast<size_t>(QsOffset<DType::kQ5_1>(n) + 16 * n);
    case DType::kQ8_0: return static_cast<size_t>(QsOffset<DType::kQ8_0>(n) + 32 * n);
    case DType::kQ6_K: return static_cast<size_t>(Align16(static_cast<int64_t>(RowBytes(t, cols))));
    default: return RowBytes(t, cols);
  }
}

void RepackRow(DType t, const uint8_t* src, int64_t cols, uint8_t* dst) {
  const int64_t n = cols / 32;
  const size_t bytes = DeviceRowBytes(t, cols);
  std::fill_n(dst, bytes, uint8_t{0});
  switch (t) {
    case DType::kQ4_0: RepackFields<DType::kQ4_0>(src, n, dst); return;
    case DType::kQ4_1: RepackFields<DType::kQ4_1>(src, n, dst); return;
    case DType::kQ5_0: RepackFields<DType::kQ5_0>(src, n, dst); return;
    case DType::kQ5_1: RepackFields<DType::kQ5_1>(src, n, dst); return;
    case DType::kQ8_0: RepackFields<DType::kQ8_0>(src, n, dst); return;
    case DType::kQ6_K: {
      const int64_t ns = n / 8;
      for (int64_t b = 0; b < ns; ++b) {
        const uint8_t* blk = src + b * sizeof(kernels::BlockQ6_K);
        std::memcpy(dst + b * kQ6Body, blk, kQ6Body);                       // ql, qh, scales
        std::memcpy(dst + ns * kQ6Body + 2 * b, blk + kQ6Body, 2);          // d
      }
      return;
    }
    default: std::memcpy(dst, src, RowBytes(t, cols)); return;
  }
}

}  // namespace peng::backend::layout
