#include "core/mapped_file.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <sstream>

namespace peng {

namespace {

constexpr size_t kHugePage = size_t{2} << 20;

// Private, 2 MiB aligned memory of `size` bytes (a whole number of huge pages) that asks for
// transparent huge pages; null when the kernel refuses the mapping.
uint8_t* MapHugePages(size_t size) {
  const size_t span = size + kHugePage;  // room to align the start
  void* raw = ::mmap(nullptr, span, PROT_READ | PROT_WRITE,
                     MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (raw == MAP_FAILED) return nullptr;
  const uintptr_t base = reinterpret_cast<uintptr_t>(raw);
  const uintptr_t start = (base + kHugePage - 1) & ~(kHugePage - 1);
  if (start > base) ::munmap(raw, start - base);
  const uintptr_t end = start + size, raw_end = base + span;
  if (raw_end > end) ::munmap(reinterpret_cast<void*>(end), raw_end - end);
  uint8_t* p = reinterpret_cast<uint8_t*>(start);
  ::madvise(p, size, MADV_HUGEPAGE);
  return p;
}

// Reads the `size` bytes of `fd` into `dst`; returns "" or what went wrong. (Most of the time
// goes to the kernel's zeroing of the fresh huge pages, not to the copy; more threads made it
// slower on the test machine's VM.)
std::string ReadAll(int fd, uint8_t* dst, size_t size) {
  size_t at = 0;
  while (at < size) {
    const ssize_t n = ::pread(fd, dst + at, size - at, static_cast<off_t>(at));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return n < 0 ? std::strerror(errno) : "the file ended early";
    at += static_cast<size_t>(n);
  }
  return "";
}

}  // namespace

std::shared_ptr<uint8_t> AllocateHugePages(size_t bytes) {
  const size_t mapped = (std::max<size_t>(bytes, 1) + kHugePage - 1) & ~(kHugePage - 1);
  uint8_t* p = MapHugePages(mapped);
  if (!p) return nullptr;
  return std::shared_ptr<uint8_t>(p, [mapped](uint8_t* q) { ::munmap(q, mapped); });
}

bool TransparentHugePagesAvailable() {
  std::ifstream in("/sys/kernel/mm/transparent_hugepage/enabled");
  std::string line;
  std::getline(in, line);
  return line.find("[always]") != std::string::npos || line.find("[madvise]") != std::string::npos;
}

StatusOr<MappedFile> MappedFile::Open(const std::string& path, bool huge_pages) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return IoError(path + ": cannot open: " + std::strerror(errno));
  struct stat st;
  if (::fstat(fd, &st) != 0) {
    int e = errno;
    ::close(fd);
    return IoError(path + ": cannot stat: " + std::strerror(e));
  }
  if (!S_ISREG(st.st_mode)) {
    ::close(fd);
    return InvalidArgument(path + ": not a regular file");
  }
  MappedFile f;
  f.path_ = path;
  f.size_ = static_cast<size_t>(st.st_size);
  uint8_t* copy = nullptr;
  if (f.size_ > 0 && huge_pages && TransparentHugePagesAvailable()) {
    const size_t mapped = (f.size_ + kHugePage - 1) & ~(kHugePage - 1);
    copy = MapHugePages(mapped);
    const std::string why = copy ? ReadAll(fd, copy, f.size_) : "";
    if (!why.empty()) {
      ::munmap(copy, mapped);
      ::close(fd);
      return IoError(path + ": cannot read: " + why);
    }
    if (copy) {
      ::mprotect(copy, mapped, PROT_READ);
      f.data_ = copy;
      f.mapped_ = mapped;
      f.huge_pages_ = true;
    }
  }
  if (f.size_ > 0 && !copy) {
    void* p = ::mmap(nullptr, f.size_, PROT_READ, MAP_SHARED, fd, 0);
    if (p == MAP_FAILED) {
      int e = errno;
      ::close(fd);
      return IoError(path + ": mmap failed: " + std::strerror(e));
    }
    f.data_ = static_cast<const uint8_t*>(p);
    f.mapped_ = f.size_;
  }
  ::close(fd);
  return f;
}

MappedFile::MappedFile(MappedFile&& o) noexcept { *this = std::move(o); }

MappedFile& MappedFile::operator=(MappedFile&& o) noexcept {
  if (this != &o) {
    if (data_) ::munmap(const_cast<uint8_t*>(data_), mapped_);
    path_ = std::move(o.path_);
    data_ = o.data_;
    size_ = o.size_;
    mapped_ = o.mapped_;
    huge_pages_ = o.huge_pages_;
    o.data_ = nullptr;
    o.size_ = o.mapped_ = 0;
    o.huge_pages_ = false;
  }
  return *this;
}

MappedFile::~MappedFile() {
  if (data_) ::munmap(const_cast<uint8_t*>(data_), mapped_);
}

bool IsDirectory(const std::string& path) {
  struct stat st;
  return ::stat(path.c_str(), &st) == 0 && S_ISDIR(st.st_mode);
}

bool PathExists(const std::string& path) {
  struct stat st;
  return ::stat(path.c_str(), &st) == 0;
}

StatusOr<std::string> ReadFileToString(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return IoError(path + ": cannot open");
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

}  // namespace peng
