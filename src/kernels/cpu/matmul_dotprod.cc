// Dot-product extension matmul kernels (Isa::kNeonDot; built with armv8.2-a+dotprod+fp16, so
// Dot() is one sdot per 16 int8 pairs): the shared code of cpu/matmul_neon_impl.h at this level.
// Kunpeng 920 / Neoverse N1 class. Compiled only on aarch64.
#if defined(__aarch64__)

#include "kernels/cpu/matmul_neon_impl.h"

#if !defined(__ARM_FEATURE_DOTPROD)
#error "matmul_dotprod.cc must be built with +dotprod (cmake/PengLibrary.cmake)"
#endif

namespace peng::kernels {

MatMulKernel NeonDotMatMulKernel(DType t) { return BaseMatMulKernel(t); }

}  // namespace peng::kernels

#endif  // __aarch64__
