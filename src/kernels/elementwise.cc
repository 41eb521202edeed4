// Dispatch of the element-wise ops to the active ISA (kernels/cpu/ops_<isa>.cc) or the scalar
// reference (kernels/ref/ops_ref.cc); TopK, one scalar form for every ISA.
#include <algorithm>
#include <cmath>
#include <numeric>
#include <vector>

#include "core/check.h"
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

int64_t FindAbove(const float* x, int64_t n, float w) { PENG_DISPATCH_(FindAbove, x, n, w); }

#undef PENG_DISPATCH_
#undef PENG_SIMD_CASES_

void TopK(const float* x, int64_t n, int k, float* val, int32_t* idx) {
  PENG_CHECK(k >= 1 && k <= n);
  // (v, i) ranks above (w, j), j < i (the scan's order): a number above NaN, a larger number.
  const auto above = [](float v, float w) { return !std::isnan(v) && (std::isnan(w) || v > w); };
  if (k > kTopKInsertMax) {  // a long list: select, then sort what was selected
    thread_local std::vector<int32_t> order;  // (scratch: no allocation a call)
    order.resize(static_cast<size_t>(n));
    std::iota(order.begin(), order.end(), 0);
    const auto before = [&](int32_t i, int32_t j) {
      return above(x[i], x[j]) || (!above(x[j], x[i]) && i < j);
    };
    std::nth_element(order.begin(), order.begin() + (k - 1), order.end(), before);
    std::sort(order.begin(), order.begin() + k, before);
    for (int i = 0; i < k; ++i) {
      idx[i] = order[i];
      val[i] = x[order[i]];
    }
    return;
  }
  int m = 0;  // entries held
  for (int64_t i = 0; i < n; ++i) {
    if (m == k && !std::isnan(val[k - 1])) {  // only a larger value enters: skip to the next
      i += FindAbove(x + i, n - i, val[k - 1]);
      if (i == n) break;
    }
    const float v = x[i];
    if (m == k && !above(v, val[k - 1])) continue;
    int at = m < k ? m++ : k - 1;  // the slot it takes, before moving up
    for (; at > 0 && above(v, val[at - 1]); --at) {
      val[at] = val[at - 1];
      idx[at] = idx[at - 1];
    }
    val[at] = v;
    idx[at] = static_cast<int32_t>(i);
  }
}

double TemperatureTotal(const float* x, int64_t n, float m, float inv_t) {
  double total = 0.0;
  for (int64_t i = 0; i < n; ++i) total += std::exp((x[i] - m) * inv_t);
  return total;
}

double LogSoftmaxTotal(const float* x, int64_t n, float m) {
  double total = 0.0;
  for (int64_t i = 0; i < n; ++i) total += std::exp(static_cast<double>(x[i] - m));
  return total;
}

int32_t DrawInIdOrder(const float* x, int64_t n, float m, float inv_t, double u) {
  const auto weight = [&](int64_t i) -> double { return std::exp((x[i] - m) * inv_t); };
  const double target = u * TemperatureTotal(x, n, m, inv_t);
  double acc = 0.0;
  int32_t last = 0;
  for (int64_t i = 0; i < n; ++i) {
    const double w = weight(i);
    if (w == 0.0) continue;
    acc += w;
    last = static_cast<int32_t>(i);
    if (target < acc) return last;
  }
  return last;  // (target rounded up to the total)
}

void AddBiasRows(float* y, const float* b, int64_t n_rows, int64_t n) {
  if (!b) return;
  for (int64_t t = 0; t < n_rows; ++t) AddInPlace(y + t * n, b, n);
}

}  // namespace peng::kernels
