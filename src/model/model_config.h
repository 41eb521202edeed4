// ModelConfig: the hyper-parameters of a decoder-only transformer, independent of the file
// format it came from. Architecture folders (llama/, qwen2/, gemma3/, ...) fill it from GGUF
// metadata or a Hugging Face config.json; the shared decoder (layers/decoder.h) reads only
// this struct. Plain value type.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "kernels/ops.h"

namespace peng {

enum class Activation { kSilu, kGeluTanh };

struct ModelConfig {
  std::string arch;              // "llama", "qwen2", "gemma3", ...
  std::string name;              // human-readable model name
  int64_t vocab_size = 0;
  int64_t hidden_size = 0;       // D
  int64_t n_layers = 0;
  int64_t n_heads = 0;
  int64_t n_kv_heads = 0;
  int64_t head_dim = 0;          // per-head dim of Q/K (and V)
  int64_t ffn_dim = 0;
  int64_t max_position = 0;      // context length the model was trained for
  float rms_eps = 1e-6f;
  Activation activation = Activation::kSilu;
  bool qkv_bias = false;         // qwen2
  bool qk_norm = false;          // gemma3: RMSNorm on each q/k head
  bool post_norms = false;       // gemma3: norm after attention and after the FFN
  float norm_weight_offset = 0;  // 1 when norms are stored as (w - 1) (HF Gemma)
  float embed_scale = 1.f;       // gemma: sqrt(hidden_size)
  float attn_scale = 0.f;        // softmax scale; 0 = head_dim^-0.5
  float final_logit_softcap = 0; // >0: logits = c * tanh(logits / c)
  bool tie_embeddings = false;
  kernels::RopeConfig rope;          // global-attention layers
  kernels::RopeConfig rope_local;    // sliding-window layers (gemma3: base 10000)
  int sliding_window = 0;            // window of the sliding layers
  std::vector<bool> layer_sliding;   // per layer: uses the sliding window + local rope
  int bos_id = -1;
  int eos_id = -1;

  float AttentionScale() const;
  std::string Summary() const;  // one line for --verbose
};

// llama.cpp's converter stores the Q and K projections of llama-family GGUFs with the rows of
// every head permuted so that interleaved ("normal") RoPE pairs (2i, 2i+1) reproduce HF's
// rotate_half pairs (i, i + head_dim/2). Row r of the HF (NeoX-order) matrix is row
// NeoxToInterleavedRow(r) of the GGUF matrix, and the inverse.
inline int64_t NeoxToInterleavedRow(int64_t r, int64_t head_dim) {
  const int64_t half = head_dim / 2, rem = r % head_dim;
  return r - rem + 2 * (rem % half) + rem / half;
}
inline int64_t InterleavedToNeoxRow(int64_t r, int64_t head_dim) {
  const int64_t half = head_dim / 2, rem = r % head_dim;
  return r - rem + (rem % 2) * half + rem / 2;
}

}  // namespace peng
