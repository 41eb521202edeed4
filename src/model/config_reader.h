// Typed, checked access to model hyper-parameters in GGUF metadata ("llama.block_count") and
// HF config.json fields, shared by the architecture loaders. Every missing or ill-typed
// required field is an error naming the file and the key.
#pragma once

#include <optional>
#include <string>

#include <nlohmann/json.hpp>

#include "core/status.h"
#include "model/model_config.h"
#include "model/model_files.h"

namespace peng {

class ConfigReader {
 public:
  // For GGUF, keys are looked up as "<arch>.<key>"; for HF, as "<key>" in config.json.
  explicit ConfigReader(const ModelFiles& files) : files_(files) {}

  StatusOr<int64_t> Int(const std::string& key) const;
  int64_t IntOr(const std::string& key, int64_t def) const;
  StatusOr<double> Float(const std::string& key) const;
  double FloatOr(const std::string& key, double def) const;
  bool BoolOr(const std::string& key, bool def) const;
  // Raw (unprefixed) lookups.
  std::optional<int64_t> RawInt(const std::string& key) const;
  const nlohmann::json* Json(const std::string& key) const;  // HF only

 private:
  std::string Where(const std::string& key) const;
  const ModelFiles& files_;
};

// Fills the fields common to the Llama family (dims, eps, rope theta, bos/eos) from GGUF
// metadata or a HF config.json. Architecture loaders then adjust the rest.
Status ReadCommonConfig(const ModelFiles& files, ModelConfig* cfg);

// The HF -> GGUF tensor-name map of the Llama family; loaders may add or override entries.
void LlamaFamilyHfNames(std::map<std::string, std::string>* layer_suffixes,
                        std::map<std::string, std::string>* globals);

}  // namespace peng
