#include "kernels/ref/int8_ref.h"

namespace peng::kernels::ref {

int32_t DotI8(const int8_t* a, const int8_t* b, int64_t n) {
  int32_t s = 0;  // exact: |s| <= 127 * 127 * kInt8MaxCols < 2^31
  for (int64_t i = 0; i < n; ++i) s += int32_t{a[i]} * int32_t{b[i]};
  return s;
}

void Int8MatMulW8A8(const Int8Args& a, int64_t r0, int64_t r1, int64_t t0, int64_t t1) {
  const int64_t cols = a.w.cols, rows = a.w.rows;
  const int64_t groups = cols / kInt8ActGroup;
  for (int64_t t = t0; t < t1; ++t)
    for (int64_t r = r0; r < r1; ++r) {
      const int8_t* w = a.w.q + r * cols;
      const int8_t* x = a.xq + t * cols;
      const float* xs = a.x_scales + t * groups;
      float acc = 0.f;
      for (int64_t g = 0; g < groups; ++g)
        acc += static_cast<float>(DotI8(w + g * kInt8ActGroup, x + g * kInt8ActGroup,
                                        kInt8ActGroup)) * xs[g];
      a.y[t * rows + r] = acc * a.w.scales[r];
    }
}

void Int8MatMulW8A16(const Int8Args& a, int64_t r0, int64_t r1, int64_t t0, int64_t t1) {
  const int64_t cols = a.w.cols, rows = a.w.rows;
  for (int64_t t = t0; t < t1; ++t) {
    const float* x = a.x + t * cols;
    for (int64_t r = r0; r < r1; ++r) {
      const int8_t* q = a.w.q + r * cols;
      float s = 0.f;
      for (int64_t c = 0; c < cols; ++c) s += static_cast<float>(q[c]) * x[c];
      a.y[t * rows + r] = s * a.w.scales[r];
    }
  }
}

}  // namespace peng::kernels::ref
