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
// values per token (F32, F16 or Q8_0, one kv head, no V). A Q8_0 row is stored rotated by a
// Walsh-Hadamard transform (attention_ops.h); MlaKvRead and the attention rotate back.
bool IsMlaLayout(const KvLayerView& kv, int row_dim);

// Writes the cache row [c | k_pe] (kv.head_dim values) of the token at position `pos`.
void MlaKvWrite(const KvLayerView& kv, const int32_t* block_table, int64_t pos, const float* row);

// out[i * kv.head_dim ..] = the cache rows of positions pos0 .. pos0 + n - 1, as FP32 (a Q8_0
// cache's rows rotated back).
void MlaKvRead(const KvLayerView& kv, const int32_t* block_table, int64_t pos0, int64_t n,
               float* out);

struct MlaParams {
  int n_heads = 0;
  int kv_lora_rank = 0;  // r: latent values per cache row (the "value" part); the rest is k_pe
  int d_nope = 0;        // qk_nope_head_dim (MlaAbsorbQuery, MlaProjectOutput, expanded form)
  int d_rope = 0;        // qk_rope_head_dim
  int d_v = 0;           // v_head_dim
  float scale = 1.f;     // softmax scale (qk_head_dim^-0.5, times YaRN mscale^2)
};

// The per-head up-projection kv_b as FP32 [n_heads][d_nope + d_v][r]: rows [0, d_nope) of head
// h are W_UK[h] (k_nope = W_UK c), the next d_v rows W_UV[h] (v = W_UV c).
//
// q: [n_q, n_heads, d_nope + d_rope] (q_nope | rotated q_pe) ->
// out: [n_q, n_heads, r + d_rope] = (W_UK[h]^T q_nope | q_pe), the absorbed query.
void MlaAbsorbQuery(const float* q, int64_t n_q, const float* w_kvb, const MlaParams& p, float* out,
                    ThreadPool* pool);
// o_lat: [n_q, n_heads, r] -> out: [n_q, n_heads * d_v] with out[h] = W_UV[h] o_lat[h].
void MlaProjectOutput(const float* o_lat, int64_t n_q, const float* w_kvb, const MlaParams& p,
                      float* out, ThreadPool* pool);

// The same two products for one token with kv_b stored per head in the file (attn_k_b,
// attn_v_b; any MatMul type): k_b[h] = W_UK[h]^T [r, d_nope] and v_b[h] = W_UV[h] [d_v, r],
// multiplied in their stored type as MatMul multiplies them (block formats: quantized
// activations; exact mode: the FP32 copy). All heads in one parallel region (MatMulGroup).
// The decode form of DeepseekV2Model and the devices: 8x fewer bytes than the FP32 kv_b at Q4_0.
// q: [n_heads, d_nope + d_rope] -> out: [n_heads, r + d_rope] (as MlaAbsorbQuery's);
// o_lat: [n_heads, r] -> out: [n_heads * d_v] (as MlaProjectOutput's).
void MlaAbsorbQueryHeads(const float* q, const TensorView* const* k_b, const MlaParams& p,
                         float* out, ThreadPool* pool);
void MlaProjectOutputHeads(const float* o_lat, const TensorView* const* v_b, const MlaParams& p,
                           float* out, ThreadPool* pool);

// Causal absorbed attention for one sequence: n_q query tokens at positions pos0 .. pos0+n_q-1
// whose cache rows (and all earlier positions') are already written. q: [n_q, n_heads,
// kv.head_dim] (MlaAbsorbQuery's output), out: [n_q, n_heads, kv_lora_rank]. A decode token
// (n_q == 1) runs its heads as the lanes of query tiles, its keys in parts of 128 over the pool;
// a prefill chunk is split over (token, head) pairs.
void MlaPagedAttention(const float* q, int64_t n_q, int64_t pos0, const KvLayerView& kv,
                       const int32_t* block_table, const MlaParams& p, float* out,
                       ThreadPool* pool);

// The expanded form (cheaper for a long prefill chunk): kv: [pos0 + n_q][n_heads][d_nope + d_v]
// holds every context position's k_nope and v per head (kv_b applied to its cached latent),
// rows: [pos0 + n_q][r + d_rope] the cache rows (k_pe at offset r). q: [n_q, n_heads,
// d_nope + d_rope] (q_nope | rotated q_pe); out: [n_q, n_heads * d_v].
void MlaExpandedAttention(const float* q, int64_t n_q, int64_t pos0, const float* kv,
                          const float* rows, const MlaParams& p, float* out, ThreadPool* pool);

}  // namespace peng::kernels
