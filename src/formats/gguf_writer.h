// GgufWriter: builds a GGUF v3 (or v2) file in memory and writes it out: metadata of every
// value type, then tensor infos, then the tensor data, each tensor padded to the alignment
// (32 unless SetAlignment() is called, which also records `general.alignment`). Metadata and
// tensors are written in the order they were added; adding a key again replaces its value in
// place. Tensor bytes are copied (WriteFile then streams them out without a second copy), so
// the writer suits tests and tools that write small or medium models. Not thread-safe; the
// writer may be reused after Serialize()/WriteFile().
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "core/status.h"
#include "core/tensor.h"
#include "formats/gguf.h"

namespace peng {

class GgufWriter {
 public:
  explicit GgufWriter(uint32_t version = 3);  // 2 or 3 (the encodings are identical)

  // alignment must be a power of two; stored as general.alignment (u32).
  void SetAlignment(uint32_t alignment);
  size_t alignment() const { return alignment_; }

  void AddU8(const std::string& key, uint8_t v);
  void AddI8(const std::string& key, int8_t v);
  void AddU16(const std::string& key, uint16_t v);
  void AddI16(const std::string& key, int16_t v);
  void AddU32(const std::string& key, uint32_t v);
  void AddI32(const std::string& key, int32_t v);
  void AddU64(const std::string& key, uint64_t v);
  void AddI64(const std::string& key, int64_t v);
  void AddF32(const std::string& key, float v);
  void AddF64(const std::string& key, double v);
  void AddBool(const std::string& key, bool v);
  void AddString(const std::string& key, const std::string& v);
  // Arrays. elem_type must be an integer type or kBool (values are truncated to it) ...
  void AddIntArray(const std::string& key, GgufValue::Type elem_type,
                   const std::vector<int64_t>& v);
  // ... kF32 or kF64 ...
  void AddFloatArray(const std::string& key, GgufValue::Type elem_type,
                     const std::vector<double>& v);
  void AddStringArray(const std::string& key, const std::vector<std::string>& v);
  // Any value as read by GgufFile (to copy metadata from one file into another).
  void AddValue(const std::string& key, const GgufValue& v);

  // shape is outermost first (as in TensorView); at most 4 dims, the last a multiple of the
  // block size, size_bytes must equal the size implied by dtype and shape; names are unique.
  Status AddTensor(const std::string& name, DType dtype, const std::vector<int64_t>& shape,
                   const void* data, size_t size_bytes);

  // Declares a tensor whose bytes are produced while writing (WriteFile's `fill`), so that
  // files larger than memory can be written one tensor at a time.
  Status DeclareTensor(const std::string& name, DType dtype, const std::vector<int64_t>& shape);
  // fill(index, name, bytes): `bytes` arrives sized (zeroed) for the declared tensor.
  using FillFn =
      std::function<Status(size_t index, const std::string& name, std::vector<uint8_t>* bytes)>;

  std::vector<uint8_t> Serialize() const;  // declared tensors are written as zeros
  Status WriteFile(const std::string& path, const FillFn& fill = nullptr) const;

 private:
  struct Tensor {
    std::string name;
    DType dtype;
    std::vector<int64_t> shape;
    std::vector<uint8_t> bytes;
    size_t size = 0;
    bool declared = false;  // bytes come from WriteFile's fill callback
  };
  void SetEncoded(const std::string& key, std::vector<uint8_t> encoded);
  // Everything before the tensor data, padded to the alignment.
  std::vector<uint8_t> SerializeHeader() const;

  uint32_t version_;
  size_t alignment_ = 32;
  std::vector<std::pair<std::string, std::vector<uint8_t>>> kv_;  // key, type + payload
  std::map<std::string, size_t> kv_index_;
  std::vector<Tensor> tensors_;
  std::map<std::string, size_t> tensor_index_;
};

}  // namespace peng
