// Multi-head latent attention (DeepSeek-V2 MLA) over a paged latent cache. An MLA layer caches
// per token only one row of kv_lora_rank + rope_dim values, [c | k_pe]: the normalised KV
// latent c and the rotated, head-shared RoPE key k_pe. The KvLayerView of such a layer has
// n_kv_heads 1, head_dim kv_lora_rank + rope_dim and v_head_dim 0 (no V array).
//
// Absorbed attention: with the key up-projection folded into the query
// (q_abs[h] = W_UK[h]^T q_nope[h]), every head's score against token t is
// scale * ([q_abs | q_pe] . [c_t | k_pe_t]), and the head's output is the softmax-weighted sum
// of the latents c_t (kv_lora_rank values); the caller applies W_UV[h] to it. This is ordinary
// MQA attention whose single shared key row is the cache row and whose value is the first
// kv_lora_rank values of the same row.
#pragma once

#include <cstdint>

#include "core/thread_pool.h"
#include "kernels/ops.h"

namespace peng::kernels {

// True if `kv` is laid out as an MLA latent cache for `row_dim` = kv_lora_rank + rope_dim
// values per token (F32 or F16, one kv head, no V).
bool IsMlaLayout(const KvLayerView& kv, int row_dim);

// Writes the cache row [c | k_pe] (kv.head_dim values) of the token at position `pos`.
void MlaKvWrite(const KvLayerView& kv, const int32_t* block_table, int64_t pos, const float* row);

// out[i * kv.head_dim ..] = the cache rows of positions pos0 .. pos0 + n - 1, as FP32.
void MlaKvRead(const KvLayerView& kv, const int32_t* block_table, int64_t pos0, int64_t n,
               float* out);

struct MlaParams {
  int n_heads = 0;
  int kv_lora_rank = 0;  // latent values per row (the "value" part); the rest is k_pe
  float scale = 1.f;     // softmax scale (qk_head_dim^-0.5, times YaRN mscale^2)
};

// Causal absorbed attention for one sequence: n_q query tokens at positions pos0 .. pos0+n_q-1
// whose cache rows (and all earlier positions') are already written. q: [n_q, n_heads,
// kv.head_dim] (q_abs | rotated q_pe per head), out: [n_q, n_heads, kv_lora_rank]. Work is
// split over (token, head) pairs across the pool.
void MlaPagedAttention(const float* q, int64_t n_q, int64_t pos0, const KvLayerView& kv,
                       const int32_t* block_table, const MlaParams& p, float* out,
                       ThreadPool* pool);

}  // namespace peng::kernels
