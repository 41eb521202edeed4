// ARMv8.0 NEON INT8 kernels (Isa::kNeon; built with -march=armv8-a, so the W8A8 int8 dot
// products go through vmull/vpadal): the shared code of cpu/int8_neon_impl.h at this level.
// Compiled only on aarch64.
#if defined(__aarch64__)

#include "kernels/cpu/int8_neon_impl.h"

namespace peng::kernels {

Int8Kernels NeonInt8Kernels() { return BaseInt8Kernels(); }

}  // namespace peng::kernels

#endif  // __aarch64__
