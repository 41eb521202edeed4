#include "formats/npy_writer.h"

#include <bit>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <limits>
#include <memory>

namespace peng {
namespace {

constexpr char kMagic[] = "\x93NUMPY";  // 6 bytes, then version 1.0
constexpr size_t kPreludeBytes = 10;    // magic + 2 version bytes + uint16 header length
constexpr size_t kAlign = 64;

struct FileCloser {
  void operator()(std::FILE* f) const { std::fclose(f); }
};

}  // namespace

StatusOr<std::string> NpyHeader(const std::vector<int64_t>& shape) {
  // Python's repr of a tuple: "()", "(3,)", "(2, 3)".
  std::string dims = "(";
  for (size_t i = 0; i < shape.size(); ++i) {
    if (shape[i] < 0) {
      return InvalidArgument("npy shape: dimension " + std::to_string(i) + " is negative (" +
                             std::to_string(shape[i]) + ")");
    }
    if (i > 0) dims += ", ";
    dims += std::to_string(shape[i]);
  }
  if (shape.size() == 1) dims += ",";
  dims += ")";

  std::string dict = "{'descr': '<f4', 'fortran_order': False, 'shape': " + dims + ", }";
  const size_t unpadded = kPreludeBytes + dict.size() + 1;  // + '\n'
  const size_t total = (unpadded + kAlign - 1) / kAlign * kAlign;
  const size_t header_len = total - kPreludeBytes;
  if (header_len > std::numeric_limits<uint16_t>::max()) {
    return InvalidArgument("npy shape: header of " + std::to_string(header_len) +
                           " bytes does not fit format 1.0");
  }
  dict.append(total - unpadded, ' ');
  dict.push_back('\n');

  std::string out(kMagic, 6);
  out.push_back('\x01');
  out.push_back('\x00');
  out.push_back(static_cast<char>(header_len & 0xff));
  out.push_back(static_cast<char>(header_len >> 8));
  out += dict;
  return out;
}

Status WriteNpy(const std::string& path, const float* data, const std::vector<int64_t>& shape) {
  PENG_ASSIGN_OR_RETURN(std::string header, NpyHeader(shape));
  size_t count = 1;
  for (int64_t d : shape) count *= static_cast<size_t>(d);

  std::unique_ptr<std::FILE, FileCloser> f(std::fopen(path.c_str(), "wb"));
  if (!f) return IoError(path + ": cannot open for writing: " + std::strerror(errno));
  bool ok = std::fwrite(header.data(), 1, header.size(), f.get()) == header.size();
  if constexpr (std::endian::native == std::endian::little) {
    if (ok && count > 0) ok = std::fwrite(data, sizeof(float), count, f.get()) == count;
  } else {
    for (size_t i = 0; ok && i < count; ++i) {
      uint32_t bits = std::bit_cast<uint32_t>(data[i]);
      bits = (bits >> 24) | ((bits >> 8) & 0xff00u) | ((bits << 8) & 0xff0000u) | (bits << 24);
      ok = std::fwrite(&bits, 4, 1, f.get()) == 1;
    }
  }
  if (!ok) return IoError(path + ": write failed: " + std::strerror(errno));
  if (std::fclose(f.release()) != 0) {
    return IoError(path + ": close failed: " + std::strerror(errno));
  }
  return OkStatus();
}

}  // namespace peng
