#include "kernels/quant_blocks.h"
namespace peng::kernels {
MatMulKernel NeonMatMulKernel(DType) { return nullptr; }
QuantizeActFn NeonQuantizeAct() { return nullptr; }
}  // namespace peng::kernels
