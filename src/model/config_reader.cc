#include "model/config_reader.h"

#include <cmath>

namespace peng {

std::string ConfigReader::Where(const std::string& key) const {
  if (files_.is_gguf()) return files_.path() + ": metadata '" + files_.arch() + "." + key + "'";
  return files_.path() + "/config.json: field '" + key + "'";
}

const nlohmann::json* ConfigReader::Json(const std::string& key) const {
  const nlohmann::json& j = files_.hf_config();
  if (!j.is_object()) return nullptr;
  auto it = j.find(key);
  if (it == j.end() || it->is_null()) return nullptr;
  return &*it;
}

std::optional<int64_t> ConfigReader::RawInt(const std::string& key) const {
  if (files_.is_gguf()) return files_.gguf()->GetInt(key);
  const nlohmann::json* v = Json(key);
  if (v && v->is_number_integer()) return v->get<int64_t>();
  return std::nullopt;
}

StatusOr<int64_t> ConfigReader::Int(const std::string& key) const {
  if (files_.is_gguf()) {
    auto v = files_.gguf()->GetInt(files_.arch() + "." + key);
    if (!v) return DataLoss(Where(key) + " is missing or not an integer");
    return *v;
  }
  const nlohmann::json* v = Json(key);
  if (!v || !v->is_number_integer()) return DataLoss(Where(key) + " is missing or not an integer");
  return v->get<int64_t>();
}

int64_t ConfigReader::IntOr(const std::string& key, int64_t def) const {
  auto v = Int(key);
  return v.ok() ? *v : def;
}

StatusOr<double> ConfigReader::Float(const std::string& key) const {
  if (files_.is_gguf()) {
    auto v = files_.gguf()->GetFloat(files_.arch() + "." + key);
    if (!v) return DataLoss(Where(key) + " is missing or not a number");
    return *v;
  }
  const nlohmann::json* v = Json(key);
  if (!v || !v->is_number()) return DataLoss(Where(key) + " is missing or not a number");
  return v->get<double>();
}

double ConfigReader::FloatOr(const std::string& key, double def) const {
  auto v = Float(key);
  return v.ok() ? *v : def;
}

bool ConfigReader::BoolOr(const std::string& key, bool def) const {
  if (files_.is_gguf()) {
    auto v = files_.gguf()->GetBool(files_.arch() + "." + key);
    return v ? *v : def;
  }
  const nlohmann::json* v = Json(key);
  return v && v->is_boolean() ? v->get<bool>() : def;
}

namespace {

Status ReadGguf(const ModelFiles& files, const ConfigReader& r, ModelConfig* c) {
  const GgufFile& g = *files.gguf();
  PENG_ASSIGN_OR_RETURN(c->hidden_size, r.Int("embedding_length"));
  PENG_ASSIGN_OR_RETURN(c->n_layers, r.Int("block_count"));
  PENG_ASSIGN_OR_RETURN(c->n_heads, r.Int("attention.head_count"));
  c->n_kv_heads = r.IntOr("attention.head_count_kv", c->n_heads);
  PENG_ASSIGN_OR_RETURN(c->ffn_dim, r.Int("feed_forward_length"));
  c->max_position = r.IntOr("context_length", 2048);
  PENG_ASSIGN_OR_RETURN(double eps, r.Float("attention.layer_norm_rms_epsilon"));
  c->rms_eps = static_cast<float>(eps);
  c->head_dim = r.IntOr("attention.key_length", c->n_heads ? c->hidden_size / c->n_heads : 0);
  c->rope.rot_dim = static_cast<int>(r.IntOr("rope.dimension_count", c->head_dim));
  c->rope.theta = static_cast<float>(r.FloatOr("rope.freq_base", 10000.0));
  const auto scaling = g.GetString(files.arch() + ".rope.scaling.type");
  if (scaling && *scaling == "linear") {
    c->rope.scaling = kernels::RopeConfig::Scaling::kLinear;
    c->rope.factor = static_cast<float>(r.FloatOr("rope.scaling.factor", 1.0));
  } else if (scaling && *scaling == "yarn") {
    c->rope.scaling = kernels::RopeConfig::Scaling::kYarn;
    c->rope.factor = static_cast<float>(r.FloatOr("rope.scaling.factor", 1.0));
    c->rope.original_max_position =
        static_cast<int>(r.IntOr("rope.scaling.original_context_length", c->max_position));
  }
  const std::vector<std::string>* tokens = g.GetStringArray("tokenizer.ggml.tokens");
  c->vocab_size = r.IntOr("vocab_size", tokens ? static_cast<int64_t>(tokens->size()) : 0);
  if (const TensorView* emb = files.Find("token_embd.weight")) c->vocab_size = emb->dim(0);
  c->bos_id = static_cast<int>(g.GetInt("tokenizer.ggml.bos_token_id").value_or(-1));
  c->eos_id = static_cast<int>(g.GetInt("tokenizer.ggml.eos_token_id").value_or(-1));
  c->name = g.GetString("general.name").value_or(files.arch());
  c->tie_embeddings = files.Find("output.weight") == nullptr;
  return OkStatus();
}

Status ReadHfRope(const ConfigReader& r, ModelConfig* c) {
  // transformers 5 writes rope_parameters {rope_type, rope_theta, factor, ...}; older versions
  // write rope_theta + rope_scaling {type | rope_type, factor, ...}.
  // Models with per-layer-type rope (Gemma 3 in transformers 5) nest it by attention type;
  // the global layers' settings are under "full_attention".
  const nlohmann::json* params = r.Json("rope_parameters");
  if (!params) params = r.Json("rope_scaling");
  c->rope.theta = static_cast<float>(r.FloatOr("rope_theta", 10000.0));
  if (!params || !params->is_object()) return OkStatus();
  if (params->contains("full_attention") && (*params)["full_attention"].is_object())
    params = &(*params)["full_attention"];
  if (params->contains("rope_theta") && (*params)["rope_theta"].is_number())
    c->rope.theta = (*params)["rope_theta"].get<float>();
  std::string type = params->value("rope_type", params->value("type", std::string("default")));
  const float factor = params->value("factor", 1.0f);
  if (type == "linear") {
    c->rope.scaling = kernels::RopeConfig::Scaling::kLinear;
    c->rope.factor = factor;
  } else if (type == "yarn") {
    c->rope.scaling = kernels::RopeConfig::Scaling::kYarn;
    c->rope.factor = factor;
    c->rope.original_max_position = params->value("original_max_position_embeddings", 0);
    c->rope.beta_fast = params->value("beta_fast", 32.0f);
    c->rope.beta_slow = params->value("beta_slow", 1.0f);
  } else if (type != "default") {
    return Unimplemented("rope scaling type '" + type + "' is not supported");
  }
  return OkStatus();
}

Status ReadHf(const ModelFiles& files, const ConfigReader& r, ModelConfig* c) {
  PENG_ASSIGN_OR_RETURN(c->hidden_size, r.Int("hidden_size"));
  PENG_ASSIGN_OR_RETURN(c->n_layers, r.Int("num_hidden_layers"));
  PENG_ASSIGN_OR_RETURN(c->n_heads, r.Int("num_attention_heads"));
  c->n_kv_heads = r.IntOr("num_key_value_heads", c->n_heads);
  PENG_ASSIGN_OR_RETURN(c->ffn_dim, r.Int("intermediate_size"));
  PENG_ASSIGN_OR_RETURN(c->vocab_size, r.Int("vocab_size"));
  c->max_position = r.IntOr("max_position_embeddings", 2048);
  c->rms_eps = static_cast<float>(r.FloatOr("rms_norm_eps", 1e-6));
  c->head_dim = r.IntOr("head_dim", c->n_heads ? c->hidden_size / c->n_heads : 0);
  c->rope.rot_dim = static_cast<int>(c->head_dim);
  c->rope.style = kernels::RopeStyle::kNeox;  // HF applies rotate_half to unpermuted weights
  PENG_RETURN_IF_ERROR(ReadHfRope(r, c));
  c->tie_embeddings = r.BoolOr("tie_word_embeddings", false);
  c->bos_id = static_cast<int>(r.RawInt("bos_token_id").value_or(-1));
  if (const nlohmann::json* e = r.Json("eos_token_id")) {
    if (e->is_number_integer()) c->eos_id = e->get<int>();
    if (e->is_array() && !e->empty() && (*e)[0].is_number_integer()) c->eos_id = (*e)[0].get<int>();
  }
  c->name = files.path();
  return OkStatus();
}

}  // namespace

Status ReadCommonConfig(const ModelFiles& files, ModelConfig* cfg) {
  ConfigReader r(files);
  cfg->arch = files.arch();
  return files.is_gguf() ? ReadGguf(files, r, cfg) : ReadHf(files, r, cfg);
}

void LlamaFamilyHfNames(std::map<std::string, std::string>* layer,
                        std::map<std::string, std::string>* globals) {
  *globals = {{"model.embed_tokens.weight", "token_embd.weight"},
              {"model.norm.weight", "output_norm.weight"},
              {"lm_head.weight", "output.weight"}};
  *layer = {{"input_layernorm.weight", "attn_norm.weight"},
            {"self_attn.q_proj.weight", "attn_q.weight"},
            {"self_attn.k_proj.weight", "attn_k.weight"},
            {"self_attn.v_proj.weight", "attn_v.weight"},
            {"self_attn.q_proj.bias", "attn_q.bias"},
            {"self_attn.k_proj.bias", "attn_k.bias"},
            {"self_attn.v_proj.bias", "attn_v.bias"},
            {"self_attn.o_proj.weight", "attn_output.weight"},
            {"post_attention_layernorm.weight", "ffn_norm.weight"},
            {"mlp.gate_proj.weight", "ffn_gate.weight"},
            {"mlp.up_proj.weight", "ffn_up.weight"},
            {"mlp.down_proj.weight", "ffn_down.weight"}};
}

}  // namespace peng
