// Readers for Hugging Face safetensors checkpoints. SafetensorsFile memory-maps one file (an
// 8-byte little-endian header length N, N bytes of JSON {name: {dtype, shape, data_offsets},
// "__metadata__": {str: str}}, then the data) and hands out TensorViews pointing into the
// mapping. SafetensorsModel opens a checkpoint directory: a single `model.safetensors`, or
// `model.safetensors.index.json` ({"weight_map": {tensor: shard file}}) and all its shards.
// Every length, offset and shape is checked against the file, so corrupt input yields a
// Status naming the (shard) file and the problem, never a crash or an exception. Immutable
// after Open(); safe to read from many threads. The file/model object must outlive the
// TensorViews it hands out.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "core/mapped_file.h"
#include "core/status.h"
#include "core/tensor.h"

namespace peng {

class SafetensorsFile {
 public:
  // Headers larger than this are rejected as corrupt (the reference implementation's limit).
  static constexpr uint64_t kMaxHeaderBytes = 100u << 20;

  // huge_pages: read into huge-page memory instead of mapping in place (MappedFile::Open).
  static StatusOr<std::unique_ptr<SafetensorsFile>> Open(const std::string& path,
                                                         bool huge_pages = false);
  // Parses an in-memory image (fuzzing, tests); `name` is used in error messages. The bytes
  // must outlive the SafetensorsFile.
  static StatusOr<std::unique_ptr<SafetensorsFile>> FromBytes(const uint8_t* data, size_t size,
                                                              const std::string& name);

  const std::string& path() const { return name_; }
  // The "__metadata__" object.
  const std::map<std::string, std::string>& metadata() const { return metadata_; }
  // Tensors in the order of their data in the file (ties by name).
  const std::vector<TensorView>& tensors() const { return tensors_; }
  const TensorView* FindTensor(const std::string& name) const;

 private:
  SafetensorsFile() = default;
  Status Parse(const uint8_t* data, size_t size);

  std::string name_;
  MappedFile file_;
  std::map<std::string, std::string> metadata_;
  std::vector<TensorView> tensors_;
  std::map<std::string, size_t> tensor_index_;
};

class SafetensorsModel {
 public:
  // `path`: a directory holding model.safetensors.index.json (preferred) or model.safetensors,
  // or the path of a single .safetensors file.
  static StatusOr<std::unique_ptr<SafetensorsModel>> Open(const std::string& path,
                                                          bool huge_pages = false);

  // All tensors of all shards (shards in name order, each in file order).
  const std::vector<TensorView>& tensors() const { return tensors_; }
  const TensorView* FindTensor(const std::string& name) const;
  const std::vector<std::unique_ptr<SafetensorsFile>>& shards() const { return shards_; }

 private:
  SafetensorsModel() = default;
  Status AddShard(std::unique_ptr<SafetensorsFile> shard);
  Status OpenIndex(const std::string& dir, const std::string& index_path, bool huge_pages);

  std::vector<std::unique_ptr<SafetensorsFile>> shards_;
  std::vector<TensorView> tensors_;
  std::vector<size_t> shard_of_;         // per entry of tensors_
  std::map<std::string, size_t> index_;  // name -> entry of tensors_
};

}  // namespace peng
