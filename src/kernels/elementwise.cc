// Dispatch of the element-wise ops to the active ISA (kernels/cpu/ops_<isa>.cc) or the scalar
// reference (kernels/ref/ops_ref.cc).
#include "kernels/cpu/ops_simd.h"
#include "kernels/isa.h"
#include "kernels/ops.h"
#include "kernels/ref/ops_ref.h"

namespace peng::kernels {

#if defined(__x86_64__)
#define PENG_SIMD_CASES_(fn, ...)                          \
  case Isa::kAvx512: return avx512::fn(__VA_ARGS__);      \
  case Isa::kAvx2: return avx2::fn(__VA_ARGS__);
#elif defined(__aarch64__)
// Element-wise ops need no ARMv8.2 extension: plain NEON at every ARM64 level.
#define PENG_SIMD_CASES_(fn, ...)  \
  case Isa::kNeon:                 \
  case Isa::kNeonDot:              \
  case Isa::kNeonI8mm: return neon::fn(__VA_ARGS__);
#else
#define PENG_SIMD_CASES_(fn, ...)
#endif

#define PENG_DISPATCH_(fn, ...)          \
  switch (ActiveIsa()) {                 \
    PENG_SIMD_CASES_(fn, __VA_ARGS__)    \
    default: return ref::fn(__VA_ARGS__); \
  }

void RmsNorm(const float* x, const float* w, float w_offset, float* y, int64_t n_rows, int64_t n,
             float eps) {
  PENG_DISPATCH_(RmsNorm, x, w, w_offset, y, n_rows, n, eps);
}

void Softmax(float* x, int64_t n) { PENG_DISPATCH_(Softmax, x, n); }

void SiluMul(const float* gate, const float* up, float* out, int64_t n) {
  PENG_DISPATCH_(SiluMul, gate, up, out, n);
}

void GeluTanhMul(const float* gate, const float* up, float* out, int64_t n) {
  PENG_DISPATCH_(GeluTanhMul, gate, up, out, n);
}

void AddInPlace(float* y, const float* x, int64_t n) { PENG_DISPATCH_(AddInPlace, y, x, n); }

void ScaleInPlace(float* y, float s, int64_t n) { PENG_DISPATCH_(ScaleInPlace, y, s, n); }

int64_t ArgMax(const float* x, int64_t n) { PENG_DISPATCH_(ArgMax, x, n); }

int64_t FindNanOrPosInf(const float* x, int64_t n) { PENG_DISPATCH_(FindNanOrPosInf, x, n); }

#undef PENG_DISPATCH_
#undef PENG_SIMD_CASES_

void AddBiasRows(float* y, const float* b, int64_t n_rows, int64_t n) {
  if (!b) return;
  for (int64_t t = 0; t < n_rows; ++t) AddInPlace(y + t * n, b, n);
}

}  // namespace peng::kernels
