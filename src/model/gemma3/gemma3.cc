// Gemma 3 (text): embeddings scaled by sqrt(hidden), RMSNorm with (1 + w) weights (GGUF stores
// w + 1 already; HF stores w), norms before AND after attention and MLP, RMSNorm on every q/k
// head, GeGLU (tanh GELU) MLP, tied LM head, and a 5:1 pattern of sliding-window layers
// (local RoPE base 10000) to global layers (RoPE base rope_theta).
#include <cmath>

#include "model/config_reader.h"
#include "model/layers/decoder.h"
#include "model/registry.h"

namespace peng {

StatusOr<std::unique_ptr<Model>> LoadGemma3(std::unique_ptr<ModelFiles> files,
                                          const ModelLoadOptions& options) {
  ModelConfig cfg;
  PENG_RETURN_IF_ERROR(ReadCommonConfig(*files, &cfg));
  ConfigReader r(*files);
  cfg.arch = "gemma3";
  cfg.activation = Activation::kGeluTanh;
  cfg.qk_norm = true;
  cfg.post_norms = true;
  cfg.tie_embeddings = true;
  cfg.rope.style = kernels::RopeStyle::kNeox;
  cfg.embed_scale = std::sqrt(static_cast<float>(cfg.hidden_size));
  int pattern = 6;
  if (files->is_gguf()) {
    cfg.sliding_window = static_cast<int>(r.IntOr("attention.sliding_window", 0));
    // query_pre_attn_scalar == head_dim for the released sizes except 27B.
    cfg.attn_scale = 1.0f / std::sqrt(static_cast<float>(cfg.head_dim));
  } else {
    cfg.norm_weight_offset = 1.0f;
    cfg.sliding_window = static_cast<int>(r.IntOr("sliding_window", 0));
    cfg.attn_scale =
        1.0f / std::sqrt(static_cast<float>(r.IntOr("query_pre_attn_scalar", cfg.head_dim)));
    pattern = static_cast<int>(r.IntOr("sliding_window_pattern", 6));
    // transformers 4: rope_local_base_freq; 5: rope_parameters.sliding_attention.rope_theta.
    cfg.rope_local.theta = static_cast<float>(r.FloatOr("rope_local_base_freq", 10000.0));
    if (const nlohmann::json* rp = r.Json("rope_parameters")) {
      if (rp->is_object() && rp->contains("sliding_attention") &&
          (*rp)["sliding_attention"].is_object() &&
          (*rp)["sliding_attention"].value("rope_theta", 0.0) > 0)
        cfg.rope_local.theta = (*rp)["sliding_attention"]["rope_theta"].get<float>();
    }
    std::map<std::string, std::string> layer, globals;
    LlamaFamilyHfNames(&layer, &globals);
    layer["post_attention_layernorm.weight"] = "post_attention_norm.weight";
    layer["pre_feedforward_layernorm.weight"] = "ffn_norm.weight";
    layer["post_feedforward_layernorm.weight"] = "post_ffw_norm.weight";
    layer["self_attn.q_norm.weight"] = "attn_q_norm.weight";
    layer["self_attn.k_norm.weight"] = "attn_k_norm.weight";
    files->SetHfNameMap(layer, globals);
  }
  cfg.rope_local.rot_dim = cfg.rope.rot_dim;
  cfg.rope_local.style = kernels::RopeStyle::kNeox;
  if (files->is_gguf()) cfg.rope_local.theta = 10000.0f;
  if (cfg.sliding_window > 0) {
    cfg.layer_sliding.resize(cfg.n_layers);
    // HF layer_types, when given, say exactly which layers slide.
    const nlohmann::json* types = files->is_gguf() ? nullptr : r.Json("layer_types");
    for (int il = 0; il < cfg.n_layers; ++il) {
      if (types && types->is_array() && il < static_cast<int>(types->size()))
        cfg.layer_sliding[il] = (*types)[il] == "sliding_attention";
      else
        cfg.layer_sliding[il] = (il + 1) % pattern != 0;
    }
  }
  PENG_ASSIGN_OR_RETURN(auto m, DecoderModel::Load(std::move(files), cfg, options.tp, options.pp));
  return std::unique_ptr<Model>(std::move(m));
}

}  // namespace peng
