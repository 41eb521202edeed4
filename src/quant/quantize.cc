#include "quant/quantize.h"

#include <fnmatch.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>

#include <nlohmann/json.hpp>

#include "core/half.h"
#include "core/mapped_file.h"
#include "core/thread_pool.h"
#include "formats/gguf_writer.h"
#include "formats/safetensors_writer.h"
#include "kernels/int8_gemm.h"
#include "kernels/ops.h"
#include "model/config_reader.h"
#include "model/model_files.h"

namespace peng {
namespace fs = std::filesystem;

const std::vector<std::string>& DefaultQuantSkipPatterns() {
  static const std::vector<std::string> kDefault = {
      "*embed_tokens.weight",  // token embeddings
      "lm_head.weight",        // LM head
      "*.mlp.gate.weight",     // MoE router (DeepSeek, Qwen-MoE, Mixtral's block_sparse_moe.gate)
      "*.block_sparse_moe.gate.weight",
  };
  return kDefault;
}

namespace {

// One tensor of the source under its HF name. permute_qk_head_dim > 0: a llama GGUF Q/K matrix
// whose rows are stored permuted for interleaved RoPE (per head of that size); rows are
// reordered back to HF order.
struct Source {
  std::string name;
  const TensorView* tv = nullptr;
  int64_t permute_qk_head_dim = 0;
};

enum class Action { kQuantize, kConvert, kCopy };

struct Plan {
  Source src;
  Action action = Action::kCopy;
  DType out = DType::kF32;
};

bool PlainFloat(DType t) { return t == DType::kF32 || t == DType::kF16 || t == DType::kBF16; }

StatusOr<std::vector<Source>> HfSources(const ModelFiles& f) {
  if (f.quant()) return InvalidArgument(f.path() + " is already quantized (has quant_config.json)");
  std::vector<Source> out;
  for (const TensorView* t : f.AllTensors()) out.push_back({t->name, t});
  return out;
}

// GGUF name -> HF name for the architectures whose GGUF layout we can map back.
StatusOr<std::vector<Source>> GgufSources(const ModelFiles& f, const ModelConfig& cfg) {
  if (f.arch() != "llama" && f.arch() != "qwen2")
    return Unimplemented(f.path() + ": converting a GGUF of architecture '" + f.arch() +
                         "' to a Hugging Face folder is not supported (llama, qwen2); quantize "
                         "its Hugging Face checkpoint instead");
  std::map<std::string, std::string> layer, globals, inv_layer, inv_globals;
  LlamaFamilyHfNames(&layer, &globals);
  for (auto& [hf, g] : layer) inv_layer[g] = hf;
  for (auto& [hf, g] : globals) inv_globals[g] = hf;
  std::vector<Source> out;
  for (const TensorView* t : f.AllTensors()) {
    Source s{"", t};
    if (auto it = inv_globals.find(t->name); it != inv_globals.end()) {
      s.name = it->second;
    } else if (t->name.rfind("blk.", 0) == 0) {
      const size_t dot = t->name.find('.', 4);
      auto it2 = dot == std::string::npos ? inv_layer.end() : inv_layer.find(t->name.substr(dot + 1));
      if (it2 != inv_layer.end())
        s.name = "model.layers." + t->name.substr(4, dot - 4) + "." + it2->second;
    }
    if (s.name.empty())
      return Unimplemented(f.path() + ": GGUF tensor '" + t->name +
                           "' has no Hugging Face equivalent");
    if (f.arch() == "llama") {  // llama.cpp's converter permutes Q and K for "normal" RoPE
      if (t->name.ends_with(".attn_q.weight") || t->name.ends_with(".attn_k.weight"))
        s.permute_qk_head_dim = cfg.head_dim;
    }
    out.push_back(s);
  }
  return out;
}

nlohmann::json HfConfigFromGguf(const ModelConfig& c) {
  nlohmann::json j = {
      {"architectures", {c.arch == "qwen2" ? "Qwen2ForCausalLM" : "LlamaForCausalLM"}},
      {"model_type", c.arch},
      {"hidden_size", c.hidden_size},
      {"intermediate_size", c.ffn_dim},
      {"num_attention_heads", c.n_heads},
      {"num_key_value_heads", c.n_kv_heads},
      {"num_hidden_layers", c.n_layers},
      {"head_dim", c.head_dim},
      {"vocab_size", c.vocab_size},
      {"max_position_embeddings", c.max_position},
      {"rms_norm_eps", c.rms_eps},
      {"rope_theta", c.rope.theta},
      {"hidden_act", "silu"},
      {"tie_word_embeddings", c.tie_embeddings},
  };
  if (c.bos_id >= 0) j["bos_token_id"] = c.bos_id;
  if (c.eos_id >= 0) j["eos_token_id"] = c.eos_id;
  using S = kernels::RopeConfig::Scaling;
  if (c.rope.scaling == S::kLinear) j["rope_scaling"] = {{"type", "linear"}, {"factor", c.rope.factor}};
  if (c.rope.scaling == S::kYarn)
    j["rope_scaling"] = {{"type", "yarn"}, {"factor", c.rope.factor},
                         {"original_max_position_embeddings", c.rope.original_max_position}};
  return j;
}

Status WriteText(const std::string& path, const std::string& text) {
  std::ofstream f(path, std::ios::binary);
  f << text;
  f.close();
  if (!f) return IoError("cannot write " + path);
  return OkStatus();
}

// The tokenizer of a GGUF model without its tensors.
Status WriteTokenizerGguf(const GgufFile& g, const std::string& path) {
  GgufWriter w;
  for (const auto& [key, value] : g.metadata())
    if (key.rfind("tokenizer.", 0) == 0 || key == "general.architecture" || key == "general.name")
      w.AddValue(key, value);
  return w.WriteFile(path);
}

// Rows [r0, r1) of the source as FP32 into out (r1 - r0) x cols.
void SourceRows(const Source& s, int64_t r0, int64_t r1, float* out) {
  const TensorView& t = *s.tv;
  const int64_t cols = t.cols();
  for (int64_t r = r0; r < r1; ++r) {
    const int64_t src = s.permute_qk_head_dim > 0 ? NeoxToInterleavedRow(r, s.permute_qk_head_dim) : r;
    kernels::DequantizeRow(t.dtype, t.row(src), out + (r - r0) * cols, cols);
  }
}

// Rows per chunk: about 4M values.
int64_t ChunkRows(int64_t rows, int64_t cols) {
  return std::max<int64_t>(1, std::min<int64_t>(rows, (4 << 20) / std::max<int64_t>(cols, 1)));
}

// Streams a tensor through `fn(rows [b, e) of the chunk starting at r0)` in chunks of about
// 4M values, each chunk split across the pool, then `write(r0, n)`.
template <typename RowsFn, typename WriteFn>
Status ForEachRowChunk(ThreadPool* pool, int64_t rows, int64_t cols, std::vector<float>* f32,
                       RowsFn fn, WriteFn write) {
  const int64_t chunk = ChunkRows(rows, cols);
  f32->resize(chunk * cols);
  for (int64_t r0 = 0; r0 < rows; r0 += chunk) {
    const int64_t n = std::min(chunk, rows - r0);
    pool->ParallelFor(n, [&](int64_t b, int64_t e) { fn(r0, b, e); });
    PENG_RETURN_IF_ERROR(write(n));
  }
  return OkStatus();
}

class Converter {
 public:
  Converter(ThreadPool* pool, SafetensorsWriter* w) : pool_(pool), w_(w) {}

  Status Quantize(const Source& s) {
    const int64_t rows = s.tv->rows(), cols = s.tv->cols();
    std::vector<float> scales(rows);
    q_.resize(ChunkRows(rows, cols) * cols);
    PENG_RETURN_IF_ERROR(ForEachRowChunk(
        pool_, rows, cols, &f32_,
        [&](int64_t r0, int64_t b, int64_t e) {
          SourceRows(s, r0 + b, r0 + e, f32_.data() + b * cols);
          kernels::QuantizeWeightsPerRow(f32_.data() + b * cols, e - b, cols,
                                         q_.data() + b * cols, scales.data() + r0 + b);
        },
        [&](int64_t n) { return w_->Write(q_.data(), n * cols); }));
    return w_->Write(scales.data(), rows * sizeof(float));
  }

  Status Convert(const Source& s, DType out) {
    const int64_t rows = s.tv->rows(), cols = s.tv->cols();
    u16_.resize(ChunkRows(rows, cols) * cols);
    return ForEachRowChunk(
        pool_, rows, cols, &f32_,
        [&](int64_t r0, int64_t b, int64_t e) {
          SourceRows(s, r0 + b, r0 + e, f32_.data() + b * cols);
          if (out == DType::kF16)
            for (int64_t i = b * cols; i < e * cols; ++i) u16_[i] = F32ToF16(f32_[i]);
          if (out == DType::kBF16)
            for (int64_t i = b * cols; i < e * cols; ++i) u16_[i] = F32ToBf16(f32_[i]);
        },
        [&](int64_t n) {
          return out == DType::kF32 ? w_->Write(f32_.data(), n * cols * sizeof(float))
                                    : w_->Write(u16_.data(), n * cols * sizeof(uint16_t));
        });
  }

 private:
  ThreadPool* pool_;
  SafetensorsWriter* w_;
  std::vector<float> f32_;
  std::vector<int8_t> q_;
  std::vector<uint16_t> u16_;
};

}  // namespace

StatusOr<QuantizeReport> QuantizeModel(const QuantizeOptions& o) {
  const bool float_scheme = o.scheme == "f32" || o.scheme == "f16" || o.scheme == "bf16";
  QuantConfig qc;
  DType matrix_dtype = o.float_dtype;
  if (float_scheme) {
    matrix_dtype = o.scheme == "f32" ? DType::kF32 : o.scheme == "f16" ? DType::kF16 : DType::kBF16;
  } else {
    auto sch = ParseQuantScheme(o.scheme);
    if (!sch.ok())
      return InvalidArgument("unknown --scheme '" + o.scheme +
                             "' (expected w8a16, w8a8, f32, f16 or bf16)");
    qc.scheme = *sch;
  }
  if (!PlainFloat(o.float_dtype))
    return InvalidArgument("the dtype of unquantized matrices must be f32, f16 or bf16");
  if (fs::exists(o.output) && !(fs::is_directory(o.output) && fs::is_empty(o.output)))
    return InvalidArgument("output " + o.output + " exists and is not an empty folder");
  PENG_ASSIGN_OR_RETURN(std::unique_ptr<ModelFiles> files, ModelFiles::Open(o.input));
  ModelConfig cfg;
  std::vector<Source> sources;
  if (files->is_gguf()) {
    PENG_RETURN_IF_ERROR(ReadCommonConfig(*files, &cfg));
    cfg.arch = files->arch();
    PENG_ASSIGN_OR_RETURN(sources, GgufSources(*files, cfg));
  } else {
    PENG_ASSIGN_OR_RETURN(sources, HfSources(*files));
  }

  std::vector<std::string> skip = o.skip;
  if (o.default_skip)
    skip.insert(skip.end(), DefaultQuantSkipPatterns().begin(), DefaultQuantSkipPatterns().end());
  std::vector<Plan> plans;
  QuantizeReport rep;
  for (const Source& s : sources) {
    Plan p{s};
    const TensorView& t = *s.tv;
    // Weight matrices, and the stacked expert matrices of fused MoE checkpoints
    // (transformers 5: mlp.experts.gate_up_proj [E, 2I, D], mlp.experts.down_proj [E, D, I]),
    // which get one scale per row of every expert: NAME_scale [E, rows].
    const bool stacked = t.ndim() == 3 && (s.name.ends_with(".experts.gate_up_proj") ||
                                           s.name.ends_with(".experts.down_proj"));
    const bool matrix = (t.ndim() == 2 && s.name.ends_with(".weight")) || stacked;
    std::string reason;
    if (!float_scheme && matrix) {
      for (const std::string& pat : skip)
        if (fnmatch(pat.c_str(), s.name.c_str(), 0) == 0) {
          reason = "matches --skip pattern '" + pat + "'";
          break;
        }
      if (reason.empty() && t.cols() % kernels::kInt8ColAlign != 0)
        reason = std::to_string(t.cols()) + " columns (INT8 kernels need a multiple of 32)";
      if (reason.empty()) {
        p.action = Action::kQuantize;
        p.out = DType::kI8;
        qc.quantized.push_back(s.name);
        ++rep.quantized;
      } else {
        qc.skipped.emplace_back(s.name, reason);
        ++rep.skipped;
      }
    } else if (!float_scheme && t.ndim() >= 2 && t.dtype != DType::kI8) {
      qc.skipped.emplace_back(s.name, "not a 2-D weight matrix");
      ++rep.skipped;
    }
    if (p.action != Action::kQuantize) {
      if (float_scheme && t.ndim() >= 2) {
        p.out = matrix_dtype;
      } else if (PlainFloat(t.dtype) || !kernels::MatMulSupports(t.dtype)) {
        p.out = t.dtype;  // unchanged (integer tensors are copied as they are)
      } else {
        p.out = t.ndim() >= 2 ? o.float_dtype : DType::kF32;
      }
      p.action = (p.out == t.dtype && s.permute_qk_head_dim == 0) ? Action::kCopy : Action::kConvert;
      if (p.action == Action::kConvert && !kernels::MatMulSupports(t.dtype))
        return Unimplemented(o.input + ": cannot convert tensor '" + s.name + "' of type " +
                             DTypeName(t.dtype));
      ++rep.copied;
    }
    plans.push_back(p);
  }

  std::error_code ec;
  fs::create_directories(o.output, ec);
  if (ec) return IoError("cannot create " + o.output + ": " + ec.message());
  const std::string st_path = o.output + "/model.safetensors";
  SafetensorsWriter w(st_path);
  for (const Plan& p : plans) {
    PENG_RETURN_IF_ERROR(w.Add(p.src.name, p.out, p.src.tv->shape));
    if (p.action == Action::kQuantize) {
      const std::vector<int64_t> scale_shape(p.src.tv->shape.begin(), p.src.tv->shape.end() - 1);
      PENG_RETURN_IF_ERROR(w.Add(p.src.name + kQuantScaleSuffix, DType::kF32, scale_shape));
    }
  }
  PENG_RETURN_IF_ERROR(w.Begin({{"format", "pt"}}));
  ThreadPool pool(o.threads);
  Converter conv(&pool, &w);
  int64_t total = 0, done = 0;
  for (const Plan& p : plans) total += p.src.tv->size_bytes;
  for (const Plan& p : plans) {
    if (p.action == Action::kQuantize) {
      PENG_RETURN_IF_ERROR(conv.Quantize(p.src));
    } else if (p.action == Action::kConvert) {
      PENG_RETURN_IF_ERROR(conv.Convert(p.src, p.out));
    } else {
      PENG_RETURN_IF_ERROR(w.Write(p.src.tv->data, p.src.tv->size_bytes));
    }
    done += p.src.tv->size_bytes;
    if (o.progress) o.progress(done, total, p.src.name);
  }
  PENG_RETURN_IF_ERROR(w.Finish());
  rep.bytes_in = total;
  rep.bytes_out = static_cast<int64_t>(fs::file_size(st_path, ec));

  if (files->is_gguf()) {
    PENG_RETURN_IF_ERROR(WriteText(o.output + "/config.json", HfConfigFromGguf(cfg).dump(2) + "\n"));
    PENG_RETURN_IF_ERROR(WriteTokenizerGguf(*files->gguf(), o.output + "/tokenizer.gguf"));
  } else {
    for (const auto& e : fs::directory_iterator(o.input, ec)) {
      const std::string n = e.path().filename().string();
      if (!e.is_regular_file() || n.ends_with(".safetensors") ||
          n == "model.safetensors.index.json" || n == "quant_config.json")
        continue;
      fs::copy_file(e.path(), o.output + "/" + n, fs::copy_options::overwrite_existing, ec);
      if (ec) return IoError("cannot copy " + e.path().string() + ": " + ec.message());
    }
  }
  if (!float_scheme) {
    qc.source = o.input;
    PENG_RETURN_IF_ERROR(WriteText(o.output + "/quant_config.json", qc.ToJson().dump(2) + "\n"));
  }
  return rep;
}

}  // namespace peng
