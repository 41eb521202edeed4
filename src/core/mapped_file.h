// MappedFile: the read-only bytes of a whole file, either mapped in place (the page cache's
// pages, shared with every process that maps the file) or read once into private memory backed
// by transparent huge pages (MADV_HUGEPAGE, 2 MiB aligned). Decoding streams every weight
// once per token; with 4 KiB pages that is a TLB miss per 4 KiB, and MoE decoding, which jumps
// between the selected experts' slices of a stacked tensor, measured 15% faster from huge
// pages (docs/benchmarks.md). Owns the memory; movable, not copyable. Reading is thread-safe.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "core/status.h"

namespace peng {

class MappedFile {
 public:
  // huge_pages: read the file into private huge-page memory (when the kernel has transparent
  // huge pages; otherwise, and for an empty file, it is mapped in place).
  static StatusOr<MappedFile> Open(const std::string& path, bool huge_pages = false);
  MappedFile() = default;
  MappedFile(MappedFile&& o) noexcept;
  MappedFile& operator=(MappedFile&& o) noexcept;
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;
  ~MappedFile();

  const uint8_t* data() const { return data_; }
  size_t size() const { return size_; }
  const std::string& path() const { return path_; }
  // True when the bytes were read into huge-page memory (Open's huge_pages, granted).
  bool in_huge_pages() const { return huge_pages_; }

 private:
  std::string path_;
  const uint8_t* data_ = nullptr;
  size_t size_ = 0;
  size_t mapped_ = 0;  // bytes of the mapping (size_ rounded up to whole huge pages when copied)
  bool huge_pages_ = false;
};

// `bytes` of private, zeroed, 2 MiB aligned memory that asks for transparent huge pages, freed
// with its last owner; null when the kernel refuses the mapping.
std::shared_ptr<uint8_t> AllocateHugePages(size_t bytes);

// True when the kernel grants transparent huge pages to memory that asks for them
// (/sys/kernel/mm/transparent_hugepage/enabled is "always" or "madvise").
bool TransparentHugePagesAvailable();

// True if `path` names an existing directory.
bool IsDirectory(const std::string& path);
// True if `path` names an existing file (of any kind).
bool PathExists(const std::string& path);

// Reads a whole (small) file into a string, e.g. config.json.
StatusOr<std::string> ReadFileToString(const std::string& path);

}  // namespace peng
