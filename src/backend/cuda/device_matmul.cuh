// CudaDevice's matrix products (included by cuda_device.cu after the class, whose declarations
// say what each does: one translation unit): the launch of the quantized products (dp4a GEMV,
// with the input's kernel inside, or the tensor cores' tiles), the FP32 GEMV of exact mode and
// prefill's GEMM.
#pragma once

namespace peng::backend::cuda {
namespace {

bool CudaDevice::LaunchQGemv(const QMats& ms, int n, DType type, int64_t cols, const QAct& a,
                             int64_t T, const FusedInput* input) {
  int64_t rows = 0;
  for (int i = 0; i < n; ++i) rows = std::max(rows, ms.m[i].rows);
  if (mma_gemv_ && T >= kQMmaMinTokens) {
    if (input) LaunchInput(*input, T);
    const int64_t row_tiles = Blocks(rows, kQMmaRows);
    int tile = kQMmaTileTokens;
    while (tile > 8 && row_tiles * n * Blocks(T, tile) < 2 * sm_count_) tile /= 2;
    WithType(type, [&]<DType D>() {
      if constexpr (layout::kIntDot<D>)
        Launch(QMmaKernel<D>, dim3(row_tiles, Blocks(T, tile), n), kQMmaWarps * kWarp,
               launch_, ms, a, T, tile);
    });
    Note(cudaGetLastError());
    return false;
  }
  const int64_t units = cols / 32;
  const int wpr = rows >= 16 * sm_count_ ? 1
                  : units >= 4 * kWarp   ? 4
                  : units >= 2 * kWarp   ? 2
                                         : 1;
  int passes = 1;
  auto blocks = [&](int p) {
    return Blocks(rows, kRowsPerBlock / wpr * p) * Blocks(T, T == 1 ? 1 : kTokenTile) * n;
  };
  const int64_t most = int64_t{kFusedInputBlocksPerSm} * sm_count_;
  while (passes < 4 && blocks(passes) > most) passes *= 2;
  if (input && blocks(passes) > most) {
    LaunchInput(*input, T);
    input = nullptr;
  }
  bool routed = false;
  WithType(type, [&]<DType D>() {
    if constexpr (layout::kIntDot<D>) {
      auto go = [&]<int NT, int WPR>() {
        const dim3 grid(Blocks(rows, kRowsPerBlock / WPR), Blocks(T, NT), n);
        if (input) {
          const dim3 fewer(Blocks(rows, kRowsPerBlock / WPR * passes), Blocks(T, NT), n);
          FusedInput f = *input;
          routed = f.route.w && T <= NT && fewer.x >= Blocks(f.route.rows, kRowsPerBlock);
          if (routed) {
            f.route.z = static_cast<unsigned>(n);
            Launch(FusedQGemvKernel<D, NT, WPR, true>, dim3(fewer.x, fewer.y, n + 1),
                   kRowsPerBlock * kWarp, launch_, ms, f, T, passes);
          } else {
            f.route = {};
            Launch(FusedQGemvKernel<D, NT, WPR>, fewer, kRowsPerBlock * kWarp, launch_, ms, f,
                   T, passes);
          }
        } else {
          Launch(QGemvKernel<D, NT, WPR>, grid, kRowsPerBlock * kWarp, launch_, ms, a, T);
        }
      };
      auto tokens = [&]<int WPR>() {
        T == 1 ? go.template operator()<1, WPR>() : go.template operator()<kTokenTile, WPR>();
      };
      wpr == 4   ? tokens.template operator()<4>()
      : wpr == 2 ? tokens.template operator()<2>()
                 : tokens.template operator()<1>();
    }
  });
  Note(cudaGetLastError());
  return routed;
}

void CudaDevice::FloatMatMul(const DeviceMatrix& w, const float* x, int64_t T, float* y,
                             Epilogue ep) {
  const uint8_t* wd = static_cast<const uint8_t*>(w.data);
  if (T <= kGemvMaxTokens) {
    WithType(w.dtype, [&]<DType D>() {
      const dim3 block(kRowsPerBlock * kWarp);
      const dim3 one(Blocks(w.rows, kRowsPerBlock), 1);
      const dim3 tiles(Blocks(w.rows, kRowsPerBlock), Blocks(T, kTokenTile));
      auto args = [&](auto kernel, dim3 grid) {
        Launch(kernel, grid, block, launch_, wd, w.row_bytes, w.rows, w.cols, w.scales, x, T, y,
               ep);
      };
      T == 1 ? args(GemvKernel<D, 1>, one) : args(GemvKernel<D, kTokenTile>, tiles);
    });
    Note(cudaGetLastError());
    return;
  }
  // Prefill: a 16-bit W -- an F16 or BF16 matrix as uploaded, any other decoded into an FP16
  // copy -- and x in its type (FP16 rows scaled into FP16's range, and y's rows with them where
  // the products add to y: RowsTo16Kernel), cuBLAS with FP32 accumulation (beta 1 for the
  // residual add), then the store (the rows' scales and the bias; BF16 rows are never scaled:
  // the bias alone, where there is one). PENG_CUDA_BF16_GEMM=0: BF16 matrices decoded to FP16
  // too (x keeps FP16's 11 bits; BF16 has 8).
  const bool bf16 = w.dtype == DType::kBF16 && bf16_gemm_;
  const bool as_uploaded = w.dtype == DType::kF16 || bf16;
  const int64_t half_bytes = layout::Align16(T * w.cols * 2);
  if ((!as_uploaded && !Grow(&w_half_, &w_half_bytes_, w.rows * w.cols * 2)) ||
      !Grow(&x_half_, &x_half_bytes_, half_bytes + T * 4))
    return;
  uint16_t* xh = static_cast<uint16_t*>(x_half_);
  float* row_scale = reinterpret_cast<float*>(static_cast<char*>(x_half_) + half_bytes);
  if (!as_uploaded) {
    WithType(w.dtype, [&]<DType D>() {
      Launch(DecodeToHalfKernel<D>, Blocks(w.rows * ((w.cols + 31) / 32), 256), 256, launch_, wd,
             w.row_bytes, w.rows, w.cols, w.scales, static_cast<__half*>(w_half_));
    });
  }
  Launch(bf16 ? RowsTo16Kernel<true> : RowsTo16Kernel<false>, T, 256, launch_, x, w.cols, xh,
         row_scale, ep.accumulate ? y : nullptr, w.rows);
  Note(cudaGetLastError());
  const void* wh = as_uploaded ? w.data : w_half_;
  const int ldw = static_cast<int>(as_uploaded ? w.row_bytes / 2 : w.cols);
  const cudaDataType type = bf16 ? CUDA_R_16BF : CUDA_R_16F;
  const float one = 1.f, beta = ep.accumulate ? 1.f : 0.f;
  // Column-major: Y^T [rows, T] = W^T^T [rows, cols] x X^T [cols, T] (+ Y^T).
  const cublasStatus_t s = cublasGemmEx(
      blas_, CUBLAS_OP_T, CUBLAS_OP_N, static_cast<int>(w.rows), static_cast<int>(T),
      static_cast<int>(w.cols), &one, wh, type, ldw, xh, type, static_cast<int>(w.cols), &beta, y,
      CUDA_R_32F, static_cast<int>(w.rows), CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
  ++launches_;  // (counted as one kernel)
  if (s != CUBLAS_STATUS_SUCCESS)
    Keep(Internal(name_ + ": cublasGemmEx failed (" + std::to_string(s) + ")"));
  if (bf16) {
    AddBiasRows(y, ep.bias, T, w.rows);
  } else {
    Launch(GemmStoreKernel, Blocks(T * w.rows, 256), 256, launch_, row_scale, ep.bias, T,
           w.rows, y);
    Note(cudaGetLastError());
  }
  if (ep.slots.rows) SlotSum(ep.slots.rows, ep.slots.w, T, ep.slots.k, w.rows, y);
}

}  // namespace
}  // namespace peng::backend::cuda
