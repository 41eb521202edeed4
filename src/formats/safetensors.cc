#include "formats/safetensors.h"

#include <algorithm>
#include <bit>
#include <cstring>
#include <exception>
#include <filesystem>
#include <limits>
#include <set>

#include "formats/error_util.h"
#include "formats/json_util.h"

namespace peng {
namespace {

static_assert(std::endian::native == std::endian::little, "safetensors reader assumes little-endian");

using formats_internal::GuardedParse;
using formats_internal::Quote;
using formats_internal::WithContext;
using Json = nlohmann::json;

constexpr uint64_t kInt64Max = static_cast<uint64_t>(std::numeric_limits<int64_t>::max());

// Parses one {dtype, shape, data_offsets} entry; `data`/`data_size` is the data section.
Status ParseTensor(const std::string& name, const Json& entry, const uint8_t* data,
                   uint64_t data_size, TensorView* out) {
  const std::string ctx = "tensor " + Quote(name);
  if (!entry.is_object()) return DataLoss(ctx + " is not a JSON object");
  auto dtype_it = entry.find("dtype");
  auto shape_it = entry.find("shape");
  auto offsets_it = entry.find("data_offsets");
  if (dtype_it == entry.end() || !dtype_it->is_string()) {
    return DataLoss(ctx + " has no string \"dtype\"");
  }
  if (shape_it == entry.end() || !shape_it->is_array()) {
    return DataLoss(ctx + " has no array \"shape\"");
  }
  if (offsets_it == entry.end() || !offsets_it->is_array() || offsets_it->size() != 2 ||
      !(*offsets_it)[0].is_number_unsigned() || !(*offsets_it)[1].is_number_unsigned()) {
    return DataLoss(ctx + " has no \"data_offsets\" pair of non-negative integers");
  }
  const std::string& dtype_name = dtype_it->get_ref<const std::string&>();
  std::optional<DType> dtype = DTypeFromSafetensors(dtype_name);
  if (!dtype) return Unimplemented(ctx + " has unsupported dtype " + Quote(dtype_name));

  out->name = name;
  out->dtype = *dtype;
  out->shape.clear();
  uint64_t numel = 1;
  for (const Json& d : *shape_it) {
    if (!d.is_number_unsigned() || d.get<uint64_t>() > kInt64Max) {
      return DataLoss(ctx + " shape has an entry that is not a non-negative integer");
    }
    const uint64_t dim = d.get<uint64_t>();
    if (__builtin_mul_overflow(numel, dim, &numel) || numel > kInt64Max) {
      return DataLoss(ctx + " element count overflows");
    }
    out->shape.push_back(static_cast<int64_t>(dim));
  }
  uint64_t bytes;
  if (__builtin_mul_overflow(numel, static_cast<uint64_t>(GetDTypeInfo(*dtype).block_bytes),
                             &bytes)) {
    return DataLoss(ctx + " byte size overflows");
  }
  const uint64_t begin = (*offsets_it)[0].get<uint64_t>();
  const uint64_t end = (*offsets_it)[1].get<uint64_t>();
  const std::string range = "data_offsets [" + std::to_string(begin) + ", " +
                            std::to_string(end) + ")";
  if (end < begin) return DataLoss(ctx + " " + range + " ends before it begins");
  if (end > data_size) {
    return DataLoss(ctx + " " + range + " extends past the end of the data (" +
                    std::to_string(data_size) + " bytes)");
  }
  if (end - begin != bytes) {
    return DataLoss(ctx + " " + range + " holds " + std::to_string(end - begin) +
                    " bytes but shape " + out->ShapeString() + " of " + dtype_name + " needs " +
                    std::to_string(bytes));
  }
  out->data = data + begin;
  out->size_bytes = bytes;
  return OkStatus();
}

}  // namespace

StatusOr<std::unique_ptr<SafetensorsFile>> SafetensorsFile::Open(const std::string& path,
                                                                 bool huge_pages) {
  PENG_ASSIGN_OR_RETURN(MappedFile mapped, MappedFile::Open(path, huge_pages));
  std::unique_ptr<SafetensorsFile> f(new SafetensorsFile());
  f->name_ = path;
  f->file_ = std::move(mapped);
  Status s = GuardedParse([&] { return f->Parse(f->file_.data(), f->file_.size()); });
  if (!s.ok()) return WithContext(s, path);
  return f;
}

StatusOr<std::unique_ptr<SafetensorsFile>> SafetensorsFile::FromBytes(const uint8_t* data,
                                                                      size_t size,
                                                                      const std::string& name) {
  std::unique_ptr<SafetensorsFile> f(new SafetensorsFile());
  f->name_ = name;
  Status s = GuardedParse([&] { return f->Parse(data, size); });
  if (!s.ok()) return WithContext(s, name);
  return f;
}

Status SafetensorsFile::Parse(const uint8_t* data, size_t size) {
  if (size < 8) {
    return DataLoss("file is " + std::to_string(size) +
                    " bytes, too short for the 8-byte header length");
  }
  uint64_t header_len;
  std::memcpy(&header_len, data, 8);
  if (header_len > kMaxHeaderBytes) {
    return DataLoss("header length " + std::to_string(header_len) + " exceeds the limit of " +
                    std::to_string(kMaxHeaderBytes) + " bytes");
  }
  if (header_len > size - 8) {
    return DataLoss("header length " + std::to_string(header_len) +
                    " extends past end of file (" + std::to_string(size) + " bytes)");
  }
  StatusOr<Json> header =
      ParseJson(std::string_view(reinterpret_cast<const char*>(data) + 8, header_len), "header");
  if (!header.ok()) return header.status();
  if (!header->is_object()) return DataLoss("header is not a JSON object");

  const uint8_t* tensor_data = data + 8 + header_len;
  const uint64_t data_size = size - 8 - header_len;
  std::vector<std::pair<uint64_t, TensorView>> found;
  for (const auto& [key, value] : header->items()) {
    if (key == "__metadata__") {
      if (!value.is_object()) return DataLoss("__metadata__ is not a JSON object");
      for (const auto& [mk, mv] : value.items()) {
        if (!mv.is_string()) return DataLoss("__metadata__ value " + Quote(mk) + " is not a string");
        metadata_[mk] = mv.get<std::string>();
      }
      continue;
    }
    TensorView view;
    PENG_RETURN_IF_ERROR(ParseTensor(key, value, tensor_data, data_size, &view));
    const uint64_t begin = static_cast<const uint8_t*>(view.data) - tensor_data;
    found.emplace_back(begin, std::move(view));
  }
  std::sort(found.begin(), found.end(), [](const auto& a, const auto& b) {
    return a.first != b.first ? a.first < b.first : a.second.name < b.second.name;
  });
  tensors_.reserve(found.size());
  for (auto& [begin, view] : found) {
    tensor_index_.emplace(view.name, tensors_.size());
    tensors_.push_back(std::move(view));
  }
  return OkStatus();
}

const TensorView* SafetensorsFile::FindTensor(const std::string& name) const {
  auto it = tensor_index_.find(name);
  return it == tensor_index_.end() ? nullptr : &tensors_[it->second];
}

// ---------------------------------------------------------------------------------------------

StatusOr<std::unique_ptr<SafetensorsModel>> SafetensorsModel::Open(const std::string& path,
                                                                   bool huge_pages) {
  namespace fs = std::filesystem;
  std::error_code ec;
  std::unique_ptr<SafetensorsModel> m(new SafetensorsModel());
  if (fs::is_regular_file(path, ec)) {
    PENG_ASSIGN_OR_RETURN(auto shard, SafetensorsFile::Open(path, huge_pages));
    PENG_RETURN_IF_ERROR(m->AddShard(std::move(shard)));
    return m;
  }
  if (!fs::is_directory(path, ec)) return NotFound(path + ": no such file or directory");
  const std::string index_path = (fs::path(path) / "model.safetensors.index.json").string();
  const std::string single_path = (fs::path(path) / "model.safetensors").string();
  if (fs::is_regular_file(index_path, ec)) {
    PENG_RETURN_IF_ERROR(m->OpenIndex(path, index_path, huge_pages));
    return m;
  }
  if (fs::is_regular_file(single_path, ec)) {
    PENG_ASSIGN_OR_RETURN(auto shard, SafetensorsFile::Open(single_path, huge_pages));
    PENG_RETURN_IF_ERROR(m->AddShard(std::move(shard)));
    return m;
  }
  return NotFound(path + ": neither model.safetensors nor model.safetensors.index.json found");
}

Status SafetensorsModel::OpenIndex(const std::string& dir, const std::string& index_path,
                                   bool huge_pages) {
  PENG_ASSIGN_OR_RETURN(Json index, ParseJsonFile(index_path));
  auto wm = index.is_object() ? index.find("weight_map") : index.end();
  if (!index.is_object() || wm == index.end() || !wm->is_object()) {
    return DataLoss(index_path + ": no \"weight_map\" object");
  }
  std::set<std::string> shard_names;
  for (const auto& [tensor, file] : wm->items()) {
    if (!file.is_string()) {
      return DataLoss(index_path + ": weight_map entry " + Quote(tensor) + " is not a string");
    }
    const std::string& f = file.get_ref<const std::string&>();
    if (f.empty() || f == "." || f == ".." || f.find('/') != std::string::npos ||
        f.find('\\') != std::string::npos) {
      return DataLoss(index_path + ": weight_map entry " + Quote(tensor) +
                      " names an invalid shard file " + Quote(f));
    }
    shard_names.insert(f);
  }
  for (const std::string& f : shard_names) {
    const std::string shard_path = (std::filesystem::path(dir) / f).string();
    PENG_ASSIGN_OR_RETURN(auto shard, SafetensorsFile::Open(shard_path, huge_pages));
    PENG_RETURN_IF_ERROR(AddShard(std::move(shard)));
  }
  for (const auto& [tensor, file] : wm->items()) {
    auto it = index_.find(tensor);
    const std::string& f = file.get_ref<const std::string&>();
    const std::string shard_path = (std::filesystem::path(dir) / f).string();
    if (it == index_.end() || shards_[shard_of_[it->second]]->path() != shard_path) {
      return NotFound(shard_path + ": tensor " + Quote(tensor) +
                      " listed in model.safetensors.index.json is not in this shard");
    }
  }
  return OkStatus();
}

Status SafetensorsModel::AddShard(std::unique_ptr<SafetensorsFile> shard) {
  const size_t shard_id = shards_.size();
  for (const TensorView& t : shard->tensors()) {
    auto [it, inserted] = index_.emplace(t.name, tensors_.size());
    if (!inserted) {
      return DataLoss(shard->path() + ": tensor " + Quote(t.name) + " is also in " +
                      shards_[shard_of_[it->second]]->path());
    }
    tensors_.push_back(t);
    shard_of_.push_back(shard_id);
  }
  shards_.push_back(std::move(shard));
  return OkStatus();
}

const TensorView* SafetensorsModel::FindTensor(const std::string& name) const {
  auto it = index_.find(name);
  return it == index_.end() ? nullptr : &tensors_[it->second];
}

}  // namespace peng
