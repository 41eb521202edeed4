// SafetensorsWriter: writes one .safetensors file (8-byte little-endian header length, JSON
// header {name: {dtype, shape, data_offsets}, "__metadata__": {...}} padded with spaces to a
// multiple of 8, then the tensor bytes) without holding the tensors in memory: every tensor is
// declared first (Add), the header is written by Begin, then each tensor's bytes are streamed
// in declaration order (Write). Only plain dtypes (F32, F16, BF16, F64, I8..I64). Errors come
// back as Status naming the file; Finish checks that everything declared was written.
#pragma once

#include <cstdint>
#include <cstdio>
#include <map>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "core/status.h"

namespace peng {

class SafetensorsWriter {
 public:
  explicit SafetensorsWriter(std::string path) : path_(std::move(path)) {}
  ~SafetensorsWriter();
  SafetensorsWriter(const SafetensorsWriter&) = delete;
  SafetensorsWriter& operator=(const SafetensorsWriter&) = delete;

  Status Add(const std::string& name, DType dtype, const std::vector<int64_t>& shape);
  Status Begin(const std::map<std::string, std::string>& metadata = {});
  // The next declared tensor's bytes (exactly its size), possibly in several calls.
  Status Write(const void* data, size_t size);
  Status Finish();

  int64_t total_bytes() const { return data_bytes_; }

 private:
  struct Entry {
    std::string name;
    DType dtype;
    std::vector<int64_t> shape;
    uint64_t begin = 0, end = 0;
  };
  std::string path_;
  std::vector<Entry> entries_;
  std::map<std::string, size_t> index_;
  uint64_t data_bytes_ = 0;
  std::FILE* f_ = nullptr;
  size_t next_ = 0;        // entry being written
  uint64_t written_ = 0;   // bytes of data written so far
};

}  // namespace peng
