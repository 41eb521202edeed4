// Inner loops of the machine-peak probes (kernels/probe.h), one namespace per ISA, each in its
// own translation unit with that ISA's target flags (cpu/probe_<isa>.cc), like cpu/ops_simd.h.
// Each loop is written the way the fastest kernel of that ISA would reach the bound: the
// widest loads with independent accumulators for memory, enough independent FMA / dot-product
// chains to hide their latency for arithmetic.
#pragma once

#include <cstdint>

namespace peng::kernels {

#define PENG_DECLARE_PROBES_                                                                  \
  /* Sums the 64-bit words of p[0 .. n) (n a multiple of 256 bytes, p 64-byte aligned). */    \
  uint64_t ReadSum(const void* p, int64_t n);                                                 \
  /* iters rounds of FP32 fused multiply-adds; returns the FLOPs done (2 per multiply-add) */ \
  /* and a value derived from the result (*sink) so nothing is optimized away. */            \
  int64_t FmaLoop(int64_t iters, float* sink);                                                \
  /* The same for the int8 dot products the quantized matmuls use (2 ops per multiply-add). */ \
  int64_t Int8DotLoop(int64_t iters, int32_t* sink);

namespace ref {
PENG_DECLARE_PROBES_
}  // namespace ref
#if defined(__x86_64__)
namespace avx2 {
PENG_DECLARE_PROBES_
}  // namespace avx2
namespace avx512 {
PENG_DECLARE_PROBES_
}  // namespace avx512
#endif
#if defined(__aarch64__)
namespace neon {  // ARMv8.0: int8 dots by vmull/vpadal (cpu/probe_neon.cc)
PENG_DECLARE_PROBES_
}  // namespace neon
namespace dotprod {  // sdot (cpu/probe_dotprod.cc)
PENG_DECLARE_PROBES_
}  // namespace dotprod
namespace i8mm {  // smmla (cpu/probe_i8mm.cc)
PENG_DECLARE_PROBES_
}  // namespace i8mm
#endif

#undef PENG_DECLARE_PROBES_

}  // namespace peng::kernels
