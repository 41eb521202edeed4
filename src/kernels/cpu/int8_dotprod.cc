// Dot-product extension INT8 kernels (Isa::kNeonDot; built with armv8.2-a+dotprod+fp16, so the
// W8A8 int8 dot products are sdot): the shared code of cpu/int8_neon_impl.h at this level.
// Compiled only on aarch64.
#if defined(__aarch64__)

#include "kernels/cpu/int8_neon_impl.h"

#if !defined(__ARM_FEATURE_DOTPROD)
#error "int8_dotprod.cc must be built with +dotprod (cmake/PengLibrary.cmake)"
#endif

namespace peng::kernels {

Int8Kernels NeonDotInt8Kernels() { return BaseInt8Kernels(); }

}  // namespace peng::kernels

#endif  // __aarch64__
