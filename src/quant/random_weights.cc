#include "quant/random_weights.h"

#include <cstring>
#include <vector>

#include "core/half.h"

namespace peng {

Status FillRandomWeights(DType t, int64_t n, uint8_t* out, std::mt19937_64* rng, float lo,
                         float hi) {
  std::uniform_real_distribution<float> u(lo, hi), scale(0.001f, 0.02f);
  switch (t) {
    case DType::kF32:
      for (int64_t i = 0; i < n; ++i) {
        const float v = u(*rng);
        std::memcpy(out + 4 * i, &v, 4);
      }
      return OkStatus();
    case DType::kF16:
    case DType::kBF16:
      for (int64_t i = 0; i < n; ++i) {
        const float v = u(*rng);
        const uint16_t h = t == DType::kF16 ? F32ToF16(v) : F32ToBf16(v);
        std::memcpy(out + 2 * i, &h, 2);
      }
      return OkStatus();
    default:
      break;
  }
  // Offsets of the fp16 scale fields in one block (kernels/quant_blocks.h).
  std::vector<int> fields;
  switch (t) {
    case DType::kI8: break;
    case DType::kQ4_0: case DType::kQ5_0: case DType::kQ8_0: fields = {0}; break;
    case DType::kQ4_1: case DType::kQ5_1: case DType::kQ4_K: case DType::kQ5_K:
      fields = {0, 2};
      break;
    case DType::kQ6_K: fields = {208}; break;
    default:
      return Unimplemented(std::string("random weights of type ") + DTypeName(t));
  }
  const DTypeInfo& info = GetDTypeInfo(t);
  if (n % info.block_size != 0)
    return InvalidArgument("random weights: " + std::to_string(n) + " values are not whole " +
                           DTypeName(t) + " blocks");
  const size_t bytes = RowBytes(t, n);
  for (size_t i = 0; i < bytes; i += 8) {
    const uint64_t r = (*rng)();
    std::memcpy(out + i, &r, std::min<size_t>(8, bytes - i));
  }
  if (t == DType::kI8)  // symmetric, as peng quantize writes them (the INT8 kernels rely on it)
    for (size_t i = 0; i < bytes; ++i)
      if (out[i] == 0x80) out[i] = 0x81;
  for (size_t b = 0; b < bytes / info.block_bytes; ++b)
    for (int f : fields) {
      const uint16_t h = F32ToF16(scale(*rng));
      std::memcpy(out + b * info.block_bytes + f, &h, 2);
    }
  return OkStatus();
}

}  // namespace peng
