#include "formats/gguf.h"

#include <algorithm>
#include <bit>
#include <cstring>
#include <exception>
#include <limits>

#include "core/check.h"
#include "formats/error_util.h"

namespace peng {
namespace {

static_assert(std::endian::native == std::endian::little, "GGUF reader assumes little-endian");

using formats_internal::GuardedParse;
using formats_internal::Quote;
using formats_internal::WithContext;
using Type = GgufValue::Type;

constexpr uint32_t kMagic = 0x46554747;  // "GGUF" read as a little-endian u32
constexpr uint32_t kMaxDims = 4;
constexpr uint64_t kDefaultAlignment = 32;
// Smallest encodings, used to bound counts by the bytes left before allocating anything.
constexpr uint64_t kMinKvBytes = 8 + 4 + 1;              // key length, type, 1-byte value
constexpr uint64_t kMinTensorInfoBytes = 8 + 4 + 4 + 8;  // name length, n_dims, type, offset

const char* GgmlTypeName(uint32_t t) {
  switch (t) {
    case 16: return "IQ2_XXS";
    case 17: return "IQ2_XS";
    case 18: return "IQ3_XXS";
    case 19: return "IQ1_S";
    case 20: return "IQ4_NL";
    case 21: return "IQ3_S";
    case 22: return "IQ2_S";
    case 23: return "IQ4_XS";
    case 29: return "IQ1_M";
    case 34: return "TQ1_0";
    case 35: return "TQ2_0";
    case 39: return "MXFP4";
    default: return nullptr;
  }
}

bool IsInteger(Type t) {
  switch (t) {
    case Type::kU8: case Type::kI8: case Type::kU16: case Type::kI16:
    case Type::kU32: case Type::kI32: case Type::kU64: case Type::kI64:
      return true;
    default:
      return false;
  }
}

// Encoded size of one value of a scalar type (strings: the minimum, an empty string).
uint64_t MinValueBytes(Type t) {
  switch (t) {
    case Type::kU8: case Type::kI8: case Type::kBool: return 1;
    case Type::kU16: case Type::kI16: return 2;
    case Type::kU32: case Type::kI32: case Type::kF32: return 4;
    case Type::kU64: case Type::kI64: case Type::kF64: case Type::kString: return 8;
    case Type::kArray: return 4 + 8;
  }
  return 1;
}

bool CheckedMul(uint64_t a, uint64_t b, uint64_t* out) { return !__builtin_mul_overflow(a, b, out); }
bool CheckedAdd(uint64_t a, uint64_t b, uint64_t* out) { return !__builtin_add_overflow(a, b, out); }

// A bounds-checked little-endian reader over the file image. Messages carry no file name;
// GgufFile::FromBytes prefixes it.
class Cursor {
 public:
  Cursor(const uint8_t* data, size_t size) : data_(data), size_(size) {}
  size_t pos() const { return pos_; }
  uint64_t remaining() const { return size_ - pos_; }

  template <typename T>
  Status Read(T* out, const char* what) {
    if (remaining() < sizeof(T)) return Truncated(what, sizeof(T));
    std::memcpy(out, data_ + pos_, sizeof(T));
    pos_ += sizeof(T);
    return OkStatus();
  }

  Status ReadString(std::string* out, const char* what) {
    uint64_t len{};
    PENG_RETURN_IF_ERROR(Read(&len, what));
    if (len > remaining()) {
      return DataLoss(std::string(what) + " at offset " + std::to_string(pos_ - 8) +
                      " has length " + std::to_string(len) + " but only " +
                      std::to_string(remaining()) + " bytes remain");
    }
    out->assign(reinterpret_cast<const char*>(data_ + pos_), len);
    pos_ += len;
    return OkStatus();
  }

 private:
  Status Truncated(const char* what, size_t need) const {
    return DataLoss("unexpected end of file at offset " + std::to_string(pos_) + " reading " +
                    what + " (need " + std::to_string(need) + " bytes, " +
                    std::to_string(remaining()) + " left)");
  }

  const uint8_t* data_;
  size_t size_;
  size_t pos_ = 0;
};

Status ReadType(Cursor& c, Type* out, const char* what) {
  uint32_t t{};
  PENG_RETURN_IF_ERROR(c.Read(&t, what));
  if (t > static_cast<uint32_t>(Type::kF64)) {
    return DataLoss("unknown metadata value type " + std::to_string(t));
  }
  *out = static_cast<Type>(t);
  return OkStatus();
}

// Reads one integer or bool of type t, widened to int64.
Status ReadInt(Cursor& c, Type t, int64_t* out) {
  switch (t) {
#define PENG_GGUF_INT_CASE(enumerator, ctype)          \
  case Type::enumerator: {                             \
    ctype v{};                                         \
    PENG_RETURN_IF_ERROR(c.Read(&v, "integer value")); \
    *out = static_cast<int64_t>(v);                    \
    return OkStatus();                                 \
  }
    PENG_GGUF_INT_CASE(kU8, uint8_t)
    PENG_GGUF_INT_CASE(kI8, int8_t)
    PENG_GGUF_INT_CASE(kU16, uint16_t)
    PENG_GGUF_INT_CASE(kI16, int16_t)
    PENG_GGUF_INT_CASE(kU32, uint32_t)
    PENG_GGUF_INT_CASE(kI32, int32_t)
    PENG_GGUF_INT_CASE(kI64, int64_t)
#undef PENG_GGUF_INT_CASE
    case Type::kU64: {
      uint64_t v{};
      PENG_RETURN_IF_ERROR(c.Read(&v, "integer value"));
      if (v > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
        return DataLoss("u64 value " + std::to_string(v) + " does not fit in int64");
      }
      *out = static_cast<int64_t>(v);
      return OkStatus();
    }
    case Type::kBool: {
      uint8_t v{};
      PENG_RETURN_IF_ERROR(c.Read(&v, "bool value"));
      if (v > 1) return DataLoss("bool value " + std::to_string(v) + " is neither 0 nor 1");
      *out = v;
      return OkStatus();
    }
    default:
      break;
  }
  return Internal("ReadInt called with a non-integer type");
}

Status ReadFloat(Cursor& c, Type t, double* out) {
  if (t == Type::kF32) {
    float v{};
    PENG_RETURN_IF_ERROR(c.Read(&v, "f32 value"));
    *out = v;
    return OkStatus();
  }
  PENG_CHECK(t == Type::kF64);
  return c.Read(out, "f64 value");
}

template <typename T, typename ReadOne>
Status ReadArrayOf(uint64_t count, GgufValue* v, ReadOne read_one) {
  // The count was bounded by the bytes left, but grow gradually all the same: an element in the
  // file can be far smaller than its in-memory form.
  std::vector<T> items;
  items.reserve(std::min<uint64_t>(count, 1 << 16));
  for (uint64_t i = 0; i < count; ++i) {
    PENG_RETURN_IF_ERROR(read_one(&items.emplace_back()));
  }
  v->value = std::move(items);
  return OkStatus();
}

Status ReadArray(Cursor& c, GgufValue* v) {
  Type elem{};
  PENG_RETURN_IF_ERROR(ReadType(c, &elem, "array element type"));
  if (elem == Type::kArray) return Unimplemented("nested arrays (arrays of arrays) are not supported");
  uint64_t count{};
  PENG_RETURN_IF_ERROR(c.Read(&count, "array length"));
  const uint64_t min_bytes = MinValueBytes(elem);
  if (count > c.remaining() / min_bytes) {
    return DataLoss("array of " + std::to_string(count) + " elements needs at least " +
                    (count > std::numeric_limits<uint64_t>::max() / min_bytes
                         ? std::string("2^64")
                         : std::to_string(count * min_bytes)) +
                    " bytes but only " + std::to_string(c.remaining()) + " remain");
  }
  v->type = Type::kArray;
  v->elem_type = elem;
  if (elem == Type::kString) {
    return ReadArrayOf<std::string>(
        count, v, [&](std::string* s) { return c.ReadString(s, "array string"); });
  }
  if (elem == Type::kF32 || elem == Type::kF64) {
    return ReadArrayOf<double>(count, v, [&](double* d) { return ReadFloat(c, elem, d); });
  }
  return ReadArrayOf<int64_t>(count, v, [&](int64_t* i) { return ReadInt(c, elem, i); });
}

Status ReadValue(Cursor& c, Type t, GgufValue* v) {
  v->type = t;
  v->elem_type = Type::kU8;
  if (t == Type::kArray) return ReadArray(c, v);
  if (t == Type::kString) {
    std::string s;
    PENG_RETURN_IF_ERROR(c.ReadString(&s, "string value"));
    v->value = std::move(s);
    return OkStatus();
  }
  if (t == Type::kF32 || t == Type::kF64) {
    double d{};
    PENG_RETURN_IF_ERROR(ReadFloat(c, t, &d));
    v->value = d;
    return OkStatus();
  }
  int64_t i{};
  PENG_RETURN_IF_ERROR(ReadInt(c, t, &i));
  v->value = i;
  return OkStatus();
}

// A tensor info before the data section start is known.
struct RawTensor {
  TensorView view;
  uint64_t offset = 0;
};

Status ReadTensorInfo(Cursor& c, RawTensor* t) {
  uint32_t n_dims{};
  PENG_RETURN_IF_ERROR(c.Read(&n_dims, "n_dims"));
  if (n_dims > kMaxDims) {
    return DataLoss("n_dims " + std::to_string(n_dims) + " exceeds the maximum of " +
                    std::to_string(kMaxDims));
  }
  uint64_t dims[kMaxDims] = {};
  uint64_t numel = 1;
  for (uint32_t i = 0; i < n_dims; ++i) {
    PENG_RETURN_IF_ERROR(c.Read(&dims[i], "dimension"));
    if (dims[i] > static_cast<uint64_t>(std::numeric_limits<int64_t>::max()) ||
        !CheckedMul(numel, dims[i], &numel) ||
        numel > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
      return DataLoss("element count overflows (dimension " + std::to_string(i) + " is " +
                      std::to_string(dims[i]) + ")");
    }
  }
  uint32_t ggml_type{};
  PENG_RETURN_IF_ERROR(c.Read(&ggml_type, "tensor type"));
  PENG_RETURN_IF_ERROR(c.Read(&t->offset, "tensor offset"));
  std::optional<DType> dtype = DTypeFromGgml(ggml_type);
  if (!dtype) {
    const char* known = GgmlTypeName(ggml_type);
    return Unimplemented("unsupported ggml type " + std::to_string(ggml_type) +
                         (known ? std::string(" (") + known + ")" : std::string()));
  }
  const DTypeInfo& info = GetDTypeInfo(*dtype);
  const uint64_t dim0 = n_dims > 0 ? dims[0] : 1;
  if (dim0 % static_cast<uint64_t>(info.block_size) != 0) {
    return DataLoss("row length " + std::to_string(dim0) + " is not a multiple of the " +
                    info.name + " block size " + std::to_string(info.block_size));
  }
  uint64_t bytes{};
  if (!CheckedMul(numel / info.block_size, static_cast<uint64_t>(info.block_bytes), &bytes)) {
    return DataLoss("byte size overflows");
  }
  t->view.dtype = *dtype;
  t->view.shape.assign(n_dims, 0);
  for (uint32_t i = 0; i < n_dims; ++i) t->view.shape[n_dims - 1 - i] = static_cast<int64_t>(dims[i]);
  t->view.size_bytes = bytes;
  return OkStatus();
}

}  // namespace

StatusOr<std::unique_ptr<GgufFile>> GgufFile::Open(const std::string& path, bool huge_pages) {
  PENG_ASSIGN_OR_RETURN(MappedFile mapped, MappedFile::Open(path, huge_pages));
  std::unique_ptr<GgufFile> f(new GgufFile());
  f->name_ = path;
  f->file_ = std::move(mapped);
  Status s = GuardedParse([&] { return f->Parse(f->file_.data(), f->file_.size()); });
  if (!s.ok()) return WithContext(s, path);
  return f;
}

StatusOr<std::unique_ptr<GgufFile>> GgufFile::FromBytes(const uint8_t* data, size_t size,
                                                        const std::string& name) {
  std::unique_ptr<GgufFile> f(new GgufFile());
  f->name_ = name;
  Status s = GuardedParse([&] { return f->Parse(data, size); });
  if (!s.ok()) return WithContext(s, name);
  return f;
}

Status GgufFile::Parse(const uint8_t* data, size_t size) {
  Cursor c(data, size);
  uint32_t magic{};
  PENG_RETURN_IF_ERROR(c.Read(&magic, "magic"));
  if (magic != kMagic) return InvalidArgument("not a GGUF file (bad magic)");
  PENG_RETURN_IF_ERROR(c.Read(&version_, "version"));
  if (version_ != 2 && version_ != 3) {
    return Unimplemented("unsupported GGUF version " + std::to_string(version_) +
                         " (supported: 2, 3)");
  }
  uint64_t n_tensors{}, n_kv{};
  PENG_RETURN_IF_ERROR(c.Read(&n_tensors, "tensor count"));
  PENG_RETURN_IF_ERROR(c.Read(&n_kv, "metadata count"));
  if (n_kv > c.remaining() / kMinKvBytes) {
    return DataLoss("metadata count " + std::to_string(n_kv) + " is impossible in the " +
                    std::to_string(c.remaining()) + " bytes left");
  }

  for (uint64_t i = 0; i < n_kv; ++i) {
    std::string key;
    Status s = c.ReadString(&key, "metadata key");
    if (!s.ok()) return WithContext(s, "metadata entry " + std::to_string(i));
    const std::string ctx = "metadata key " + Quote(key);
    if (kv_.count(key)) return DataLoss(ctx + " appears twice");
    Type t{};
    GgufValue v;
    s = ReadType(c, &t, "metadata value type");
    if (s.ok()) s = ReadValue(c, t, &v);
    if (!s.ok()) return WithContext(s, ctx);
    kv_.emplace(std::move(key), std::move(v));
  }

  uint64_t alignment = kDefaultAlignment;
  if (auto it = kv_.find("general.alignment"); it != kv_.end()) {
    std::optional<int64_t> a = GetInt("general.alignment");
    if (!a || it->second.type == Type::kBool) return DataLoss("general.alignment is not an integer");
    if (*a <= 0 || !std::has_single_bit(static_cast<uint64_t>(*a))) {
      return DataLoss("general.alignment " + std::to_string(*a) + " is not a power of two");
    }
    alignment = static_cast<uint64_t>(*a);
  }
  alignment_ = alignment;

  if (n_tensors > c.remaining() / kMinTensorInfoBytes) {
    return DataLoss("tensor count " + std::to_string(n_tensors) + " is impossible in the " +
                    std::to_string(c.remaining()) + " bytes left");
  }
  std::vector<RawTensor> raw(n_tensors);
  for (uint64_t i = 0; i < n_tensors; ++i) {
    Status s = c.ReadString(&raw[i].view.name, "tensor name");
    if (!s.ok()) return WithContext(s, "tensor info " + std::to_string(i));
    const std::string ctx = "tensor " + Quote(raw[i].view.name);
    if (tensor_index_.count(raw[i].view.name)) return DataLoss(ctx + " appears twice");
    tensor_index_.emplace(raw[i].view.name, i);
    s = ReadTensorInfo(c, &raw[i]);
    if (!s.ok()) return WithContext(s, ctx);
  }

  // The data section starts at the end of the header, rounded up to the alignment.
  const uint64_t data_start = (static_cast<uint64_t>(c.pos()) + alignment - 1) & ~(alignment - 1);
  tensors_.reserve(n_tensors);
  for (RawTensor& t : raw) {
    const std::string ctx = "tensor " + Quote(t.view.name);
    if (t.offset % alignment != 0) {
      return DataLoss(ctx + " offset " + std::to_string(t.offset) + " is not a multiple of the " +
                      "alignment " + std::to_string(alignment));
    }
    uint64_t begin{}, end{};
    if (!CheckedAdd(data_start, t.offset, &begin) || !CheckedAdd(begin, t.view.size_bytes, &end)) {
      return DataLoss(ctx + " offset " + std::to_string(t.offset) + " overflows");
    }
    if (end > size) {
      return DataLoss(ctx + " data [" + std::to_string(begin) + ", " + std::to_string(end) +
                      ") extends past end of file (" + std::to_string(size) + " bytes)");
    }
    t.view.data = data + begin;
    tensors_.push_back(std::move(t.view));
  }
  return OkStatus();
}

std::optional<std::string> GgufFile::GetString(const std::string& key) const {
  auto it = kv_.find(key);
  if (it == kv_.end() || it->second.type != Type::kString) return std::nullopt;
  return std::get<std::string>(it->second.value);
}

std::optional<int64_t> GgufFile::GetInt(const std::string& key) const {
  auto it = kv_.find(key);
  if (it == kv_.end()) return std::nullopt;
  const Type t = it->second.type;
  if (!IsInteger(t) && t != Type::kBool) return std::nullopt;
  return std::get<int64_t>(it->second.value);
}

std::optional<double> GgufFile::GetFloat(const std::string& key) const {
  auto it = kv_.find(key);
  if (it == kv_.end()) return std::nullopt;
  const Type t = it->second.type;
  if (t == Type::kF32 || t == Type::kF64) return std::get<double>(it->second.value);
  if (IsInteger(t)) return static_cast<double>(std::get<int64_t>(it->second.value));
  return std::nullopt;
}

std::optional<bool> GgufFile::GetBool(const std::string& key) const {
  auto it = kv_.find(key);
  if (it == kv_.end() || it->second.type != Type::kBool) return std::nullopt;
  return std::get<int64_t>(it->second.value) != 0;
}

const std::vector<std::string>* GgufFile::GetStringArray(const std::string& key) const {
  auto it = kv_.find(key);
  if (it == kv_.end()) return nullptr;
  return std::get_if<std::vector<std::string>>(&it->second.value);
}

const std::vector<int64_t>* GgufFile::GetIntArray(const std::string& key) const {
  auto it = kv_.find(key);
  if (it == kv_.end()) return nullptr;
  return std::get_if<std::vector<int64_t>>(&it->second.value);
}

const std::vector<double>* GgufFile::GetFloatArray(const std::string& key) const {
  auto it = kv_.find(key);
  if (it == kv_.end()) return nullptr;
  return std::get_if<std::vector<double>>(&it->second.value);
}

const TensorView* GgufFile::FindTensor(const std::string& name) const {
  auto it = tensor_index_.find(name);
  return it == tensor_index_.end() ? nullptr : &tensors_[it->second];
}

}  // namespace peng
