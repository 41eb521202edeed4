#include "formats/gguf_writer.h"

#include <bit>
#include <cstdio>
#include <cstring>
#include <memory>

#include "core/check.h"

namespace peng {
namespace {

using Type = GgufValue::Type;

template <typename T>
void Put(std::vector<uint8_t>* out, T v) {
  const size_t n = out->size();
  out->resize(n + sizeof(T));
  std::memcpy(out->data() + n, &v, sizeof(T));
}

void PutString(std::vector<uint8_t>* out, const std::string& s) {
  Put<uint64_t>(out, s.size());
  out->insert(out->end(), s.begin(), s.end());
}

void PutType(std::vector<uint8_t>* out, Type t) { Put<uint32_t>(out, static_cast<uint32_t>(t)); }

void PutInt(std::vector<uint8_t>* out, Type t, int64_t v) {
  switch (t) {
    case Type::kU8: Put<uint8_t>(out, static_cast<uint8_t>(v)); break;
    case Type::kI8: Put<int8_t>(out, static_cast<int8_t>(v)); break;
    case Type::kU16: Put<uint16_t>(out, static_cast<uint16_t>(v)); break;
    case Type::kI16: Put<int16_t>(out, static_cast<int16_t>(v)); break;
    case Type::kU32: Put<uint32_t>(out, static_cast<uint32_t>(v)); break;
    case Type::kI32: Put<int32_t>(out, static_cast<int32_t>(v)); break;
    case Type::kU64: Put<uint64_t>(out, static_cast<uint64_t>(v)); break;
    case Type::kI64: Put<int64_t>(out, v); break;
    case Type::kBool: Put<uint8_t>(out, v != 0 ? 1 : 0); break;
    default: PENG_CHECK_MSG(false, "not an integer GGUF type");
  }
}

void PutFloat(std::vector<uint8_t>* out, Type t, double v) {
  PENG_CHECK(t == Type::kF32 || t == Type::kF64);
  if (t == Type::kF32) {
    Put<float>(out, static_cast<float>(v));
  } else {
    Put<double>(out, v);
  }
}

std::vector<uint8_t> EncodeInt(Type t, int64_t v) {
  std::vector<uint8_t> out;
  PutType(&out, t);
  PutInt(&out, t, v);
  return out;
}

std::vector<uint8_t> EncodeFloat(Type t, double v) {
  std::vector<uint8_t> out;
  PutType(&out, t);
  PutFloat(&out, t, v);
  return out;
}

size_t AlignUp(size_t n, size_t a) { return (n + a - 1) & ~(a - 1); }

}  // namespace

GgufWriter::GgufWriter(uint32_t version) : version_(version) {
  PENG_CHECK(version == 2 || version == 3);
}

void GgufWriter::SetAlignment(uint32_t alignment) {
  PENG_CHECK(alignment > 0 && std::has_single_bit(alignment));
  alignment_ = alignment;
  AddU32("general.alignment", alignment);
}

void GgufWriter::SetEncoded(const std::string& key, std::vector<uint8_t> encoded) {
  auto it = kv_index_.find(key);
  if (it != kv_index_.end()) {
    kv_[it->second].second = std::move(encoded);
    return;
  }
  kv_index_.emplace(key, kv_.size());
  kv_.emplace_back(key, std::move(encoded));
}

void GgufWriter::AddU8(const std::string& k, uint8_t v) { SetEncoded(k, EncodeInt(Type::kU8, v)); }
void GgufWriter::AddI8(const std::string& k, int8_t v) { SetEncoded(k, EncodeInt(Type::kI8, v)); }
void GgufWriter::AddU16(const std::string& k, uint16_t v) { SetEncoded(k, EncodeInt(Type::kU16, v)); }
void GgufWriter::AddI16(const std::string& k, int16_t v) { SetEncoded(k, EncodeInt(Type::kI16, v)); }
void GgufWriter::AddU32(const std::string& k, uint32_t v) { SetEncoded(k, EncodeInt(Type::kU32, v)); }
void GgufWriter::AddI32(const std::string& k, int32_t v) { SetEncoded(k, EncodeInt(Type::kI32, v)); }
void GgufWriter::AddU64(const std::string& k, uint64_t v) {
  SetEncoded(k, EncodeInt(Type::kU64, static_cast<int64_t>(v)));
}
void GgufWriter::AddI64(const std::string& k, int64_t v) { SetEncoded(k, EncodeInt(Type::kI64, v)); }
void GgufWriter::AddF32(const std::string& k, float v) { SetEncoded(k, EncodeFloat(Type::kF32, v)); }
void GgufWriter::AddF64(const std::string& k, double v) { SetEncoded(k, EncodeFloat(Type::kF64, v)); }
void GgufWriter::AddBool(const std::string& k, bool v) { SetEncoded(k, EncodeInt(Type::kBool, v)); }

void GgufWriter::AddString(const std::string& key, const std::string& v) {
  std::vector<uint8_t> out;
  PutType(&out, Type::kString);
  PutString(&out, v);
  SetEncoded(key, std::move(out));
}

void GgufWriter::AddIntArray(const std::string& key, Type elem_type,
                             const std::vector<int64_t>& v) {
  std::vector<uint8_t> out;
  PutType(&out, Type::kArray);
  PutType(&out, elem_type);
  Put<uint64_t>(&out, v.size());
  for (int64_t x : v) PutInt(&out, elem_type, x);
  SetEncoded(key, std::move(out));
}

void GgufWriter::AddFloatArray(const std::string& key, Type elem_type,
                               const std::vector<double>& v) {
  std::vector<uint8_t> out;
  PutType(&out, Type::kArray);
  PutType(&out, elem_type);
  Put<uint64_t>(&out, v.size());
  for (double x : v) PutFloat(&out, elem_type, x);
  SetEncoded(key, std::move(out));
}

void GgufWriter::AddStringArray(const std::string& key, const std::vector<std::string>& v) {
  std::vector<uint8_t> out;
  PutType(&out, Type::kArray);
  PutType(&out, Type::kString);
  Put<uint64_t>(&out, v.size());
  for (const std::string& s : v) PutString(&out, s);
  SetEncoded(key, std::move(out));
}

void GgufWriter::AddValue(const std::string& key, const GgufValue& v) {
  if (v.type == Type::kArray) {
    if (auto* s = std::get_if<std::vector<std::string>>(&v.value)) return AddStringArray(key, *s);
    if (auto* d = std::get_if<std::vector<double>>(&v.value)) {
      return AddFloatArray(key, v.elem_type, *d);
    }
    return AddIntArray(key, v.elem_type, std::get<std::vector<int64_t>>(v.value));
  }
  if (v.type == Type::kString) return AddString(key, std::get<std::string>(v.value));
  if (v.type == Type::kF32 || v.type == Type::kF64) {
    return SetEncoded(key, EncodeFloat(v.type, std::get<double>(v.value)));
  }
  SetEncoded(key, EncodeInt(v.type, std::get<int64_t>(v.value)));
}

Status GgufWriter::AddTensor(const std::string& name, DType dtype,
                             const std::vector<int64_t>& shape, const void* data,
                             size_t size_bytes) {
  if (tensor_index_.count(name)) return InvalidArgument("tensor '" + name + "' added twice");
  if (shape.size() > 4) return InvalidArgument("tensor '" + name + "' has more than 4 dims");
  const DTypeInfo& info = GetDTypeInfo(dtype);
  int64_t numel = 1;
  for (int64_t d : shape) {
    if (d < 0 || __builtin_mul_overflow(numel, d, &numel)) {
      return InvalidArgument("tensor '" + name + "' has a bad shape");
    }
  }
  const int64_t cols = shape.empty() ? 1 : shape.back();
  if (cols % info.block_size != 0) {
    return InvalidArgument("tensor '" + name + "' row length " + std::to_string(cols) +
                           " is not a multiple of the block size " +
                           std::to_string(info.block_size));
  }
  const uint64_t expect = static_cast<uint64_t>(numel / info.block_size) * info.block_bytes;
  if (expect != size_bytes) {
    return InvalidArgument("tensor '" + name + "' needs " + std::to_string(expect) +
                           " bytes, got " + std::to_string(size_bytes));
  }
  const uint8_t* p = static_cast<const uint8_t*>(data);
  tensor_index_.emplace(name, tensors_.size());
  tensors_.push_back({name, dtype, shape,
                      p ? std::vector<uint8_t>(p, p + size_bytes) : std::vector<uint8_t>(),
                      size_bytes, p == nullptr});
  return OkStatus();
}

Status GgufWriter::DeclareTensor(const std::string& name, DType dtype,
                                 const std::vector<int64_t>& shape) {
  int64_t numel = 1;
  for (int64_t d : shape) {
    if (d < 0 || __builtin_mul_overflow(numel, d, &numel))
      return InvalidArgument("tensor '" + name + "' has a bad shape");
  }
  const DTypeInfo& info = GetDTypeInfo(dtype);
  return AddTensor(name, dtype, shape, nullptr,
                   static_cast<size_t>(numel / info.block_size) * info.block_bytes);
}

std::vector<uint8_t> GgufWriter::SerializeHeader() const {
  std::vector<uint8_t> out;
  Put<uint32_t>(&out, 0x46554747);  // "GGUF"
  Put<uint32_t>(&out, version_);
  Put<uint64_t>(&out, tensors_.size());
  Put<uint64_t>(&out, kv_.size());
  for (const auto& [key, encoded] : kv_) {
    PutString(&out, key);
    out.insert(out.end(), encoded.begin(), encoded.end());
  }
  size_t offset = 0;
  for (const Tensor& t : tensors_) {
    PutString(&out, t.name);
    Put<uint32_t>(&out, static_cast<uint32_t>(t.shape.size()));
    for (auto it = t.shape.rbegin(); it != t.shape.rend(); ++it) {  // innermost first
      Put<uint64_t>(&out, static_cast<uint64_t>(*it));
    }
    Put<uint32_t>(&out, GgmlTypeOf(t.dtype));
    Put<uint64_t>(&out, offset);
    offset = AlignUp(offset + t.size, alignment_);
  }
  // The data section starts aligned; a file without tensors ends with its metadata.
  if (!tensors_.empty()) out.resize(AlignUp(out.size(), alignment_), 0);
  return out;
}

std::vector<uint8_t> GgufWriter::Serialize() const {
  std::vector<uint8_t> out = SerializeHeader();
  for (const Tensor& t : tensors_) {
    if (t.declared) out.resize(out.size() + t.size, 0);  // bytes only come with WriteFile(fill)
    out.insert(out.end(), t.bytes.begin(), t.bytes.end());
    out.resize(out.size() + AlignUp(t.bytes.size(), alignment_) - t.bytes.size(), 0);
  }
  return out;
}

Status GgufWriter::WriteFile(const std::string& path, const FillFn& fill) const {
  std::unique_ptr<FILE, int (*)(FILE*)> f(std::fopen(path.c_str(), "wb"), &std::fclose);
  if (!f) return IoError(path + ": cannot open for writing");
  const std::vector<uint8_t> header = SerializeHeader();
  const std::vector<uint8_t> zeros(alignment_, 0);
  bool ok = std::fwrite(header.data(), 1, header.size(), f.get()) == header.size();
  std::vector<uint8_t> buf;
  for (size_t i = 0; i < tensors_.size() && ok; ++i) {
    const Tensor& t = tensors_[i];
    const std::vector<uint8_t>* bytes = &t.bytes;
    if (t.declared) {
      if (!fill) return InvalidArgument(path + ": tensor '" + t.name + "' has no data");
      buf.assign(t.size, 0);
      PENG_RETURN_IF_ERROR(fill(i, t.name, &buf));
      if (buf.size() != t.size)
        return InvalidArgument(path + ": tensor '" + t.name + "' was filled with " +
                               std::to_string(buf.size()) + " bytes, needs " +
                               std::to_string(t.size));
      bytes = &buf;
    }
    const size_t pad = AlignUp(t.size, alignment_) - t.size;
    ok = std::fwrite(bytes->data(), 1, t.size, f.get()) == t.size &&
         std::fwrite(zeros.data(), 1, pad, f.get()) == pad;
  }
  if (!ok) return IoError(path + ": write failed");
  if (std::fclose(f.release()) != 0) return IoError(path + ": close failed");
  return OkStatus();
}

}  // namespace peng
