// Qwen2 / Qwen2.5: the Llama layout plus biases on the Q, K and V projections, NeoX RoPE.
#include "model/config_reader.h"
#include "model/layers/decoder.h"
#include "model/registry.h"

namespace peng {

StatusOr<std::unique_ptr<Model>> LoadQwen2(std::unique_ptr<ModelFiles> files,
                                          const ModelLoadOptions& options) {
  ModelConfig cfg;
  PENG_RETURN_IF_ERROR(ReadCommonConfig(*files, &cfg));
  cfg.rope.style = kernels::RopeStyle::kNeox;
  cfg.qkv_bias = true;
  cfg.activation = Activation::kSilu;
  if (!files->is_gguf()) {
    std::map<std::string, std::string> layer, globals;
    LlamaFamilyHfNames(&layer, &globals);
    files->SetHfNameMap(layer, globals);
  }
  PENG_ASSIGN_OR_RETURN(auto m, DecoderModel::Load(std::move(files), cfg, options.tp, options.pp));
  return std::unique_ptr<Model>(std::move(m));
}

}  // namespace peng
