// GgufFile: a reader for GGUF v2/v3 model files (llama.cpp's container format). The file is
// memory-mapped; metadata is parsed into typed values and tensor infos into TensorViews that
// point into the mapping (shapes converted to PyTorch order, outermost first). Every count,
// string length, offset and size is checked against the file, so a corrupt or truncated file
// yields a Status naming the file and the problem, never a crash. Immutable after Open();
// safe to read from many threads. The GgufFile must outlive the TensorViews it hands out.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <variant>
#include <vector>

#include "core/mapped_file.h"
#include "core/status.h"
#include "core/tensor.h"

namespace peng {

// A metadata value. Integer types are widened (the original GGUF type is kept in `type`).
struct GgufValue {
  enum class Type : uint32_t {
    kU8 = 0, kI8 = 1, kU16 = 2, kI16 = 3, kU32 = 4, kI32 = 5, kF32 = 6, kBool = 7,
    kString = 8, kArray = 9, kU64 = 10, kI64 = 11, kF64 = 12,
  };
  Type type = Type::kU8;
  Type elem_type = Type::kU8;  // for arrays
  // Scalars: int64 (all integer types and bool; u64 values above INT64_MAX are rejected),
  // double (f32/f64), string. Arrays: one of the vectors.
  std::variant<int64_t, double, std::string, std::vector<int64_t>, std::vector<double>,
               std::vector<std::string>>
      value;
};

class GgufFile {
 public:
  // huge_pages: read into huge-page memory instead of mapping in place (MappedFile::Open).
  static StatusOr<std::unique_ptr<GgufFile>> Open(const std::string& path, bool huge_pages = false);
  // Parses an in-memory image (fuzzing, tests); `name` is used in error messages. The bytes
  // must outlive the GgufFile.
  static StatusOr<std::unique_ptr<GgufFile>> FromBytes(const uint8_t* data, size_t size,
                                                       const std::string& name);

  const std::string& path() const { return name_; }
  uint32_t version() const { return version_; }
  size_t alignment() const { return alignment_; }

  // Metadata.
  const std::map<std::string, GgufValue>& metadata() const { return kv_; }
  bool Has(const std::string& key) const { return kv_.count(key) != 0; }
  std::optional<std::string> GetString(const std::string& key) const;
  std::optional<int64_t> GetInt(const std::string& key) const;      // any integer type or bool
  std::optional<double> GetFloat(const std::string& key) const;     // f32/f64 or any integer
  std::optional<bool> GetBool(const std::string& key) const;
  const std::vector<std::string>* GetStringArray(const std::string& key) const;
  const std::vector<int64_t>* GetIntArray(const std::string& key) const;
  const std::vector<double>* GetFloatArray(const std::string& key) const;

  // Tensors (in file order); data points into the mapping.
  const std::vector<TensorView>& tensors() const { return tensors_; }
  const TensorView* FindTensor(const std::string& name) const;

 private:
  GgufFile() = default;
  Status Parse(const uint8_t* data, size_t size);

  std::string name_;
  MappedFile file_;
  uint32_t version_ = 0;
  size_t alignment_ = 32;
  std::map<std::string, GgufValue> kv_;
  std::vector<TensorView> tensors_;
  std::map<std::string, size_t> tensor_index_;
};

}  // namespace peng
