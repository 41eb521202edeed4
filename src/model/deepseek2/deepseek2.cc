#include "model/deepseek2/deepseek2.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>

#include "kernels/mla.h"
#include "kernels/ops.h"
#include "kernels/work_counter.h"
#include "model/config_reader.h"
#include "model/registry.h"
#include "parallel/communicator.h"

namespace peng {

using TopkMethod = DeepseekV2Config::TopkMethod;
using Scoring = DeepseekV2Config::Scoring;

namespace {

// YaRN's magnitude correction: 0.1 * m * ln(s) + 1 for s > 1 (DeepSeek's yarn_get_mscale).
double YarnMscale(double scale, double m) {
  return scale <= 1.0 ? 1.0 : 0.1 * m * std::log(scale) + 1.0;
}

std::string Num(int64_t v) { return std::to_string(v); }

// ---------------------------------------------------------------------------------------------
// Config

Status ReadHfDeepseek(const ModelFiles& files, DeepseekV2Config* c) {
  const ConfigReader r(files);
  const std::string where = files.path() + "/config.json";
  auto required = [&](const std::string& key, int64_t* out) -> Status {
    PENG_ASSIGN_OR_RETURN(*out, r.Int(key));
    return OkStatus();
  };
  // Integer field that may be absent or null (-> def); present with another type is an error.
  auto optional = [&](const std::string& key, int64_t def, int64_t* out) -> Status {
    const nlohmann::json* v = r.Json(key);
    if (!v) {
      *out = def;
      return OkStatus();
    }
    if (!v->is_number_integer()) return DataLoss(where + ": field '" + key + "' is not an integer");
    *out = v->get<int64_t>();
    return OkStatus();
  };
  auto string_or = [&](const std::string& key, const std::string& def, std::string* out) -> Status {
    const nlohmann::json* v = r.Json(key);
    if (!v) {
      *out = def;
      return OkStatus();
    }
    if (!v->is_string()) return DataLoss(where + ": field '" + key + "' is not a string");
    *out = v->get<std::string>();
    return OkStatus();
  };

  PENG_RETURN_IF_ERROR(required("kv_lora_rank", &c->kv_lora_rank));
  PENG_RETURN_IF_ERROR(optional("q_lora_rank", 0, &c->q_lora_rank));
  if (r.Json("q_lora_rank") && c->q_lora_rank <= 0)
    return InvalidArgument(where + ": field 'q_lora_rank' must be positive or null, got " +
                           Num(c->q_lora_rank));
  PENG_RETURN_IF_ERROR(required("qk_nope_head_dim", &c->qk_nope_head_dim));
  PENG_RETURN_IF_ERROR(required("qk_rope_head_dim", &c->qk_rope_head_dim));
  PENG_RETURN_IF_ERROR(required("v_head_dim", &c->v_head_dim));
  c->attention_bias = r.BoolOr("attention_bias", false);

  PENG_RETURN_IF_ERROR(optional("n_routed_experts", 0, &c->n_routed_experts));
  if (c->n_routed_experts > 0) {
    PENG_RETURN_IF_ERROR(required("num_experts_per_tok", &c->num_experts_per_tok));
    PENG_RETURN_IF_ERROR(required("moe_intermediate_size", &c->moe_intermediate_size));
    PENG_RETURN_IF_ERROR(optional("n_shared_experts", 0, &c->n_shared_experts));
    PENG_RETURN_IF_ERROR(optional("first_k_dense_replace", 0, &c->first_k_dense_replace));
    PENG_RETURN_IF_ERROR(optional("moe_layer_freq", 1, &c->moe_layer_freq));
    PENG_RETURN_IF_ERROR(optional("n_group", 1, &c->n_group));
    PENG_RETURN_IF_ERROR(optional("topk_group", 1, &c->topk_group));
    std::string method, scoring;
    PENG_RETURN_IF_ERROR(string_or("topk_method", "greedy", &method));
    PENG_RETURN_IF_ERROR(string_or("scoring_func", "softmax", &scoring));
    if (method == "greedy") {
      c->topk_method = TopkMethod::kGreedy;
    } else if (method == "group_limited_greedy") {
      c->topk_method = TopkMethod::kGroupLimitedGreedy;
    } else if (method == "noaux_tc") {
      c->topk_method = TopkMethod::kNoauxTc;
    } else {
      return Unimplemented(where + ": field 'topk_method' is '" + method +
                           "' (supported: greedy, group_limited_greedy, noaux_tc)");
    }
    if (scoring == "softmax") {
      c->scoring = Scoring::kSoftmax;
    } else if (scoring == "sigmoid") {
      c->scoring = Scoring::kSigmoid;
    } else {
      return Unimplemented(where + ": field 'scoring_func' is '" + scoring +
                           "' (supported: softmax, sigmoid)");
    }
    // noaux_tc is defined with sigmoid scores (DeepSeek-V3); the other methods with softmax.
    if (c->topk_method == TopkMethod::kNoauxTc) {
      c->scoring = Scoring::kSigmoid;
    } else if (c->scoring == Scoring::kSigmoid) {
      return Unimplemented(where +
                           ": scoring_func 'sigmoid' is only supported with "
                           "topk_method 'noaux_tc', not '" +
                           method + "'");
    }
    c->routed_scaling_factor = static_cast<float>(r.FloatOr("routed_scaling_factor", 1.0));
    c->norm_topk_prob = r.BoolOr("norm_topk_prob", false);
  } else {
    c->first_k_dense_replace = c->base.n_layers;  // no experts: every layer is dense
  }

  // RoPE: ReadHfRope (via ReadCommonConfig) parsed theta and the YaRN inv_freq parameters from
  // rope_parameters or rope_scaling; the magnitudes are DeepSeek-specific.
  const nlohmann::json* rp = r.Json("rope_parameters");
  if (!rp) rp = r.Json("rope_scaling");
  const bool yarn = c->base.rope.scaling == kernels::RopeConfig::Scaling::kYarn;
  // transformers falls back to max_position_embeddings without original_max_position_embeddings.
  if (yarn && c->base.rope.original_max_position <= 0)
    c->base.rope.original_max_position = static_cast<int>(c->base.max_position);
  const double factor = c->base.rope.factor;
  double softmax_mscale = 1.0;
  if (yarn && rp && rp->is_object()) {
    auto number = [&](const char* key) -> double {
      auto it = rp->find(key);
      return it != rp->end() && it->is_number() ? it->get<double>() : 0.0;
    };
    const double mscale = number("mscale"), mscale_all_dim = number("mscale_all_dim");
    const double explicit_factor = number("attention_factor");
    // transformers: an explicit attention_factor wins; else the ratio when both mscales are
    // given (1 for every released DeepSeek-V2 config); else the generic YaRN correction.
    double amplitude;
    if (explicit_factor > 0) {
      amplitude = explicit_factor;
    } else if (mscale != 0 && mscale_all_dim != 0) {
      amplitude = YarnMscale(factor, mscale) / YarnMscale(factor, mscale_all_dim);
    } else {
      amplitude = YarnMscale(factor, 1.0);
    }
    c->base.rope.attention_factor = static_cast<float>(amplitude);
    if (mscale_all_dim != 0) softmax_mscale = YarnMscale(factor, mscale_all_dim);
  }
  c->softmax_scale = static_cast<float>(std::pow(static_cast<double>(c->qk_head_dim()), -0.5) *
                                        softmax_mscale * softmax_mscale);
  return OkStatus();
}

Status ReadGgufDeepseek(const ModelFiles& files, DeepseekV2Config* c) {
  const ConfigReader r(files);
  const std::string a = files.arch() + ".";
  PENG_ASSIGN_OR_RETURN(c->kv_lora_rank, r.Int("attention.kv_lora_rank"));
  c->q_lora_rank = r.IntOr("attention.q_lora_rank", 0);
  if (const TensorView* qa = files.Find("blk.0.attn_q_a.weight"); qa && qa->ndim() == 2)
    c->q_lora_rank = qa->dim(0);  // V2-Lite GGUFs carry no q_lora_rank key
  PENG_ASSIGN_OR_RETURN(c->qk_rope_head_dim, r.Int("rope.dimension_count"));
  // Newer converters store the MQA view (key_length = kv_lora_rank + rope dims) and the real
  // head sizes under *_mla; older ones only the real sizes.
  int64_t k_len = r.IntOr("attention.key_length_mla", 0);
  if (k_len <= 0) {
    PENG_ASSIGN_OR_RETURN(k_len, r.Int("attention.key_length"));
  }
  c->v_head_dim = r.IntOr("attention.value_length_mla", 0);
  if (c->v_head_dim <= 0) {
    PENG_ASSIGN_OR_RETURN(c->v_head_dim, r.Int("attention.value_length"));
  }
  c->qk_nope_head_dim = k_len - c->qk_rope_head_dim;

  c->first_k_dense_replace = r.IntOr("leading_dense_block_count", 0);
  c->n_routed_experts = r.IntOr("expert_count", 0);
  if (c->n_routed_experts > 0) {
    PENG_ASSIGN_OR_RETURN(c->num_experts_per_tok, r.Int("expert_used_count"));
    PENG_ASSIGN_OR_RETURN(c->moe_intermediate_size, r.Int("expert_feed_forward_length"));
    c->n_shared_experts = r.IntOr("expert_shared_count", 0);
    c->routed_scaling_factor = static_cast<float>(r.FloatOr("expert_weights_scale", 1.0));
    c->norm_topk_prob = r.BoolOr("expert_weights_norm", false);
    c->n_group = r.IntOr("expert_group_count", 1);
    c->topk_group = r.IntOr("expert_group_used_count", 1);
    const int64_t gating = r.IntOr("expert_gating_func", 1);  // llama.cpp: 1 softmax, 2 sigmoid
    if (gating == 2) {
      c->scoring = Scoring::kSigmoid;
      c->topk_method = TopkMethod::kNoauxTc;
    } else if (gating == 1 || gating == 0) {
      c->topk_method = c->n_group > 1 ? TopkMethod::kGroupLimitedGreedy : TopkMethod::kGreedy;
    } else {
      return Unimplemented(files.path() + ": metadata '" + a + "expert_gating_func' is " +
                           Num(gating) + " (supported: 1 softmax, 2 sigmoid)");
    }
  } else {
    c->first_k_dense_replace = c->base.n_layers;
  }
  c->base.rope.beta_fast = static_cast<float>(r.FloatOr("rope.scaling.yarn_beta_fast", 32.0));
  c->base.rope.beta_slow = static_cast<float>(r.FloatOr("rope.scaling.yarn_beta_slow", 1.0));
  // llama.cpp's converter stores rope.scaling.yarn_log_multiplier = 0.1 * mscale_all_dim and no
  // separate mscale: the RoPE amplitude is 1 (mscale == mscale_all_dim in every released
  // DeepSeek-V2 config) and the softmax scale carries mscale(factor, mscale_all_dim)^2.
  double softmax_mscale = 1.0;
  if (c->base.rope.scaling == kernels::RopeConfig::Scaling::kYarn) {
    const double mscale_all_dim = r.FloatOr("rope.scaling.yarn_log_multiplier", 0.0) / 0.1;
    if (mscale_all_dim != 0) softmax_mscale = YarnMscale(c->base.rope.factor, mscale_all_dim);
    c->base.rope.attention_factor = 1.f;
  }
  c->softmax_scale = static_cast<float>(std::pow(static_cast<double>(c->qk_head_dim()), -0.5) *
                                        softmax_mscale * softmax_mscale);
  return OkStatus();
}

Status Validate(const ModelFiles& files, const DeepseekV2Config& c) {
  const std::string where = files.path() + (files.is_gguf() ? "" : "/config.json");
  auto bad = [&](const std::string& what) {
    return InvalidArgument(where + ": inconsistent DeepSeek-V2 config: " + what);
  };
  const ModelConfig& b = c.base;
  if (b.n_layers <= 0 || b.hidden_size <= 0 || b.n_heads <= 0 || b.vocab_size <= 0)
    return bad("layers, hidden size, heads and vocabulary must be positive (" + b.Summary() + ")");
  if (c.kv_lora_rank <= 0) return bad("kv_lora_rank must be positive, got " + Num(c.kv_lora_rank));
  if (c.q_lora_rank < 0) return bad("q_lora_rank must be positive or null");
  if (c.qk_rope_head_dim <= 0 || c.qk_rope_head_dim % 2 != 0)
    return bad("qk_rope_head_dim must be positive and even, got " + Num(c.qk_rope_head_dim));
  if (c.qk_nope_head_dim <= 0)
    return bad("qk_nope_head_dim must be positive, got " + Num(c.qk_nope_head_dim));
  if (c.v_head_dim <= 0) return bad("v_head_dim must be positive, got " + Num(c.v_head_dim));
  if (c.kv_lora_rank > 4096) return bad("kv_lora_rank " + Num(c.kv_lora_rank) + " > 4096");
  if (c.v_head_dim > 4096) return bad("v_head_dim " + Num(c.v_head_dim) + " > 4096");
  if (c.qk_rope_head_dim > 1024)
    return bad("qk_rope_head_dim " + Num(c.qk_rope_head_dim) + " > 1024");
  if (b.rope.scaling == kernels::RopeConfig::Scaling::kYarn && b.rope.factor > 1.f &&
      b.rope.original_max_position <= 0)
    return bad("YaRN RoPE needs original_max_position_embeddings > 0");
  if (!(b.rope.theta > 1.f)) return bad("rope_theta must be > 1");
  if (c.first_k_dense_replace < 0) return bad("first_k_dense_replace must be >= 0");
  if (c.first_k_dense_replace > 0 && b.ffn_dim <= 0)
    return bad("dense layers need intermediate_size > 0");
  if (c.n_routed_experts < 0) return bad("n_routed_experts must be >= 0");
  if (c.n_routed_experts > 0) {
    const int64_t E = c.n_routed_experts;
    if (c.num_experts_per_tok < 1 || c.num_experts_per_tok > E)
      return bad("num_experts_per_tok " + Num(c.num_experts_per_tok) + " is not in [1, " + Num(E) +
                 "]");
    if (c.moe_intermediate_size <= 0) return bad("moe_intermediate_size must be positive");
    if (c.n_shared_experts < 0) return bad("n_shared_experts must be >= 0");
    if (c.moe_layer_freq < 1) return bad("moe_layer_freq must be >= 1");
    if (c.topk_method != TopkMethod::kGreedy) {
      if (c.n_group < 1 || E % c.n_group != 0)
        return bad("n_group " + Num(c.n_group) + " does not divide n_routed_experts " + Num(E));
      if (c.topk_group < 1 || c.topk_group > c.n_group)
        return bad("topk_group " + Num(c.topk_group) + " is not in [1, n_group " + Num(c.n_group) +
                   "]");
      if (c.num_experts_per_tok > c.topk_group * (E / c.n_group))
        return bad("num_experts_per_tok " + Num(c.num_experts_per_tok) +
                   " exceeds the experts of topk_group groups");
    }
  }
  return OkStatus();
}

}  // namespace

kernels::MoeRouting DeepseekV2Config::Routing() const {
  kernels::MoeRouting r;
  r.n_experts = static_cast<int>(n_routed_experts);
  r.k = static_cast<int>(num_experts_per_tok);
  r.n_group = static_cast<int>(n_group);
  r.topk_group = static_cast<int>(topk_group);
  r.method = topk_method;
  r.sigmoid = scoring == Scoring::kSigmoid;
  r.norm_topk_prob = norm_topk_prob;
  r.routed_scaling_factor = routed_scaling_factor;
  return r;
}

bool DeepseekV2Config::IsMoeLayer(int64_t il) const {
  return n_routed_experts > 0 && il >= first_k_dense_replace && il % moe_layer_freq == 0;
}

StatusOr<DeepseekV2Config> ReadDeepseekV2Config(const ModelFiles& files) {
  DeepseekV2Config c;
  PENG_RETURN_IF_ERROR(ReadCommonConfig(files, &c.base));
  PENG_RETURN_IF_ERROR(files.is_gguf() ? ReadGgufDeepseek(files, &c) : ReadHfDeepseek(files, &c));
  PENG_RETURN_IF_ERROR(Validate(files, c));
  ModelConfig& b = c.base;
  b.arch = "deepseek2";
  b.head_dim = c.qk_head_dim();
  b.n_kv_heads = 1;  // the latent cache is one shared "kv head"
  b.rope.rot_dim = static_cast<int>(c.qk_rope_head_dim);
  b.rope.style = kernels::RopeStyle::kInterleaved;  // pairs (2i, 2i+1), no weight permutation
  b.attn_scale = c.softmax_scale;
  b.activation = Activation::kSilu;
  if (b.ffn_dim <= 0) b.ffn_dim = c.moe_intermediate_size;
  return c;
}

// ---------------------------------------------------------------------------------------------
// Loading

StatusOr<std::unique_ptr<DeepseekV2Model>> DeepseekV2Model::Load(
    std::unique_ptr<ModelFiles> files, Communicator* tp, bool expert_parallel,
    Communicator* ep_replicas, Communicator* pp) {
  PENG_ASSIGN_OR_RETURN(DeepseekV2Config cfg, ReadDeepseekV2Config(*files));
  std::unique_ptr<DeepseekV2Model> m(new DeepseekV2Model());
  m->files_ = std::move(files);
  m->cfg_ = cfg;
  PENG_RETURN_IF_ERROR(m->stage_.Plan(cfg.base.n_layers, pp, m->files_->path()));
  if (tp && tp->size() > 1) {
    m->tp_ = tp;
    m->tp_size_ = tp->size();
    m->tp_rank_ = tp->rank();
    m->expert_parallel_ = expert_parallel;
  }
  if (expert_parallel && ep_replicas && ep_replicas->size() > 1) {
    m->ep_ = ep_replicas;
    // From this many tokens in a step (all replicas together) the experts' exchange is an
    // all-to-all instead of all-gather + reduce-scatter. PENG_EP_ALL_TO_ALL_TOKENS overrides it
    // (the same on every rank: mpirun passes the environment).
    if (const char* v = std::getenv("PENG_EP_ALL_TO_ALL_TOKENS"))
      m->ep_all_to_all_tokens_ = std::max<int64_t>(1, std::atoll(v));
  }
  if (!m->files_->is_gguf()) {
    // The llama-family names (norms, q_proj, o_proj, dense MLP, embeddings, head) plus MLA and
    // MoE tensors.
    LlamaFamilyHfNames(&m->hf_layer_names_, &m->hf_global_names_);
    auto& n = m->hf_layer_names_;
    n.insert({{"self_attn.o_proj.bias", "attn_output.bias"},
         {"self_attn.q_a_proj.weight", "attn_q_a.weight"},
         {"self_attn.q_a_proj.bias", "attn_q_a.bias"},
         {"self_attn.q_a_layernorm.weight", "attn_q_a_norm.weight"},
         {"self_attn.q_b_proj.weight", "attn_q_b.weight"},
         {"self_attn.q_b_proj.bias", "attn_q_b.bias"},
         {"self_attn.kv_a_proj_with_mqa.weight", "attn_kv_a_mqa.weight"},
         {"self_attn.kv_a_proj_with_mqa.bias", "attn_kv_a_mqa.bias"},
         {"self_attn.kv_a_layernorm.weight", "attn_kv_a_norm.weight"},
         {"self_attn.kv_b_proj.weight", "attn_kv_b.weight"},
         {"mlp.gate.weight", "ffn_gate_inp.weight"},
         {"mlp.gate.e_score_correction_bias", "exp_probs_b.bias"},
         {"mlp.shared_experts.gate_proj.weight", "ffn_gate_shexp.weight"},
         {"mlp.shared_experts.up_proj.weight", "ffn_up_shexp.weight"},
         {"mlp.shared_experts.down_proj.weight", "ffn_down_shexp.weight"},
         // transformers 5 runtime layout (save_pretrained(save_original_format=False)).
         {"mlp.experts.gate_up_proj", "ffn_gate_up_exps.weight"},
         {"mlp.experts.down_proj", "ffn_down_exps.weight"}});
    for (int64_t e = 0; e < cfg.n_routed_experts; ++e) {
      const std::string hf = "mlp.experts." + Num(e) + ".", idx = "[" + Num(e) + "]";
      n[hf + "gate_proj.weight"] = "ffn_gate_exps.weight" + idx;
      n[hf + "up_proj.weight"] = "ffn_up_exps.weight" + idx;
      n[hf + "down_proj.weight"] = "ffn_down_exps.weight" + idx;
    }
    m->files_->SetHfNameMap(m->hf_layer_names_, m->hf_global_names_);
  }
  PENG_RETURN_IF_ERROR(m->Bind());
  return m;
}

Status DeepseekV2Model::Annotate(const Status& s, const std::string& name) const {
  if (s.ok() || files_->is_gguf()) return s;
  std::string hf;
  for (const auto& [k, v] : hf_global_names_)
    if (v == name) hf = k;
  if (hf.empty() && name.rfind("blk.", 0) == 0) {
    const size_t dot = name.find('.', 4);
    const std::string layer = name.substr(4, dot - 4), suffix = name.substr(dot + 1);
    for (const auto& [k, v] : hf_layer_names_)
      if (v == suffix) hf = "model.layers." + layer + "." + k;
  }
  if (hf.empty()) return s;
  return Status(s.code(), s.message() + " (Hugging Face name '" + hf + "')");
}

StatusOr<Linear> DeepseekV2Model::Matrix(const std::string& name, int64_t rows, int64_t cols) {
  StatusOr<Linear> l = Linear::Bind(*files_, name, rows, cols);
  if (!l.ok()) return Annotate(l.status(), name);
  return l;
}

StatusOr<Linear> DeepseekV2Model::Shard(const std::string& name, int64_t rows, int64_t cols,
                                        int64_t r0, int64_t nr, int64_t c0, int64_t nc) {
  StatusOr<Linear> l = Linear::BindShard(*files_, name, rows, cols, r0, nr, c0, nc);
  if (!l.ok()) return Annotate(l.status(), name);
  return l;
}

void DeepseekV2Model::AllReduce(float* x, int64_t n) {
  if (tp_) tp_->AllReduceSum(x, n);
}

float* DeepseekV2Model::OwnFloats(int64_t n) {
  owned_.emplace_back(n);
  return owned_.back().data();
}

StatusOr<const float*> DeepseekV2Model::Vector(const std::string& name, int64_t n, bool optional) {
  StatusOr<const float*> v = BindVector(*files_, name, n, optional, &owned_);
  if (!v.ok()) return Annotate(v.status(), name);
  return v;
}

// Heads: n_heads / tp per rank. Dense FFN, shared experts and (without expert parallelism) each
// routed expert: contiguous column ranges cut at whole blocks of their down projections (the
// coarsest block type any layer stores them in). Expert parallelism: E / tp whole experts each.
Status DeepseekV2Model::PlanTensorParallel() {
  const DeepseekV2Config& c = cfg_;
  const int tp = tp_size_, r = tp_rank_;
  const std::string& path = files_->path();
  if (c.base.n_heads % tp != 0)
    return InvalidArgument(path + ": " + Num(c.base.n_heads) +
                           " attention heads cannot be split for tensor parallel size " + Num(tp));
  n_heads_ = c.base.n_heads / tp;
  head0_ = r * n_heads_;
  std::vector<std::string> dense, shared, routed;
  for (int il = 0; il < c.base.n_layers; ++il) {
    const std::string p = "blk." + Num(il) + ".";
    if (!c.IsMoeLayer(il)) {
      dense.push_back(p + "ffn_down.weight");
      continue;
    }
    shared.push_back(p + "ffn_down_shexp.weight");
    routed.push_back(p + "ffn_down_exps.weight");
    routed.push_back(p + "ffn_down_exps.weight[0]");  // one 2-D tensor per expert (HF)
  }
  auto split = [&](const std::vector<std::string>& names, int64_t total, const std::string& what,
                   TpSlice* out) -> Status {
    if (names.empty() || total == 0) return OkStatus();
    PENG_ASSIGN_OR_RETURN(const int64_t g, ColumnGranularityOf(*files_, names));
    PENG_ASSIGN_OR_RETURN(*out, SplitAtBlocks(total, g, tp, r, path + ": " + what));
    return OkStatus();
  };
  PENG_RETURN_IF_ERROR(split(dense, c.base.ffn_dim, "the dense FFN", &dense_ffn_));
  PENG_RETURN_IF_ERROR(split(shared, c.moe_intermediate_size * c.n_shared_experts,
                             "the shared experts' FFN", &shared_ffn_));
  if (expert_parallel_) {
    const int64_t E = c.n_routed_experts;
    if (E % tp != 0)
      return InvalidArgument(path + ": " + Num(E) + " routed experts cannot be divided among " +
                             Num(tp) + " expert-parallel ranks");
    experts_ = {r * (E / tp), E / tp};
  } else {
    PENG_RETURN_IF_ERROR(
        split(routed, c.moe_intermediate_size, "each routed expert's FFN", &expert_ffn_));
  }
  return OkStatus();
}

Status DeepseekV2Model::Bind() {
  const ModelConfig& b = cfg_.base;
  const int64_t D = b.hidden_size;
  n_heads_ = b.n_heads;
  dense_ffn_ = {0, b.ffn_dim};
  shared_ffn_ = {0, cfg_.moe_intermediate_size * cfg_.n_shared_experts};
  expert_ffn_ = {0, cfg_.moe_intermediate_size};
  experts_ = {0, cfg_.n_routed_experts};
  PENG_RETURN_IF_ERROR(vocab_.Plan(b.vocab_size, tp_, files_->path()));
  if (tp_) PENG_RETURN_IF_ERROR(PlanTensorParallel());
  if (ep_) {  // whole experts over all tensor x data-parallel ranks: g of G
    const int64_t G = int64_t{tp_size_} * ep_->size();
    const int64_t g = int64_t{ep_->rank()} * tp_size_ + tp_rank_;
    const int64_t E = cfg_.n_routed_experts;
    if (E % G != 0)
      return InvalidArgument(files_->path() + ": " + Num(E) + " routed experts cannot be divided " +
                             "among " + Num(G) + " expert-parallel ranks");
    experts_ = {g * (E / G), E / G};
    expert_ffn_ = {0, cfg_.moe_intermediate_size};
  }
  const int64_t v0 = vocab_.begin(), nv = vocab_.size();
  PENG_ASSIGN_OR_RETURN(tok_embd_, Shard("token_embd.weight", b.vocab_size, D, v0, nv, 0, D));
  PENG_ASSIGN_OR_RETURN(output_norm_, Vector("output_norm.weight", D));
  if (files_->Find("output.weight") && !b.tie_embeddings) {
    PENG_ASSIGN_OR_RETURN(output_, Shard("output.weight", b.vocab_size, D, v0, nv, 0, D));
  } else {
    output_ = tok_embd_;
  }
  layers_.resize(b.n_layers);
  for (int il = stage_.begin(); il < stage_.end(); ++il) {
    PENG_RETURN_IF_ERROR(BindAttention(il, &layers_[il]));
    PENG_RETURN_IF_ERROR(BindFfn(il, &layers_[il]));
  }
  inv_freq_.resize(b.rope.rot_dim / 2);
  kernels::ComputeRopeInvFreq(b.rope, inv_freq_.data());
  return OkStatus();
}

Status DeepseekV2Model::BindAttention(int il, Layer* L) {
  const DeepseekV2Config& c = cfg_;
  const int64_t D = c.base.hidden_size, H = c.base.n_heads;
  const int64_t dn = c.qk_nope_head_dim, dv = c.v_head_dim, r = c.kv_lora_rank;
  const int64_t qd = H * c.qk_head_dim();
  // This rank's heads [h0, h0 + nh): their q rows, kv_b rows and o columns.
  const int64_t h0 = head0_, nh = n_heads_, q0 = h0 * c.qk_head_dim(), nq = nh * c.qk_head_dim();
  const std::string p = "blk." + Num(il) + ".";
  PENG_ASSIGN_OR_RETURN(L->attn_norm, Vector(p + "attn_norm.weight", D));
  if (c.q_lora_rank > 0) {
    PENG_ASSIGN_OR_RETURN(L->wq_a, Matrix(p + "attn_q_a.weight", c.q_lora_rank, D));
    PENG_ASSIGN_OR_RETURN(L->bq_a, Vector(p + "attn_q_a.bias", c.q_lora_rank, !c.attention_bias));
    PENG_ASSIGN_OR_RETURN(L->q_a_norm, Vector(p + "attn_q_a_norm.weight", c.q_lora_rank));
    const int64_t ql = c.q_lora_rank;
    PENG_ASSIGN_OR_RETURN(L->wq_b, Shard(p + "attn_q_b.weight", qd, ql, q0, nq, 0, ql));
    PENG_ASSIGN_OR_RETURN(L->bq_b, Vector(p + "attn_q_b.bias", qd, true));
    if (L->bq_b) L->bq_b += q0;
  } else {
    PENG_ASSIGN_OR_RETURN(L->wq, Shard(p + "attn_q.weight", qd, D, q0, nq, 0, D));
    PENG_ASSIGN_OR_RETURN(L->bq, Vector(p + "attn_q.bias", qd, true));
    if (L->bq) L->bq += q0;
  }
  PENG_ASSIGN_OR_RETURN(L->wkv_a, Matrix(p + "attn_kv_a_mqa.weight", c.cache_row(), D));
  PENG_ASSIGN_OR_RETURN(L->bkv_a,
                        Vector(p + "attn_kv_a_mqa.bias", c.cache_row(), !c.attention_bias));
  PENG_ASSIGN_OR_RETURN(L->kv_a_norm, Vector(p + "attn_kv_a_norm.weight", r));

  // kv_b of the local heads -> FP32 [nh][d_n + d_v][r]: rows h*(d_n+d_v) + [0, d_n) are
  // W_UK[h0 + h], the next d_v W_UV[h0 + h].
  const int64_t kvb_rows = nh * (dn + dv);
  float* w = OwnFloats(kvb_rows * r);
  const std::string kvb = p + "attn_kv_b.weight", kb = p + "attn_k_b.weight",
                    vb = p + "attn_v_b.weight";
  if (files_->Find(kvb) || !files_->Find(kb)) {
    PENG_ASSIGN_OR_RETURN(Linear l, Shard(kvb, H * (dn + dv), r, h0 * (dn + dv), kvb_rows, 0, r));
    for (int64_t row = 0; row < kvb_rows; ++row) l.DequantizeRow(row, w + row * r);
    L->kv_b_parts.push_back(l);
  } else {
    // Newer llama.cpp GGUFs: attn_k_b = W_UK transposed, [H, r, d_n]; attn_v_b = W_UV, [H, d_v, r].
    std::vector<float> tmp(dn);
    for (int64_t h = 0; h < nh; ++h) {
      const int64_t g = h0 + h;  // the head's index in the file
      StatusOr<Linear> k =
          Linear::BindSlice(*files_, kb, H, r, dn, g, 0, r, kb + "[" + Num(g) + "]");
      if (!k.ok()) return k.status();
      StatusOr<Linear> v =
          Linear::BindSlice(*files_, vb, H, dv, r, g, 0, dv, vb + "[" + Num(g) + "]");
      if (!v.ok()) return v.status();
      for (int64_t j = 0; j < r; ++j) {
        k->DequantizeRow(j, tmp.data());
        for (int64_t i = 0; i < dn; ++i) w[(h * (dn + dv) + i) * r + j] = tmp[i];
      }
      for (int64_t i = 0; i < dv; ++i) v->DequantizeRow(i, w + (h * (dn + dv) + dn + i) * r);
      L->kv_b_parts.push_back(*k);
      L->kv_b_parts.push_back(*v);
    }
  }
  TensorView view;
  view.name = p + "attn_kv_b.weight (FP32)";
  view.dtype = DType::kF32;
  view.shape = {kvb_rows, r};
  view.data = w;
  view.size_bytes = static_cast<size_t>(kvb_rows * r) * sizeof(float);
  owned_views_.push_back(view);
  L->w_kvb = w;
  L->w_kvb_view = &owned_views_.back();

  PENG_ASSIGN_OR_RETURN(L->wo, Shard(p + "attn_output.weight", D, H * dv, 0, D, h0 * dv, nh * dv));
  PENG_ASSIGN_OR_RETURN(L->bo, Vector(p + "attn_output.bias", D, !c.attention_bias));
  return OkStatus();
}

Status DeepseekV2Model::BindFfn(int il, Layer* L) {
  const DeepseekV2Config& c = cfg_;
  const int64_t D = c.base.hidden_size;
  const std::string p = "blk." + Num(il) + ".";
  PENG_ASSIGN_OR_RETURN(L->ffn_norm, Vector(p + "ffn_norm.weight", D));
  L->moe = c.IsMoeLayer(il);
  if (!L->moe) {
    const int64_t F = c.base.ffn_dim, f0 = dense_ffn_.begin, nf = dense_ffn_.size;
    PENG_ASSIGN_OR_RETURN(L->w_gate, Shard(p + "ffn_gate.weight", F, D, f0, nf, 0, D));
    PENG_ASSIGN_OR_RETURN(L->w_up, Shard(p + "ffn_up.weight", F, D, f0, nf, 0, D));
    PENG_ASSIGN_OR_RETURN(L->w_down, Shard(p + "ffn_down.weight", D, F, 0, D, f0, nf));
    return OkStatus();
  }
  const int64_t E = c.n_routed_experts;
  PENG_ASSIGN_OR_RETURN(L->router, Matrix(p + "ffn_gate_inp.weight", E, D));
  if (c.topk_method == TopkMethod::kNoauxTc) {
    PENG_ASSIGN_OR_RETURN(L->router_bias, Vector(p + "exp_probs_b.bias", E));
  }
  PENG_RETURN_IF_ERROR(BindExperts(il, L));
  if (c.n_shared_experts > 0) {
    const int64_t S = c.moe_intermediate_size * c.n_shared_experts;
    const int64_t s0 = shared_ffn_.begin, ns = shared_ffn_.size;
    PENG_ASSIGN_OR_RETURN(L->sh_gate, Shard(p + "ffn_gate_shexp.weight", S, D, s0, ns, 0, D));
    PENG_ASSIGN_OR_RETURN(L->sh_up, Shard(p + "ffn_up_shexp.weight", S, D, s0, ns, 0, D));
    PENG_ASSIGN_OR_RETURN(L->sh_down, Shard(p + "ffn_down_shexp.weight", D, S, 0, D, s0, ns));
  }
  return OkStatus();
}

Status DeepseekV2Model::BindExperts(int il, Layer* L) {
  const DeepseekV2Config& c = cfg_;
  const int64_t D = c.base.hidden_size, E = c.n_routed_experts, I = c.moe_intermediate_size;
  const std::string p = "blk." + Num(il) + ".";
  // Stacked 3-D tensors (GGUF; transformers 5 fused layout) or one 2-D tensor per expert (HF).
  const std::string gate_up = p + "ffn_gate_up_exps.weight", gate3 = p + "ffn_gate_exps.weight",
                    up3 = p + "ffn_up_exps.weight", down3 = p + "ffn_down_exps.weight";
  const bool fused = files_->Find(gate_up) != nullptr;
  auto slice = [&](const std::string& name, int64_t total_rows, int64_t cols, int64_t e,
                   int64_t row0, int64_t rows, const std::string& shown) -> StatusOr<Linear> {
    StatusOr<Linear> l =
        Linear::BindSlice(*files_, name, E, total_rows, cols, e, row0, rows, shown);
    if (!l.ok()) return Annotate(l.status(), name);
    return l;
  };
  // This rank's experts (expert parallelism: its own, whole) and of each its intermediate
  // columns [i0, i0 + ni) (tensor parallelism without expert parallelism: a slice of every one).
  const int64_t i0 = expert_ffn_.begin, ni = expert_ffn_.size;
  auto down_cols = [&](StatusOr<Linear> l, const std::string& name) -> StatusOr<Linear> {
    if (!l.ok() || ni == I) return l;
    StatusOr<Linear> cols = l->Columns(*files_, i0, ni);
    if (!cols.ok()) return Annotate(cols.status(), name);
    return cols;
  };
  L->exp_gate.resize(E);
  L->exp_up.resize(E);
  L->exp_down.resize(E);
  for (int64_t e = experts_.begin; e < experts_.begin + experts_.size; ++e) {
    std::string idx = "[";
    idx += Num(e);
    idx += ']';
    const std::string gname = gate3 + idx, uname = up3 + idx, dname = down3 + idx;
    if (fused) {  // [E, 2I, D], gate rows first
      PENG_ASSIGN_OR_RETURN(L->exp_gate[e], slice(gate_up, 2 * I, D, e, i0, ni, gname));
      PENG_ASSIGN_OR_RETURN(L->exp_up[e], slice(gate_up, 2 * I, D, e, I + i0, ni, uname));
    } else {
      if (files_->Find(gate3)) {
        PENG_ASSIGN_OR_RETURN(L->exp_gate[e], slice(gate3, I, D, e, i0, ni, gname));
      } else {
        PENG_ASSIGN_OR_RETURN(L->exp_gate[e], Shard(gname, I, D, i0, ni, 0, D));
      }
      if (files_->Find(up3)) {
        PENG_ASSIGN_OR_RETURN(L->exp_up[e], slice(up3, I, D, e, i0, ni, uname));
      } else {
        PENG_ASSIGN_OR_RETURN(L->exp_up[e], Shard(uname, I, D, i0, ni, 0, D));
      }
    }
    if (files_->Find(down3)) {  // [E, D, I]
      PENG_ASSIGN_OR_RETURN(L->exp_down[e], down_cols(slice(down3, D, I, e, 0, D, dname), down3));
    } else {
      PENG_ASSIGN_OR_RETURN(L->exp_down[e], Shard(dname, D, I, 0, D, i0, ni));
    }
  }
  return OkStatus();
}

KvCacheSpec DeepseekV2Model::kv_spec() const {
  KvCacheSpec spec;
  for (int il = 0; il < cfg_.base.n_layers; ++il)  // (another stage's layer: none)
    spec.layers.push_back({stage_.Holds(il) ? 1 : 0, static_cast<int>(cfg_.cache_row()), 0,
                           static_cast<int>(cfg_.kv_lora_rank)});
  return spec;
}

WeightTraffic DeepseekV2Model::WeightsPerToken() const {
  WeightTraffic w;
  w.bytes = cfg_.base.hidden_size * 4;  // the token's embedding row
  if (stage_.last()) w.Add(output_);
  for (const Layer& L : stage_.Layers(layers_)) {
    for (const Linear* l : {&L.wq, &L.wq_a, &L.wq_b, &L.wkv_a, &L.wo, &L.w_gate, &L.w_up, &L.w_down,
                            &L.router, &L.sh_gate, &L.sh_up, &L.sh_down})
      if (l->bound()) w.Add(*l);
    // kv_b: the stored per-head k_b / v_b, or the FP32 copy (W_UK / W_UV: one multiply-add per
    // value a token, absorbed into the query and the output).
    if (DecodesWithStoredKvb(L)) {
      for (const Linear& l : L.kv_b_parts) w.Add(l);
    } else {
      w.bytes += static_cast<int64_t>(L.w_kvb_view->size_bytes);
      w.float_multiply_adds += L.w_kvb_view->numel();
    }
    if (L.moe && !L.exp_gate.empty()) {  // k of E experts per token, of which this rank's
      WeightTraffic experts;
      for (size_t e = 0; e < L.exp_gate.size(); ++e)
        if (L.exp_gate[e].bound())
          for (const Linear* l : {&L.exp_gate[e], &L.exp_up[e], &L.exp_down[e]}) experts.Add(*l);
      const int64_t E = static_cast<int64_t>(L.exp_gate.size()), k = cfg_.num_experts_per_tok;
      w.bytes += experts.bytes / E * k;
      w.int_multiply_adds += experts.int_multiply_adds / E * k;
      w.float_multiply_adds += experts.float_multiply_adds / E * k;
    }
  }
  return w;
}

std::string DeepseekV2Model::WeightSummary() const { return files_->DTypeSummary(); }

std::vector<const Linear*> DeepseekV2Model::Linears() const {
  std::vector<const Linear*> out = {&tok_embd_};
  for (const Layer& L : stage_.Layers(layers_)) {
    for (const Linear* l : {&L.wq, &L.wq_a, &L.wq_b, &L.wkv_a})
      if (l->bound()) out.push_back(l);
    for (const Linear& l : L.kv_b_parts) out.push_back(&l);
    out.push_back(&L.wo);
    for (const Linear* l : {&L.w_gate, &L.w_up, &L.w_down, &L.router})
      if (l->bound()) out.push_back(l);
    for (size_t e = 0; e < L.exp_gate.size(); ++e)
      for (const Linear* l : {&L.exp_gate[e], &L.exp_up[e], &L.exp_down[e]})
        if (l->bound()) out.push_back(l);  // (expert parallelism: this rank's experts)
    for (const Linear* l : {&L.sh_gate, &L.sh_up, &L.sh_down})
      if (l->bound()) out.push_back(l);
  }
  if (&output_.tensor() != &tok_embd_.tensor()) out.push_back(&output_);
  return out;
}

// ---------------------------------------------------------------------------------------------
// Forward

void DeepseekV2Model::EnsureScratch(int64_t T) {
  if (T <= scratch_tokens_) return;
  const DeepseekV2Config& c = cfg_;
  const int64_t D = c.base.hidden_size, H = n_heads_;  // this rank's heads
  scratch_tokens_ = T;
  x_.resize(T * D);
  h_.resize(T * D);
  o_.resize(T * D);
  sel_.resize(T * D);
  qa_.resize(T * std::max<int64_t>(c.q_lora_rank, 1));
  q_.resize(T * H * c.qk_head_dim());
  ckv_.resize(T * c.cache_row());
  qlat_.resize(T * H * c.cache_row());
  olat_.resize(T * H * c.kv_lora_rank);
  attn_.resize(T * H * c.v_head_dim);
  pos_.resize(T);
  seq_of_token_.resize(T);
  const int64_t k = std::max<int64_t>(c.num_experts_per_tok, 1);
  router_logits_.resize(T * std::max<int64_t>(c.n_routed_experts, 1));
  topk_ids_.resize(T * k);
  topk_w_.resize(T * k);
  expert_rows_.resize(T * k);
  expert_row_w_.resize(T * k);
  xe_.resize(T * D);
  ye_.resize(T * D);
}

bool DeepseekV2Model::DecodesWithStoredKvb(const Layer& L) const {
  const int64_t H = n_heads_;
  return static_cast<int64_t>(L.kv_b_parts.size()) == 2 * H && H <= kernels::kMaxMatMulGroup &&
         !L.kv_b_parts[0].is_int8();
}

void DeepseekV2Model::Attend(const Layer& L, const kernels::KvLayerView& kvl,
                             const SeqBatchEntry& s, int64_t t0, bool expanded, ThreadPool* pool) {
  const DeepseekV2Config& c = cfg_;
  const int64_t H = n_heads_, dn = c.qk_nope_head_dim, dv = c.v_head_dim;  // this rank's heads
  const int64_t r = c.kv_lora_rank, dqk = c.qk_head_dim(), row = c.cache_row();
  const int64_t n_q = s.n_tokens;
  kernels::MlaParams mp;
  mp.n_heads = static_cast<int>(H);
  mp.kv_lora_rank = static_cast<int>(r);
  mp.d_nope = static_cast<int>(dn);
  mp.d_rope = static_cast<int>(c.qk_rope_head_dim);
  mp.d_v = static_cast<int>(dv);
  mp.scale = c.softmax_scale;
  const float* q = q_.data() + t0 * H * dqk;
  float* out = attn_.data() + t0 * H * dv;
  if (!expanded) {
    // Absorbed: q_abs = W_UK^T q_nope attends over the cached latents; o = W_UV o_lat.
    float* ql = qlat_.data() + t0 * H * row;
    float* ol = olat_.data() + t0 * H * r;
    // Decode with per-head k_b / v_b in the file (kv_b_parts: k_b[h] = W_UK[h]^T [r, d_n],
    // v_b[h] = W_UV[h] [d_v, r]): both products use the stored (quantized) weights instead of
    // the FP32 copy (8x the bytes of Q4_0).
    if (n_q != 1 || !DecodesWithStoredKvb(L)) {
      kernels::MlaAbsorbQuery(q, n_q, L.w_kvb, mp, ql, pool);
      kernels::MlaPagedAttention(ql, n_q, s.pos0, kvl, s.block_table, mp, ol, pool);
      kernels::MlaProjectOutput(ol, n_q, L.w_kvb, mp, out, pool);
      return;
    }
    const TensorView* k_b[kernels::kMaxMatMulGroup];
    const TensorView* v_b[kernels::kMaxMatMulGroup];
    for (int64_t h = 0; h < H; ++h) {
      k_b[h] = &L.kv_b_parts[2 * h].tensor();
      v_b[h] = &L.kv_b_parts[2 * h + 1].tensor();
    }
    kernels::MlaAbsorbQueryHeads(q, k_b, mp, ql, pool);
    kernels::MlaPagedAttention(ql, n_q, s.pos0, kvl, s.block_table, mp, ol, pool);
    kernels::MlaProjectOutputHeads(ol, v_b, mp, out, pool);
    return;
  }
  // Expanded: k_nope / v of every context position from its cached latent (one matrix
  // multiplication by kv_b), then plain causal attention per (token, head).
  const int64_t end = s.pos0 + n_q;
  if (static_cast<int64_t>(ctx_rows_.size()) < end * row) ctx_rows_.resize(end * row);
  if (static_cast<int64_t>(ctx_lat_.size()) < end * r) ctx_lat_.resize(end * r);
  if (static_cast<int64_t>(ctx_kv_.size()) < end * H * (dn + dv))
    ctx_kv_.resize(end * H * (dn + dv));
  kernels::MlaKvRead(kvl, s.block_table, 0, end, ctx_rows_.data());
  for (int64_t u = 0; u < end; ++u)
    std::copy_n(ctx_rows_.data() + u * row, r, ctx_lat_.data() + u * r);
  kernels::MatMul(*L.w_kvb_view, ctx_lat_.data(), end, ctx_kv_.data(), pool);
  kernels::MlaExpandedAttention(q, n_q, s.pos0, ctx_kv_.data(), ctx_rows_.data(), mp, out, pool);
}

void DeepseekV2Model::RunAttention(int il, const ForwardBatch& batch, KvCache* kv,
                                   ThreadPool* pool) {
  const DeepseekV2Config& c = cfg_;
  const Layer& L = layers_[il];
  const int64_t T = static_cast<int64_t>(batch.tokens.size());
  const int64_t D = c.base.hidden_size, H = n_heads_;  // this rank's heads
  const int64_t dn = c.qk_nope_head_dim, dr = c.qk_rope_head_dim, dv = c.v_head_dim;
  const int64_t r = c.kv_lora_rank, dqk = c.qk_head_dim(), row = c.cache_row();

  kernels::RmsNorm(x_.data(), L.attn_norm, 0.f, h_.data(), T, D, c.base.rms_eps);
  {  // q (or its LoRA down-projection) and the latent kv_a read the same normed input
    const bool lora = c.q_lora_rank > 0;
    const Linear* ls[] = {lora ? &L.wq_a : &L.wq, &L.wkv_a};
    float* ys[] = {lora ? qa_.data() : q_.data(), ckv_.data()};
    Linear::ForwardGroup(ls, ys, 2, h_.data(), nullptr, T, pool, &acts_scratch_);
  }
  if (c.q_lora_rank > 0) {
    kernels::AddBiasRows(qa_.data(), L.bq_a, T, c.q_lora_rank);
    kernels::RmsNorm(qa_.data(), L.q_a_norm, 0.f, qa_.data(), T, c.q_lora_rank, c.latent_norm_eps);
    L.wq_b.Forward(qa_.data(), nullptr, T, q_.data(), pool, &acts_scratch_);
    kernels::AddBiasRows(q_.data(), L.bq_b, T, H * dqk);
  } else {
    kernels::AddBiasRows(q_.data(), L.bq, T, H * dqk);
  }
  kernels::AddBiasRows(ckv_.data(), L.bkv_a, T, row);

  // Latent norm, RoPE on k_pe and every head's q_pe, then the cache row of every token.
  const kernels::KvLayerView& kvl = kv->layer(il);
  std::vector<float>& qpe = qpe_;
  qpe.resize(H * dr);
  for (int64_t t = 0; t < T; ++t) {
    float* ck = ckv_.data() + t * row;
    kernels::RmsNorm(ck, L.kv_a_norm, 0.f, ck, 1, r, c.latent_norm_eps);
    const float* cs = rope_cs_.data() + t * c.base.rope.rot_dim;
    kernels::ApplyRopeCosSin(ck + r, 1, dr, c.base.rope, cs);
    float* qt = q_.data() + t * H * dqk;
    for (int64_t h = 0; h < H; ++h) std::copy_n(qt + h * dqk + dn, dr, qpe.data() + h * dr);
    kernels::ApplyRopeCosSin(qpe.data(), H, dr, c.base.rope, cs);
    for (int64_t h = 0; h < H; ++h) std::copy_n(qpe.data() + h * dr, dr, qt + h * dqk + dn);
    kernels::MlaKvWrite(kvl, batch.seqs[seq_of_token_[t]].block_table, pos_[t], ck);
  }

  int64_t t0 = 0;
  for (const SeqBatchEntry& s : batch.seqs) {
    bool expanded = attention_mode_ == AttentionMode::kExpanded;
    if (attention_mode_ == AttentionMode::kAuto) {
      // Multiply-adds of both forms; the expanded one pays for K/V of the whole context once.
      const double n_q = static_cast<double>(s.n_tokens), end = static_cast<double>(s.pos0) + n_q;
      const double ctx = n_q * static_cast<double>(s.pos0) + n_q * (n_q + 1) / 2;
      const double up = static_cast<double>(H * (dn + dv) * r);
      const double absorbed = n_q * up + ctx * H * (2 * r + dr);
      const double expand = end * up + ctx * H * (dqk + dv) + end * row;
      // The expanded K/V of the context must also fit a scratch budget (64 Mi floats).
      expanded = expand < absorbed && end * H * (dn + dv) <= double{1 << 26};
    }
    Attend(L, kvl, s, t0, expanded, pool);
    t0 += s.n_tokens;
  }
  L.wo.Forward(attn_.data(), nullptr, T, o_.data(), pool, &acts_scratch_);  // [T, D]
  AllReduce(o_.data(), T * D);
  kernels::AddBiasRows(o_.data(), L.bo, T, D);
  kernels::AddInPlace(x_.data(), o_.data(), T * D);
}

Status DeepseekV2Model::Forward(const ForwardBatch& batch, KvCache* kv, float* logits,
                                ThreadPool* pool) {
  const ModelConfig& b = cfg_.base;
  const int64_t T = static_cast<int64_t>(batch.tokens.size());
  const int64_t D = b.hidden_size;
  if (T == 0 && !ep_) return OkStatus();
  for (int il = stage_.begin(); il < stage_.end(); ++il)
    if (!kernels::IsMlaLayout(kv->layer(il), static_cast<int>(cfg_.cache_row())))
      return InvalidArgument("the KV cache does not have this model's MLA layout (layer " +
                             Num(il) + " needs one kv head of " + Num(cfg_.cache_row()) +
                             " values and no V)");
  if (T == 0) {  // an idle replica in step with the others: its experts serve their tokens
    for (const Layer& L : stage_.Layers(layers_))
      if (L.moe) RunMoe(L, 0, pool);
    return OkStatus();
  }
  // (with experts across replicas, every replica's step is one pass: their exchanges pair up)
  return stage_.Run(batch, logits, b.vocab_size, tp_rank_ == 0, /*one_pass=*/ep_ != nullptr,
                    [&](const ForwardBatch& mb, float* mb_logits) {
                      return ForwardStage(mb, kv, mb_logits, pool);
                    });
}

Status DeepseekV2Model::ForwardStage(const ForwardBatch& batch, KvCache* kv, float* logits,
                                     ThreadPool* pool) {
  const ModelConfig& b = cfg_.base;
  const int64_t T = static_cast<int64_t>(batch.tokens.size());
  const int64_t D = b.hidden_size;
  std::vector<float>* cap = batch.capture_hidden;
  EnsureScratch(T);
  PENG_RETURN_IF_ERROR(PrepareBatch(batch, *kv, b.vocab_size, pos_.data(), seq_of_token_.data()));
  RopeRows(pos_.data(), T, b.rope, inv_freq_, &rope_cs_);
  if (stage_.first()) {
    vocab_.Embed(tok_embd_, batch.tokens.data(), T, D, x_.data());
  } else {
    stage_.Receive(x_.data(), T * D);
  }

  if (cap) cap->assign(x_.begin(), x_.begin() + T * D);
  for (int il = stage_.begin(); il < stage_.end(); ++il) {
    const Layer& L = layers_[il];
    RunAttention(il, batch, kv, pool);
    kernels::RmsNorm(x_.data(), L.ffn_norm, 0.f, h_.data(), T, D, b.rms_eps);
    if (L.moe) {
      RunMoe(L, T, pool);
    } else {
      RunMlp(L.w_gate, L.w_up, L.w_down, h_.data(), T, o_.data(), pool);
      AllReduce(o_.data(), T * D);
      kernels::AddInPlace(x_.data(), o_.data(), T * D);
    }
    if (cap) cap->insert(cap->end(), x_.begin(), x_.begin() + T * D);
  }
  if (!stage_.last()) {
    stage_.SendOn(x_.data(), T * D);
    return OkStatus();
  }

  const int64_t rows = GatherLogitRows(batch, x_.data(), D, sel_.data());
  if (rows == 0) return OkStatus();
  kernels::RmsNorm(sel_.data(), output_norm_, 0.f, sel_.data(), rows, D, b.rms_eps);
  vocab_.Project(output_, sel_.data(), nullptr, rows, logits, pool, &acts_scratch_);
  return OkStatus();  // (with tensor parallelism only rank 0 has the logits)
}

StatusOr<std::unique_ptr<Model>> LoadDeepseek2(std::unique_ptr<ModelFiles> files,
                                          const ModelLoadOptions& options) {
  PENG_ASSIGN_OR_RETURN(auto m, DeepseekV2Model::Load(std::move(files), options.tp,
                                                      options.expert_parallel,
                                                      options.ep_replicas, options.pp));
  return std::unique_ptr<Model>(std::move(m));
}

}  // namespace peng
