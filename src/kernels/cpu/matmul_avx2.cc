#include "kernels/quant_blocks.h"
namespace peng::kernels {
MatMulKernel Avx2MatMulKernel(DType) { return nullptr; }
QuantizeActFn Avx2QuantizeAct() { return nullptr; }
}  // namespace peng::kernels
