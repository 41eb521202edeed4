// SIMD versions of the element-wise ops and of the attention inner loops, one namespace per
// ISA (avx2, avx512, neon), each with exactly the functions and contracts of kernels/ref/
// ops_ref.h (except ApplyRope and F32ToQ8_0Row, which are scalar only; HadamardRows gives the
// reference's bits, its runs of 32 and 64 vectorised and others by the reference). Each namespace is compiled into its own
// translation unit with per-file target flags (cpu/ops_<isa>.cc), so callers must only call a
// namespace when kernels::IsaSupported() says so; the dispatchers in elementwise.cc and
// attention.cc do. The SIMD files include no shared inline code (only intrinsics) so that no
// AVX-512 instruction can leak into code run on older CPUs through ODR merging.
#pragma once

#include <cstdint>

namespace peng::kernels {

#define PENG_DECLARE_SIMD_OPS_                                                                  \
  void RmsNorm(const float* x, const float* w, float w_offset, float* y, int64_t n_rows,        \
               int64_t n, float eps);                                                           \
  void Softmax(float* x, int64_t n);                                                            \
  void SiluMul(const float* gate, const float* up, float* out, int64_t n);                      \
  void GeluTanhMul(const float* gate, const float* up, float* out, int64_t n);                  \
  void AddInPlace(float* y, const float* x, int64_t n);                                         \
  void ScaleInPlace(float* y, float s, int64_t n);                                              \
  void DotRowsF32(const float* q, const float* k, int64_t k_stride, int64_t n_rows, int64_t dim, \
                  float* out);                                                                  \
  void DotRowsF16(const float* q, const uint16_t* k, int64_t k_stride, int64_t n_rows,          \
                  int64_t dim, float* out);                                                     \
  void AxpyRowsF32(const float* w, const float* v, int64_t v_stride, int64_t n_rows,            \
                   int64_t dim, float* acc);                                                    \
  void AxpyRowsF16(const float* w, const uint16_t* v, int64_t v_stride, int64_t n_rows,         \
                   int64_t dim, float* acc);                                                    \
  void DotRowsQ8_0(const float* q, const uint8_t* k, int64_t k_stride, int64_t n_rows,         \
                   int64_t dim, float* out);                                                    \
  void AxpyRowsQ8_0(const float* w, const uint8_t* v, int64_t v_stride, int64_t n_rows,        \
                    int64_t dim, float* acc);                                                   \
  float ExpShiftSum(float* x, int64_t n, float m);                                              \
  void F32ToF16Row(const float* x, uint16_t* y, int64_t n);                                     \
  void F16ToF32Row(const uint16_t* x, float* y, int64_t n);                                     \
  void Q8_0ToF32Row(const uint8_t* x, float* y, int64_t n);                                     \
  void HadamardRows(float* x, int64_t n_rows, int64_t dim, int block);                          \
  void ScoreTile16(const float* qt, const float* k, int64_t k_stride, int64_t n, int64_t dim,   \
                   float* s);                                                                   \
  void SoftmaxTile16(float* s, int64_t n, float* m, float* l, float* corr);                     \
  void AccumTile16(const float* p, const float* v, int64_t v_stride, int64_t n, int64_t dim,    \
                   const float* corr, float* acc);                                              \
  int64_t ArgMax(const float* x, int64_t n);                                                    \
  int64_t FindNanOrPosInf(const float* x, int64_t n);                                           \
  int64_t FindAbove(const float* x, int64_t n, float w);

#if defined(__x86_64__)
namespace avx2 {
PENG_DECLARE_SIMD_OPS_
}  // namespace avx2
namespace avx512 {
PENG_DECLARE_SIMD_OPS_
}  // namespace avx512
#endif
#if defined(__aarch64__)
namespace neon {
PENG_DECLARE_SIMD_OPS_
}  // namespace neon
#endif

#undef PENG_DECLARE_SIMD_OPS_

}  // namespace peng::kernels
