// ModelFiles: the files of one model, opened read-only -- either a single GGUF file or a
// Hugging Face folder (config.json + model.safetensors or a sharded index). Tensors are found
// by their GGUF-style names ("blk.3.attn_q.weight"); for HF folders the architecture supplies
// a translation of HF names ("model.layers.3.self_attn.q_proj.weight") so that model code is
// written once. Owns the mappings; immutable after Open; thread-safe to read.
#pragma once

#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/status.h"
#include "core/tensor.h"
#include "formats/gguf.h"
#include "model/quant_config.h"

namespace peng {

class SafetensorsModel;

class ModelFiles {
 public:
  // `path` is a .gguf file or a directory with config.json. huge_pages: the weight files are
  // read into huge-page memory instead of mapped in place (MappedFile::Open).
  static StatusOr<std::unique_ptr<ModelFiles>> Open(const std::string& path,
                                                    bool huge_pages = false);
  ~ModelFiles();

  const std::string& path() const { return path_; }
  bool is_gguf() const { return gguf_ != nullptr; }
  const GgufFile* gguf() const { return gguf_.get(); }
  const nlohmann::json& hf_config() const { return hf_config_; }  // empty for GGUF
  // Architecture name: GGUF general.architecture or HF config model_type.
  const std::string& arch() const { return arch_; }

  // The folder's quant_config.json (validated against its tensors at Open), or null.
  const QuantConfig* quant() const { return quant_ ? &*quant_ : nullptr; }
  QuantScheme quant_scheme() const { return quant_ ? quant_->scheme : QuantScheme::kNone; }

  // For HF folders: installs the HF -> GGUF name translation (per-layer suffixes such as
  // {"self_attn.q_proj.weight", "attn_q.weight"} and whole names such as
  // {"model.embed_tokens.weight", "token_embd.weight"}). The INT8 scale of a mapped weight
  // (HF name + "_scale") is found under the GGUF-style name + "_scale". No-op for GGUF.
  void SetHfNameMap(const std::map<std::string, std::string>& layer_suffixes,
                    const std::map<std::string, std::string>& globals);

  const TensorView* Find(const std::string& gguf_name) const;
  // Like Find, but a missing tensor is an error naming the tensor and the file.
  StatusOr<const TensorView*> Require(const std::string& gguf_name) const;
  std::vector<const TensorView*> AllTensors() const;
  // How many tensors of each stored type, e.g. "F32 x61, I8 x210, Q8_0 x1".
  std::string DTypeSummary() const;

 private:
  ModelFiles() = default;
  std::string path_;
  std::string arch_;
  std::unique_ptr<GgufFile> gguf_;
  std::unique_ptr<SafetensorsModel> st_;
  nlohmann::json hf_config_;
  std::optional<QuantConfig> quant_;
  std::map<std::string, const TensorView*> hf_by_gguf_name_;
};

}  // namespace peng
