// Element types of tensors, including GGML block-quantized formats. A quantized type packs
// `block_size` values into `block_bytes` bytes; rows of a weight matrix are whole blocks.
// The numeric values of GgmlType are those of the GGUF file format (a fact of the format).
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string_view>

namespace peng {

enum class DType : uint8_t {
  kF32,
  kF16,
  kBF16,
  kF64,
  kI8,
  kI16,
  kI32,
  kI64,
  kQ4_0,
  kQ4_1,
  kQ5_0,
  kQ5_1,
  kQ8_0,
  kQ8_1,
  kQ2_K,
  kQ3_K,
  kQ4_K,
  kQ5_K,
  kQ6_K,
  kQ8_K,
  kCount,
};

struct DTypeInfo {
  const char* name;     // "Q4_K"
  int block_size;       // values per block (1 for plain types)
  int block_bytes;      // bytes per block
  bool quantized;
};

const DTypeInfo& GetDTypeInfo(DType t);
inline const char* DTypeName(DType t) { return GetDTypeInfo(t).name; }

// Bytes needed for `n` values of type t; n must be a multiple of the block size.
size_t RowBytes(DType t, int64_t n);

// GGUF/GGML tensor type id -> DType (nullopt for types we do not support).
std::optional<DType> DTypeFromGgml(uint32_t ggml_type);
uint32_t GgmlTypeOf(DType t);
// safetensors dtype string ("F32", "BF16", ...) -> DType.
std::optional<DType> DTypeFromSafetensors(std::string_view s);

}  // namespace peng
