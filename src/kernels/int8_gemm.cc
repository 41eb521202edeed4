// INT8 GEMM dispatch: per-token activation quantization, ISA selection once per call, token
// chunks (a chunk of activations stays in L2 while the weight rows stream through it) and the
// split of weight rows across the thread pool. Kernels live in ref/int8_ref.cc and cpu/int8_*.
#include "kernels/int8_gemm.h"

#include <algorithm>
#include <cmath>

#include "core/check.h"
#include "kernels/isa.h"
#include "kernels/ops.h"
#include "kernels/ref/int8_ref.h"
#include "kernels/work_counter.h"

namespace peng::kernels {
namespace {

// Tokens per pass over the weights.
constexpr int64_t kTokenChunk = 64;
// Rows per thread are rounded to this so every thread runs whole register tiles.
constexpr int64_t kRowAlign = 16;

int64_t RoundUp(int64_t v, int64_t m) { return (v + m - 1) / m * m; }

Int8Kernels ResolveKernels(Isa isa) {
  Int8Kernels k;
  switch (isa) {
#if defined(__x86_64__)
    case Isa::kAvx2: k = Avx2Int8Kernels(); break;
    case Isa::kAvx512: k = Avx512Int8Kernels(); break;
#elif defined(__aarch64__)
    case Isa::kNeon: k = NeonInt8Kernels(); break;
    case Isa::kNeonDot: k = NeonDotInt8Kernels(); break;
    case Isa::kNeonI8mm: k = NeonI8mmInt8Kernels(); break;
#endif
    default: break;
  }
  if (!k.w8a8) k.w8a8 = &ref::Int8MatMulW8A8;
  if (!k.w8a16) k.w8a16 = &ref::Int8MatMulW8A16;
  return k;
}

// Work counts (kernels/work_counter.h): int8 weights plus one FP32 scale per row, read once.
void CountWork(const Int8Weights& w, int64_t n_tokens, int64_t* ops) {
  ThreadWork().weight_bytes += w.rows * (w.cols + static_cast<int64_t>(sizeof(float)));
  *ops += 2 * w.rows * w.cols * n_tokens;
}

void CheckWeights(const Int8Weights& w) {
  PENG_CHECK_MSG(w.cols % kInt8ColAlign == 0, "Int8MatMul: cols must be a multiple of 32");
  PENG_CHECK_MSG(w.cols <= kInt8MaxCols, "Int8MatMul: cols too large for exact int32 dots");
  PENG_CHECK(w.q != nullptr && w.scales != nullptr);
}

void Run(Int8Kernel kernel, const Int8Args& args, int64_t n_tokens, ThreadPool* pool) {
  const int64_t rows = args.w.rows;
  if (rows <= 0 || n_tokens <= 0) return;
  auto run_rows = [&](int64_t r0, int64_t r1) {
    for (int64_t t0 = 0; t0 < n_tokens; t0 += kTokenChunk)
      kernel(args, r0, r1, t0, std::min(n_tokens, t0 + kTokenChunk));
  };
  const int nt = pool ? pool->num_threads() : 1;
  if (nt <= 1 || rows < 2 * kRowAlign) {
    run_rows(0, rows);
    return;
  }
  const int64_t per = RoundUp((rows + nt - 1) / nt, kRowAlign);
  pool->Run([&](int ti, int) {
    const int64_t r0 = std::min(rows, ti * per);
    const int64_t r1 = std::min(rows, r0 + per);
    if (r0 < r1) run_rows(r0, r1);
  });
}

}  // namespace

void QuantizeRowsPerToken(const float* x, int64_t n_tokens, int64_t cols, int8_t* q,
                          float* scales) {
  for (int64_t t = 0; t < n_tokens; ++t) {
    const float* xr = x + t * cols;
    int8_t* qr = q + t * cols;
    float amax = 0.f;
    for (int64_t c = 0; c < cols; ++c) amax = std::max(amax, std::fabs(xr[c]));
    const float scale = amax / 127.f;
    scales[t] = scale;
    if (scale == 0.f) {
      std::fill(qr, qr + cols, int8_t{0});
    } else {
      for (int64_t c = 0; c < cols; ++c) {
        // nearbyint rounds half to even in the default rounding mode.
        const float v = std::clamp(std::nearbyint(xr[c] / scale), -127.f, 127.f);
        qr[c] = static_cast<int8_t>(v);
      }
    }
  }
}

void QuantizeActivations(const float* x, int64_t n_tokens, int64_t cols, int8_t* q,
                         float* scales) {
  PENG_CHECK_MSG(cols % kInt8ActGroup == 0, "QuantizeActivations: cols must be a multiple of 32");
  // Each group is quantized as a row of its own; groups are contiguous in memory.
  QuantizeRowsPerToken(x, n_tokens * (cols / kInt8ActGroup), kInt8ActGroup, q, scales);
}

void RmsNormQuantize(const float* x, const float* w, float w_offset, float* y, int8_t* q,
                     float* scales, int64_t n_rows, int64_t n, float eps) {
  const int64_t groups = n / kInt8ActGroup;
  for (int64_t t = 0; t < n_rows; ++t) {
    RmsNorm(x + t * n, w, w_offset, y + t * n, 1, n, eps);
    QuantizeActivations(y + t * n, 1, n, q + t * n, scales + t * groups);
  }
}

void Int8MatMul(const Int8Weights& w, const int8_t* xq, const float* x_scales, int64_t n_tokens,
                float* y, ThreadPool* pool) {
  CheckWeights(w);
  Int8Args args;
  args.w = w;
  args.xq = xq;
  args.x_scales = x_scales;
  args.y = y;
  CountWork(w, n_tokens, &ThreadWork().ops_int8);
  Run(ResolveKernels(ActiveIsa()).w8a8, args, n_tokens, pool);
}

void Int8MatMulW8A16(const Int8Weights& w, const float* x, int64_t n_tokens, float* y,
                     ThreadPool* pool) {
  CheckWeights(w);
  Int8Args args;
  args.w = w;
  args.x = x;
  args.y = y;
  CountWork(w, n_tokens, &ThreadWork().flops_f32);  // int8 weights widened to FP32 FMAs
  Run(ResolveKernels(ActiveIsa()).w8a16, args, n_tokens, pool);
}

}  // namespace peng::kernels
