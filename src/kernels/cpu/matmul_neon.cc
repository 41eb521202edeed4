// ARMv8.0 NEON matmul kernels (Isa::kNeon; built with -march=armv8-a, so int8 dot products go
// through vmull/vpadal): the shared code of cpu/matmul_neon_impl.h at this level, and the NEON
// activation quantization every ARM64 level uses. Compiled only on aarch64.
#if defined(__aarch64__)

#include "kernels/cpu/matmul_neon_impl.h"

namespace peng::kernels {

MatMulKernel NeonMatMulKernel(DType t) { return BaseMatMulKernel(t); }

QuantizeActFn NeonQuantizeAct() { return &QuantizeAct; }

}  // namespace peng::kernels

#endif  // __aarch64__
