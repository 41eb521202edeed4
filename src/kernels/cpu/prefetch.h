// Software prefetch for the GEMV weight streams (one token: every weight byte is read once, from
// memory). A GEMV tile reads R consecutive rows side by side, so it runs R short streams that
// start on new pages at every tile; the hardware prefetchers barely train on them (measured on
// AMD Zen 5: a Q6_K 896 x 4864 GEMV read 6.9 GB/s from memory on one core, 40 GB/s from cache).
// Rows are stored back to back, so the same offset R * row_bytes further on is the same position
// in a later tile: every stream prefetches there, at least kPrefetchMinBytes ahead. With it the
// same GEMV reads 25-35 GB/s from memory (peng_micro_bench, docs/benchmarks.md).
#pragma once

#include <cstdint>

namespace peng::kernels {
namespace {  // one copy per ISA translation unit (see cpu/tile_driver.h)

constexpr int64_t kPrefetchMinBytes = 8192;

// Bytes ahead for a tile of tile_bytes (= R * row_bytes): a whole number of tiles.
inline int64_t PrefetchAhead(int64_t tile_bytes) {
  return (kPrefetchMinBytes + tile_bytes - 1) / tile_bytes * tile_bytes;
}

// Prefetches, ahead bytes further on, one address per 64 bytes of a kBytes block (a
// compile-time block size, so the loop unrolls): blocks are consecutive, so every cache line of
// the stream holds one of these addresses of this or the next block (one prefetch per block of
// up to 64 bytes, two for a Q8_0 pair or K-quant super-block half, ...).
template <int64_t kBytes>
inline void PrefetchStream(const void* p, int64_t ahead) {
  const char* c = static_cast<const char*>(p) + ahead;
  for (int64_t off = 0; off < kBytes; off += 64) __builtin_prefetch(c + off, 0, 3);
}

}  // namespace
}  // namespace peng::kernels
