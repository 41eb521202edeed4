// Llama family (Llama 2/3, SmolLM2, TinyLlama, Mistral-style): RMSNorm, GQA attention with
// RoPE, SwiGLU MLP. GGUF files from llama.cpp's converter store Q/K permuted for interleaved
// ("normal") RoPE; HF checkpoints use rotate_half (NeoX pairing) on unpermuted weights.
#include "model/config_reader.h"
#include "model/layers/decoder.h"
#include "model/registry.h"

namespace peng {

StatusOr<std::unique_ptr<Model>> LoadLlama(std::unique_ptr<ModelFiles> files,
                                          const ModelLoadOptions& options) {
  ModelConfig cfg;
  PENG_RETURN_IF_ERROR(ReadCommonConfig(*files, &cfg));
  if (files->is_gguf()) {
    cfg.rope.style = kernels::RopeStyle::kInterleaved;
  } else {
    std::map<std::string, std::string> layer, globals;
    LlamaFamilyHfNames(&layer, &globals);
    files->SetHfNameMap(layer, globals);
  }
  cfg.activation = Activation::kSilu;
  PENG_ASSIGN_OR_RETURN(auto m, DecoderModel::Load(std::move(files), cfg, options.tp, options.pp));
  return std::unique_ptr<Model>(std::move(m));
}

}  // namespace peng
