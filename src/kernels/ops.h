// peng CPU compute kernels: pure functions over pointers and shapes, FP32 accumulation
// everywhere. Each op dispatches on kernels::ActiveIsa() to a SIMD version or the scalar
// reference in ref/ (the oracle the conformance tests compare against). Ops that take a
// ThreadPool split their work across it; all others are single-threaded and re-entrant.
//
// Layout conventions: activations are row-major [n_tokens, n] float arrays. Weight matrices
// are TensorViews of shape [rows, cols] (= [out, in]); each row is `cols` values in the
// tensor's dtype (for block-quantized types, cols / block_size whole blocks, GGUF layout).
#pragma once

#include <cstdint>
#include <limits>
#include <memory>

#include "core/dtype.h"
#include "core/tensor.h"
#include "core/thread_pool.h"

namespace peng::kernels {

// ---------------------------------------------------------------------------------------------
// Matrix multiplication (matmul.cc, quant formats in quant_blocks.h)

// y[t * rows + r] = sum_c W[r, c] * x[t * cols + c]   for t < n_tokens, r < rows.
// For block-quantized W the activations are first quantized per row to the companion format
// (Q8_0 for Q4_0/Q5_0/Q8_0, Q8_1 for Q4_1/Q5_1, Q8_K for the K-quants), as llama.cpp does, and
// integer dot products are scaled and summed in FP32. F32/F16/BF16 W use FP32 activations.
// Supported W types: F32, F16, BF16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q4_K, Q5_K, Q6_K.
void MatMul(const TensorView& w, const float* x, int64_t n_tokens, float* y, ThreadPool* pool);

// Load-time repacking. The AVX-512 VNNI kernels read Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q4_K and Q6_K
// matrices in 16-row panels (per panel and block: the rows' quants transposed into dword
// columns, Q5's high bits, and their scales; the same bytes rearranged): a block then decodes
// with a few vector operations for all 16 rows instead of a reduction across them, for GEMV and
// GEMM alike (no packing per call). F32 / F16 / BF16 and INT8 (kI8, for Int8Weights::panels)
// matrices go into 4-row groups, each group's rows interleaved chunk by chunk, so that a 4-row
// register tile reads one contiguous stream (the hardware prefetchers follow it; four row-major
// streams they barely do): one-token GEMVs 1.3-2.5x faster from memory.
// Returns `w` packed for the active ISA (huge-page memory; set w.panels to it and keep it
// alive), or null when that ISA has no panel layout for the type. MatMul gives the same
// results, bit for bit, with and without panels.
std::shared_ptr<const uint8_t> PackPanels(const TensorView& w);

// Same, restricted to rows [row_begin, row_end) of W, writing y[t * ldy + (r - row_begin)].
// Used for partial/sliced weights (tensor parallel shards, fused QKV slices).
void MatMulRows(const TensorView& w, int64_t row_begin, int64_t row_end, const float* x,
                int64_t n_tokens, float* y, int64_t ldy, ThreadPool* pool);

// Several products in one call, y_i[t * rows_i + r] = sum_c W_i[r, c] x_i[t * cols_i + c], where
// x_i is the part's own input or, when null, the shared x (Q/K/V, gate/up; MLA's per-head k_b /
// v_b): activations are quantized once per distinct input and block size, and all rows run in
// one parallel region, split across threads by weight bytes. Same results as MatMul on each.
inline constexpr int kMaxMatMulGroup = 128;
struct MatMulOut {
  const TensorView* w;
  float* y;
  const float* x = nullptr;
};
void MatMulGroup(const MatMulOut* outs, int n, const float* x, int64_t n_tokens,
                 ThreadPool* pool);

// dst[0..n) = float values of the first n values at src (n a multiple of the block size).
void DequantizeRow(DType t, const void* src, float* dst, int64_t n);

// True if MatMul/DequantizeRow support weights of this type.
bool MatMulSupports(DType t);

// Reference precision for quantized weights. When on, MatMul multiplies an FP32 copy of the
// dequantized weights (made once per tensor, kept for the process lifetime) with the
// unquantized FP32 activations: no activation-quantization noise, so the model logic can be
// compared with FP32 references (HF transformers on the dequantized weights) to tight
// tolerances. Costs 4 bytes per weight; for tests and tools. Off by default; set it before
// running kernels (not synchronized).
void SetExactActivations(bool on);
bool ExactActivations();

// ---------------------------------------------------------------------------------------------
// Element-wise and normalisation ops (elementwise.cc)

// y = x / sqrt(mean(x^2) + eps) * (w + w_offset), over each of n_rows rows of length n.
// w_offset is 1 for checkpoints that store (w - 1) (HF Gemma), else 0. x and y may alias.
void RmsNorm(const float* x, const float* w, float w_offset, float* y, int64_t n_rows, int64_t n,
             float eps);

// In-place numerically stable softmax of x[0..n).
void Softmax(float* x, int64_t n);

// out[i] = silu(gate[i]) * up[i]  (SwiGLU).     silu(z) = z / (1 + exp(-z))
void SiluMul(const float* gate, const float* up, float* out, int64_t n);
// out[i] = gelu_tanh(gate[i]) * up[i]  (GeGLU, PyTorch "gelu_pytorch_tanh").
void GeluTanhMul(const float* gate, const float* up, float* out, int64_t n);

// y[i] += x[i]
void AddInPlace(float* y, const float* x, int64_t n);
// y[t * n + i] += b[i] for t < n_rows (a bias on every row); no-op when b is null.
void AddBiasRows(float* y, const float* b, int64_t n_rows, int64_t n);
// y[i] *= s
void ScaleInPlace(float* y, float s, int64_t n);

// Scans of a logits row (the sampler's and the engine's per-row checks).
// The lowest i whose x[i] is the largest value that is not NaN; 0 when every value is NaN.
// n >= 1.
int64_t ArgMax(const float* x, int64_t n);
// The lowest i with x[i] NaN or +inf; -1 when there is none.
int64_t FindNanOrPosInf(const float* x, int64_t n);
// The lowest i with x[i] > w (NaN is not); n when there is none.
int64_t FindAbove(const float* x, int64_t n, float w);
// The k largest of x[0, n) (1 <= k <= n), best first: value descending, equal values (-0.0 and
// +0.0 are equal) by lower index, NaN below every number. val / idx: k entries each. Up to
// kTopKInsertMax, one pass (FindAbove skips what cannot enter) in which a value that enters the
// list moves up to k entries (a small k over a row of logits: the sampler's top-k rows, the host
// device's TopLogits); a longer list is selected (nth_element), then sorted.
inline constexpr int kTopKInsertMax = 256;
void TopK(const float* x, int64_t n, int k, float* val, int32_t* idx);
// A logit under the sampler's penalties (Sampler::ApplyPenalties, a device's EditLogits on the
// host): the repetition penalty (divides a positive logit, multiplies another), then the
// presence penalty and the frequency penalty times the token's count in the output where it is
// > 0; kept finite.
inline float PenalizedLogit(float l, float repetition, float presence, float frequency,
                            float count) {
  if (repetition != 1.0f) l = l > 0.0f ? l / repetition : l * repetition;
  if (count > 0.0f) l -= presence + frequency * count;
  const float max = std::numeric_limits<float>::max();
  return max < l ? max : l;  // (std::min's: NaN stays NaN)
}

// Temperature sampling over a row (the sampler's, and a device's DrawTokens on the host), with
// weights w_i = exp((x[i] - m) * inv_t) (float) summed in double in id order; m: the row's
// largest value, finite. TemperatureTotal: the sum (the softmax's denominator). DrawInIdOrder:
// plain temperature sampling's draw -- the first i with w_i > 0 at which the running sum passes
// u * total; the last i with w_i > 0 where u * total rounds up to the total; u in [0, 1).
double TemperatureTotal(const float* x, int64_t n, float m, float inv_t);
// The log-softmax's sum: exp(x[i] - m) in double, summed in id order (log-softmax(x)[i] =
// x[i] - (m + log(total))); m: the row's largest value, finite.
double LogSoftmaxTotal(const float* x, int64_t n, float m);
int32_t DrawInIdOrder(const float* x, int64_t n, float m, float inv_t, double u);

// ---------------------------------------------------------------------------------------------
// Rotary position embedding (rope.cc)

enum class RopeStyle {
  kInterleaved,  // pairs (x[2i], x[2i+1]) -- llama.cpp "NORM", GPT-J, DeepSeek
  kNeox,         // pairs (x[i], x[i + rot_dim/2]) -- HF rotate_half, llama.cpp "NEOX"
};

struct RopeConfig {
  int rot_dim = 0;          // rotated dims per head (<= head_dim); the rest pass through
  float theta = 10000.f;    // base
  RopeStyle style = RopeStyle::kNeox;
  // Linear / YaRN scaling. factor <= 1 means none.
  enum class Scaling { kNone, kLinear, kYarn } scaling = Scaling::kNone;
  float factor = 1.f;
  int original_max_position = 0;  // YaRN
  float beta_fast = 32.f, beta_slow = 1.f;
  float attention_factor = 1.f;   // multiplies cos/sin (YaRN mscale ratio)
};

// inv_freq[i] for i < rot_dim/2, in float32 exactly as HF computes them (incl. YaRN ramps).
void ComputeRopeInvFreq(const RopeConfig& cfg, float* inv_freq);

// Rotates x = [n_heads, head_dim] (head stride head_dim) in place for absolute position pos.
void ApplyRope(float* x, int64_t n_heads, int64_t head_dim, int64_t pos, const RopeConfig& cfg,
               const float* inv_freq);
// ApplyRope in two halves: the angles depend on the position only, so a step computes each
// token's row once (RopeCosSin: cs[i] = cos, cs[rot_dim/2 + i] = sin of pair i, times
// attention_factor; rot_dim floats) and every layer rotates with it (ApplyRopeCosSin).
// Together they give ApplyRope's results bit for bit.
void RopeCosSin(int64_t pos, const RopeConfig& cfg, const float* inv_freq, float* cs);
void ApplyRopeCosSin(float* x, int64_t n_heads, int64_t head_dim, const RopeConfig& cfg,
                     const float* cs);

// ---------------------------------------------------------------------------------------------
// Paged attention (attention.cc)

// One layer's KV cache: K and V each [num_blocks][block_size][n_kv_heads][head_dim] in dtype
// (F32, F16, or Q8_0: 32-value blocks along head_dim, which must then be a multiple of 32, each
// row rotated by a Walsh-Hadamard transform before it is quantized -- attention_ops.h). Block b
// holds the K/V of token positions b_idx*block_size ... of a sequence whose block table maps
// logical block b_idx -> physical block b.
struct KvLayerView {
  void* k = nullptr;
  void* v = nullptr;
  DType dtype = DType::kF16;
  int64_t num_blocks = 0;
  int block_size = 16;
  int n_kv_heads = 0;
  int head_dim = 0;     // of K
  int v_head_dim = 0;   // of V (== head_dim for MHA/GQA)
};

// The runs a Q8_0 cache's rows of `dim` values are rotated in (attention_ops.h): 64 values where
// dim allows, else 32. KvCacheSpec::CheckDtype holds an MLA latent to the same runs.
inline int RotationBlock(int64_t dim) { return dim % 64 == 0 ? 64 : 32; }

// Writes k [n_kv_heads, head_dim] and v [n_kv_heads, v_head_dim] of the token at position pos.
void KvWrite(const KvLayerView& kv, const int32_t* block_table, int64_t pos, const float* k,
             const float* v);

struct AttentionParams {
  int n_heads = 0;          // query heads; GQA group = n_heads / n_kv_heads
  float scale = 1.f;        // softmax scale (usually head_dim^-0.5)
  int sliding_window = 0;   // >0: query at p sees keys (p - sliding_window, p]
  float softcap = 0.f;      // >0: scores = softcap * tanh(scores / softcap)
};

// Causal attention for one sequence: n_q query tokens at positions pos0 .. pos0 + n_q - 1 whose
// K/V (and all earlier positions') are already in the cache. q: [n_q, n_heads, head_dim],
// out: [n_q, n_heads, v_head_dim]. Work is split across the pool: a prefill chunk (n_q > 1) in
// tiles of 16 (token, head) rows of a kv head, a decode token by (token, kv head, part of 256
// keys) items, the parts merged after. With a Q8_0 cache the queries are rotated as its rows
// are and the outputs rotated back.
void PagedAttention(const float* q, int64_t n_q, int64_t pos0, const KvLayerView& kv,
                    const int32_t* block_table, const AttentionParams& p, float* out,
                    ThreadPool* pool);

// One sequence of a batched call: its queries, positions, block table and output as above.
struct AttentionSeq {
  const float* q;
  int64_t n_q;
  int64_t pos0;
  const int32_t* block_table;
  float* out;
};
// PagedAttention of every sequence of a batch in one parallel region over all the sequences'
// items (a decode batch has one token per sequence: one region instead of one per sequence).
// Same results as PagedAttention on each.
void PagedAttentionBatch(const AttentionSeq* seqs, int64_t n_seqs, const KvLayerView& kv,
                         const AttentionParams& p, ThreadPool* pool);

}  // namespace peng::kernels
