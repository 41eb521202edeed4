#include "model/registry.h"

namespace peng {

const std::vector<ArchEntry>& Architectures() {
  static const std::vector<ArchEntry> kArchs = {
      {"llama", &LoadLlama},
      {"qwen2", &LoadQwen2},
      {"gemma3", &LoadGemma3},
      {"gemma3_text", &LoadGemma3},
      {"deepseek2", &LoadDeepseek2},
      {"deepseek_v2", &LoadDeepseek2},
  };
  return kArchs;
}

StatusOr<std::unique_ptr<Model>> LoadModel(const std::string& path,
                                           const ModelLoadOptions& options) {
  PENG_ASSIGN_OR_RETURN(std::unique_ptr<ModelFiles> files, ModelFiles::Open(path, options.huge_pages));
  std::string known;
  for (const ArchEntry& a : Architectures()) {
    if (files->arch() == a.name) return a.load(std::move(files), options);
    known += (known.empty() ? "" : ", ") + std::string(a.name);
  }
  return Unimplemented(path + ": unknown model architecture '" + files->arch() +
                       "' (supported: " + known + ")");
}

}  // namespace peng
