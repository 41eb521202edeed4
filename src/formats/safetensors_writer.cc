#include "formats/safetensors_writer.h"

#include <cerrno>
#include <cstring>

#include <nlohmann/json.hpp>

namespace peng {

SafetensorsWriter::~SafetensorsWriter() {
  if (f_) std::fclose(f_);
}

Status SafetensorsWriter::Add(const std::string& name, DType dtype,
                              const std::vector<int64_t>& shape) {
  if (f_) return Internal(path_ + ": tensor '" + name + "' added after Begin");
  if (GetDTypeInfo(dtype).quantized || !DTypeFromSafetensors(DTypeName(dtype)))
    return InvalidArgument(path_ + ": tensor '" + name + "': safetensors cannot hold " +
                           DTypeName(dtype));
  if (name.empty() || name == "__metadata__" || index_.count(name))
    return InvalidArgument(path_ + ": invalid or duplicate tensor name '" + name + "'");
  int64_t n = 1;
  for (int64_t d : shape) {
    if (d < 0) return InvalidArgument(path_ + ": tensor '" + name + "' has a negative dim");
    n *= d;
  }
  Entry e{name, dtype, shape, data_bytes_, data_bytes_ + RowBytes(dtype, n)};
  data_bytes_ = e.end;
  index_[name] = entries_.size();
  entries_.push_back(std::move(e));
  return OkStatus();
}

Status SafetensorsWriter::Begin(const std::map<std::string, std::string>& metadata) {
  nlohmann::ordered_json h = nlohmann::ordered_json::object();
  if (!metadata.empty()) h["__metadata__"] = metadata;
  for (const Entry& e : entries_)
    h[e.name] = {{"dtype", DTypeName(e.dtype)}, {"shape", e.shape},
                 {"data_offsets", {e.begin, e.end}}};
  std::string text = h.dump();
  text.append((8 - text.size() % 8) % 8, ' ');
  f_ = std::fopen(path_.c_str(), "wb");
  if (!f_) return IoError("cannot create " + path_ + ": " + std::strerror(errno));
  uint8_t len[8];
  uint64_t n = text.size();
  for (int i = 0; i < 8; ++i) len[i] = static_cast<uint8_t>(n >> (8 * i));
  if (std::fwrite(len, 1, 8, f_) != 8 || std::fwrite(text.data(), 1, n, f_) != n)
    return IoError("cannot write " + path_ + ": " + std::strerror(errno));
  return OkStatus();
}

Status SafetensorsWriter::Write(const void* data, size_t size) {
  if (!f_) return Internal(path_ + ": Write before Begin");
  while (size > 0) {
    if (next_ >= entries_.size())
      return Internal(path_ + ": more data written than declared");
    const Entry& e = entries_[next_];
    const size_t take = std::min<uint64_t>(size, e.end - written_);
    if (take > 0 && std::fwrite(data, 1, take, f_) != take)
      return IoError("cannot write " + path_ + ": " + std::strerror(errno));
    written_ += take;
    data = static_cast<const uint8_t*>(data) + take;
    size -= take;
    while (next_ < entries_.size() && written_ == entries_[next_].end) ++next_;
  }
  return OkStatus();
}

Status SafetensorsWriter::Finish() {
  if (!f_) return Internal(path_ + ": Finish before Begin");
  while (next_ < entries_.size() && written_ == entries_[next_].end) ++next_;  // empty tensors
  if (next_ != entries_.size() || written_ != data_bytes_)
    return Internal(path_ + ": tensor '" + entries_[next_].name +
                              "' was declared but not written");
  const bool ok = std::fclose(f_) == 0;
  f_ = nullptr;
  if (!ok) return IoError("cannot write " + path_ + ": " + std::strerror(errno));
  return OkStatus();
}

}  // namespace peng
