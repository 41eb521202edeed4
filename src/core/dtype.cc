#include "core/dtype.h"

#include <array>

#include "core/check.h"

namespace peng {
namespace {

struct Entry {
  DType dtype;
  uint32_t ggml;
  DTypeInfo info;
};

// GGML type ids, block sizes and block byte counts are facts of the GGUF format.
constexpr std::array<Entry, static_cast<size_t>(DType::kCount)> kTable = {{
    {DType::kF32, 0, {"F32", 1, 4, false}},
    {DType::kF16, 1, {"F16", 1, 2, false}},
    {DType::kBF16, 30, {"BF16", 1, 2, false}},
    {DType::kF64, 28, {"F64", 1, 8, false}},
    {DType::kI8, 24, {"I8", 1, 1, false}},
    {DType::kI16, 25, {"I16", 1, 2, false}},
    {DType::kI32, 26, {"I32", 1, 4, false}},
    {DType::kI64, 27, {"I64", 1, 8, false}},
    {DType::kQ4_0, 2, {"Q4_0", 32, 18, true}},
    {DType::kQ4_1, 3, {"Q4_1", 32, 20, true}},
    {DType::kQ5_0, 6, {"Q5_0", 32, 22, true}},
    {DType::kQ5_1, 7, {"Q5_1", 32, 24, true}},
    {DType::kQ8_0, 8, {"Q8_0", 32, 34, true}},
    {DType::kQ8_1, 9, {"Q8_1", 32, 36, true}},
    {DType::kQ2_K, 10, {"Q2_K", 256, 84, true}},
    {DType::kQ3_K, 11, {"Q3_K", 256, 110, true}},
    {DType::kQ4_K, 12, {"Q4_K", 256, 144, true}},
    {DType::kQ5_K, 13, {"Q5_K", 256, 176, true}},
    {DType::kQ6_K, 14, {"Q6_K", 256, 210, true}},
    {DType::kQ8_K, 15, {"Q8_K", 256, 292, true}},
}};

}  // namespace

const DTypeInfo& GetDTypeInfo(DType t) {
  size_t i = static_cast<size_t>(t);
  PENG_CHECK(i < kTable.size() && kTable[i].dtype == t);
  return kTable[i].info;
}

size_t RowBytes(DType t, int64_t n) {
  const DTypeInfo& info = GetDTypeInfo(t);
  PENG_CHECK(n % info.block_size == 0);
  return static_cast<size_t>(n / info.block_size) * info.block_bytes;
}

std::optional<DType> DTypeFromGgml(uint32_t ggml_type) {
  for (const Entry& e : kTable)
    if (e.ggml == ggml_type) return e.dtype;
  return std::nullopt;
}

uint32_t GgmlTypeOf(DType t) { return kTable[static_cast<size_t>(t)].ggml; }

std::optional<DType> DTypeFromSafetensors(std::string_view s) {
  if (s == "F32") return DType::kF32;
  if (s == "F16") return DType::kF16;
  if (s == "BF16") return DType::kBF16;
  if (s == "F64") return DType::kF64;
  if (s == "I8") return DType::kI8;
  if (s == "I16") return DType::kI16;
  if (s == "I32") return DType::kI32;
  if (s == "I64") return DType::kI64;
  return std::nullopt;
}

}  // namespace peng
