// MappedFile: a read-only memory map of a whole file (model weights are read in place, never
// copied). Owns the mapping; movable, not copyable. Reading the bytes is thread-safe.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "core/status.h"

namespace peng {

class MappedFile {
 public:
  static StatusOr<MappedFile> Open(const std::string& path);
  MappedFile() = default;
  MappedFile(MappedFile&& o) noexcept;
  MappedFile& operator=(MappedFile&& o) noexcept;
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;
  ~MappedFile();

  const uint8_t* data() const { return data_; }
  size_t size() const { return size_; }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
  const uint8_t* data_ = nullptr;
  size_t size_ = 0;
};

// True if `path` names an existing directory.
bool IsDirectory(const std::string& path);
// True if `path` names an existing file (of any kind).
bool PathExists(const std::string& path);

// Reads a whole (small) file into a string, e.g. config.json.
StatusOr<std::string> ReadFileToString(const std::string& path);

}  // namespace peng
