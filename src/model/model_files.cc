#include "model/model_files.h"

#include <cstring>
#include <regex>

#include "core/mapped_file.h"

#include "formats/json_util.h"
#include "formats/safetensors.h"

namespace peng {

ModelFiles::~ModelFiles() = default;

StatusOr<std::unique_ptr<ModelFiles>> ModelFiles::Open(const std::string& path, bool huge_pages) {
  std::unique_ptr<ModelFiles> mf(new ModelFiles());
  mf->path_ = path;
  if (IsDirectory(path)) {
    PENG_ASSIGN_OR_RETURN(mf->hf_config_, ParseJsonFile(path + "/config.json"));
    if (!mf->hf_config_.is_object() || !mf->hf_config_.contains("model_type") ||
        !mf->hf_config_["model_type"].is_string())
      return InvalidArgument(path + "/config.json: missing string field 'model_type'");
    mf->arch_ = mf->hf_config_["model_type"].get<std::string>();
    PENG_ASSIGN_OR_RETURN(mf->st_, SafetensorsModel::Open(path, huge_pages));
    const std::string qc_path = path + "/quant_config.json";
    if (PathExists(qc_path)) {
      PENG_ASSIGN_OR_RETURN(nlohmann::json qj, ParseJsonFile(qc_path));
      PENG_ASSIGN_OR_RETURN(QuantConfig qc, QuantConfig::FromJson(qj, qc_path));
      mf->quant_ = std::move(qc);
    }
    PENG_RETURN_IF_ERROR(ValidateQuantizedTensors(mf->quant(), mf->AllTensors(), path));
    return mf;
  }
  PENG_ASSIGN_OR_RETURN(mf->gguf_, GgufFile::Open(path, huge_pages));
  auto arch = mf->gguf_->GetString("general.architecture");
  if (!arch) return DataLoss(path + ": GGUF has no 'general.architecture' metadata");
  mf->arch_ = *arch;
  return mf;
}

void ModelFiles::SetHfNameMap(const std::map<std::string, std::string>& layer_suffixes,
                              const std::map<std::string, std::string>& globals) {
  if (!st_) return;
  hf_by_gguf_name_.clear();
  static const std::regex kLayer(R"(^model\.layers\.(\d+)\.(.+)$)");
  const size_t scale_len = std::strlen(kQuantScaleSuffix);
  for (const TensorView& tv : st_->tensors()) {
    const TensorView* t = &tv;
    std::smatch m;
    // An INT8 scale is looked up through the name of its weight.
    std::string name = t->name, suffix;
    if (name.size() > scale_len &&
        name.compare(name.size() - scale_len, scale_len, kQuantScaleSuffix) == 0) {
      suffix = kQuantScaleSuffix;
      name.resize(name.size() - scale_len);
    }
    auto g = globals.find(name);
    if (g != globals.end()) {
      hf_by_gguf_name_[g->second + suffix] = t;
    } else if (std::regex_match(name, m, kLayer)) {
      auto s = layer_suffixes.find(m[2].str());
      if (s != layer_suffixes.end())
        hf_by_gguf_name_["blk." + m[1].str() + "." + s->second + suffix] = t;
    }
  }
}

const TensorView* ModelFiles::Find(const std::string& gguf_name) const {
  if (gguf_) return gguf_->FindTensor(gguf_name);
  auto it = hf_by_gguf_name_.find(gguf_name);
  return it == hf_by_gguf_name_.end() ? nullptr : it->second;
}

StatusOr<const TensorView*> ModelFiles::Require(const std::string& gguf_name) const {
  const TensorView* t = Find(gguf_name);
  if (!t) return NotFound(path_ + ": missing tensor '" + gguf_name + "'");
  return t;
}

std::vector<const TensorView*> ModelFiles::AllTensors() const {
  std::vector<const TensorView*> out;
  if (gguf_) {
    for (const TensorView& t : gguf_->tensors()) out.push_back(&t);
  } else {
    for (const TensorView& t : st_->tensors()) out.push_back(&t);
  }
  return out;
}

std::string ModelFiles::DTypeSummary() const {
  std::map<std::string, int> counts;
  for (const TensorView* t : AllTensors()) counts[DTypeName(t->dtype)]++;
  std::string s;
  for (auto& [name, n] : counts) s += (s.empty() ? "" : ", ") + name + " x" + std::to_string(n);
  return s;
}

}  // namespace peng
