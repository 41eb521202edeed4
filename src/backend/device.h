// Device: the one interface the forward pass runs on when it leaves peng's CPU path -- device
// memory, a stream of work, and the operator set the models use, each op an asynchronous call
// on the device's stream over device pointers. A backend (CUDA today; Ascend CANN/ACL is the
// planned sibling, docs/ascend.md) implements this class and nothing else: the graph
// (model/device_model.h), the scheduler, the KV block manager and sampling stay on the
// host and are shared.
//
// HostDevice (CreateDevice("host")) implements the interface over peng's CPU kernels, in host
// memory. It is the reference every accelerator op is checked against (tests/backend), and it
// runs the device graph on machines without an accelerator, so the graph itself is tested in
// CI against the CPU engine's DecoderModel.
//
// Conventions: activations are row-major FP32 [rows, n] arrays in device memory; weights are
// DeviceMatrix values uploaded once in their stored type (block-quantized formats stay
// quantized; GGUF layouts, kernels/quant_blocks.h); every op accumulates in FP32. The paged KV
// cache is the CPU layout (kernels::KvLayerView) with device pointers, addressed by the same
// block tables as on the CPU.
#pragma once

#include <cstdint>
#include <initializer_list>
#include <memory>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "core/status.h"
#include "core/tensor.h"
#include "core/thread_pool.h"
#include "kernels/mla.h"
#include "kernels/moe.h"
#include "kernels/ops.h"
#include "parallel/communicator.h"

namespace peng::backend {

// A weight matrix [rows, cols] in device memory, in its stored type. INT8 matrices (peng
// quantize folders) carry one FP32 scale per row and their scheme's activations: W8A16 (FP32)
// or, with int8_activations, W8A8 -- each token's activations quantized in groups of 32
// (kernels::QuantizeActivations) and multiplied in exact int32 dot products, as Linear does
// on the CPU (in exact mode, kernels::SetExactActivations, W8A8 runs as W8A16 there too).
struct DeviceMatrix {
  DType dtype = DType::kF32;
  int64_t rows = 0, cols = 0;
  size_t row_bytes = 0;           // from a row to the next in device memory (the backend's
                                  // layout: CUDA rearranges some block formats)
  const void* data = nullptr;     // device pointer
  const float* scales = nullptr;  // device pointer, INT8 only
  bool int8_activations = false;  // INT8 only: W8A8
  TensorView host;                // the host bytes it was uploaded from (HostDevice runs on them)
};

// The stacked weights of a mixture-of-experts layer: n matrices [rows, cols] of one type (the
// gate, up or down projections of every routed expert).
struct DeviceExperts {
  DType dtype = DType::kF32;
  int64_t rows = 0, cols = 0;
  size_t row_bytes = 0;  // (as DeviceMatrix's)
  // Device array of the experts' device pointers; null for an expert this rank does not hold
  // (expert parallelism): its products are zeros.
  const uint8_t* const* data = nullptr;
  // INT8: device array of the experts' row-scale device pointers (as data), and the scheme
  // (DeviceMatrix::int8_activations).
  const float* const* scales = nullptr;
  bool int8_activations = false;
  std::vector<DeviceMatrix> experts;     // each one (the host device runs on their views)
};

// MLA's up-projection kv_b (kernels/mla.h): `kvb`, the FP32 [H][d_nope + d_v][r] copy, which
// every token may use; and, where the file stores kv_b per head (attn_k_b / attn_v_b, not
// INT8), those matrices in their stored type: k_b, H matrices W_UK[h]^T [r, d_nope], and v_b,
// H matrices W_UV[h] [d_v, r] (rows == 0: none). A sequence with one token in the step (a
// decode) multiplies the stored ones, as the CPU model's decode does
// (kernels::MlaAbsorbQueryHeads); every other token the FP32 copy.
struct MlaWeights {
  const float* kvb = nullptr;  // device pointer
  DeviceExperts k_b, v_b;
};

// One forward step's sequences as the device ops see them. The host arrays are always valid;
// the d_* arrays are the same data in device memory (uploaded once per step by the graph).
struct StepBatch {
  int64_t n_tokens = 0, n_seqs = 0;
  // host
  const int32_t* pos = nullptr;           // [n_tokens] absolute position of each token
  const int32_t* seq_of_token = nullptr;  // [n_tokens]
  const int32_t* seq_first_token = nullptr;  // [n_seqs]
  const int32_t* seq_n_tokens = nullptr;     // [n_seqs]
  const int32_t* const* block_tables = nullptr;  // [n_seqs] host block tables
  // device
  const int32_t* d_tokens = nullptr;       // [n_tokens]
  const int32_t* d_pos = nullptr;          // [n_tokens]
  const int32_t* d_slot = nullptr;         // [n_tokens] physical KV slot (block * bs + offset)
  const int32_t* d_seq_of_token = nullptr;  // [n_tokens]
  const int32_t* d_table_offset = nullptr;  // [n_seqs] start of a sequence's table in d_tables
  // [n_seqs + 1] seq_first_token, then n_tokens; null: not uploaded (the CUDA backend's tiled
  // attention then stays off)
  const int32_t* d_seq_first_token = nullptr;
  const int32_t* d_tables = nullptr;        // all block tables back to back
};

enum class GatedActivation { kSilu, kGeluTanh };

// A weighted sum of rows a product adds to its output (Device::MatMulOut::slots: SlotSum folded
// into the store -- the routed experts' outputs with the shared experts' down projection):
// y[t, r] += sum_j w[t k + j] * rows[(t k + j) n + r], n the matrix's rows; rows null: none.
struct SlotRows {
  const float* rows = nullptr;
  const float* w = nullptr;
  int k = 0;
};

// Rows normalized in place before a KV write (Device::RopeKvWrite; MLA's latent: the first n
// values of each of the step's rows of x, rows `stride` apart, RmsNorm'ed with weights w and
// no offset); x null: none.
struct RowNorm {
  float* x = nullptr;
  const float* w = nullptr;
  float eps = 0.f;
  int64_t n = 0, stride = 0;
};

// The heads' own RMSNorm before RoPE (Qwen3's and Gemma 3's q_norm / k_norm): every head of n
// values of q and of k normalized in place with weights q_w / k_w (+ w_offset), as RmsNorm
// over rows of n, head_stride apart (heads contiguous: token_stride = n_heads * head_stride);
// q_w null: none.
struct HeadNorms {
  const float* q_w = nullptr;
  const float* k_w = nullptr;
  float w_offset = 0.f, eps = 0.f;
  int64_t n = 0;
};

class Device {
 public:
  virtual ~Device() = default;
  // "host", "cuda:0 (NVIDIA H200, 139.8 GiB)".
  virtual std::string Name() const = 0;
  // Bytes of device memory free for the KV cache and scratch after the weights; all of it.
  virtual int64_t FreeMemoryBytes() const = 0;
  virtual int64_t TotalMemoryBytes() const { return FreeMemoryBytes(); }
  // False where the device's memory is the host's, uncounted (FreeMemoryBytes: a constant).
  virtual bool CountsMemory() const { return true; }

  // --- memory (Alloc'd blocks are freed by Free or when the device is destroyed)
  virtual StatusOr<void*> Alloc(int64_t bytes) = 0;
  virtual void Free(void* p) = 0;
  virtual Status CopyToDevice(void* dst, const void* src, int64_t bytes) = 0;
  virtual Status CopyToHost(void* dst, const void* src, int64_t bytes) = 0;
  // Host memory the device copies to and from at full speed (CUDA: page-locked), for the
  // logits a step brings back; freed by FreeHost. Null where any host memory serves as well
  // (the host device) or none could be had: the caller copies to its own then.
  virtual void* AllocHost(int64_t bytes) { return nullptr; }
  virtual void FreeHost(void* p) {}
  // Device-to-device copy, ordered on the stream.
  virtual void CopyOnDevice(void* dst, const void* src, int64_t bytes) = 0;
  virtual void Fill(void* dst, uint8_t value, int64_t bytes) = 0;
  // Waits for the stream; reports the first error of the ops enqueued since the last call.
  virtual Status Synchronize() = 0;
  // Not ok once the device can run nothing more (CUDA: an error that loses the context -- a
  // kernel's illegal address or other fault, an assert, uncorrectable ECC -- after which every
  // call fails until the process ends); for good.
  virtual Status Health() const { return OkStatus(); }
  // Recorded sequences of ops (CUDA graphs): BeginGraph() records the ops enqueued until
  // EndGraph(key), which stores them under `key` and runs them; LaunchGraph(key) runs them
  // again (false when nothing is stored under it). The recorded ops keep their arguments: the
  // caller replays only while the buffers and shapes they were recorded with are unchanged.
  // Devices without graphs (the host) run ops as they come: SupportsGraphs() is false.
  virtual bool SupportsGraphs() const { return false; }
  virtual void BeginGraph() {}
  virtual Status EndGraph(uint64_t key) { return OkStatus(); }
  virtual bool LaunchGraph(uint64_t key) { return false; }
  virtual void ClearGraphs() {}
  // Kernels launched on the device so far (a replayed graph counts the kernels it recorded;
  // a cuBLAS call counts as one): the work counter of docs/devices.md. 0 where the device does
  // not launch kernels (the host).
  virtual int64_t KernelLaunches() const { return 0; }
  // Read bandwidth of the device memory in bytes/s, measured the way the fastest kernel reaches
  // it (the widest loads, every core or multiprocessor), best of 3 passes over `bytes`.
  virtual double MeasureReadBandwidth(int64_t bytes) = 0;
  // Seconds a kernel that does nothing takes when kernels run one after another as a decode
  // step runs them (CUDA: recorded in a graph where graphs are on, with programmatic dependent
  // launch where that is on, a block a multiprocessor): the floor under each of a step's
  // KernelLaunches(). 0 where the device launches no kernels (the host).
  virtual double MeasureKernelFloor() { return 0; }

  // --- weights
  virtual bool SupportsWeights(DType t) const = 0;
  // Uploads w (a 2-D matrix view, e.g. a file's tensor or a shard of it); `int8_scales` (host,
  // one per row) for INT8 weights.
  virtual StatusOr<DeviceMatrix> Upload(const TensorView& w, const float* int8_scales) = 0;
  // The collectives of `group` (the ranks' host communicator, e.g. a tensor-parallel group of
  // an MPI job) on this device's memory and stream: the returned Communicator's pointers are
  // device pointers (CUDA: NCCL, one rank per GPU, its id sent over `group`; collective over
  // `group`). Null when `group` itself works on this device's memory (the host device).
  virtual StatusOr<std::unique_ptr<Communicator>> CreateCommunicator(Communicator* group) = 0;

  // Uploads n FP32 values (norm weights, biases, RoPE frequencies).
  StatusOr<float*> UploadFloats(const float* host, int64_t n);
  // Uploads one matrix per expert (same type and shape; null: an expert not held here) and the
  // table of their pointers; the allocations are appended to *allocs. INT8 experts need
  // int8_scales (host, one array per expert, as `experts`) and their scheme.
  StatusOr<DeviceExperts> UploadExperts(const std::vector<const TensorView*>& experts,
                                        std::vector<void*>* allocs,
                                        const std::vector<const float*>& int8_scales = {},
                                        bool int8_activations = false);

  // --- operators
  // y[t * rows + r] = sum_c W[r, c] x[t * cols + c], FP32 accumulation.
  virtual void MatMul(const DeviceMatrix& w, const float* x, int64_t n_tokens, float* y) = 0;
  // The products of several matrices with the same x (the projections of one input: q / k /
  // v, gate / up), each with its epilogue: y = W x + bias (bias: null or one value per row of
  // W, added to every token's row), or y += W x + bias when `accumulate` (a residual add), to
  // which `slots` adds its weighted rows (only with accumulate).
  // A backend may prepare x once for all of them (the CUDA backend quantizes it once) and fold
  // the epilogue into the product (the host device: SlotSum, MatMul, AddBiasRows and Add in
  // turn).
  struct MatMulOut {
    const DeviceMatrix* w;
    float* y;
    const float* bias = nullptr;
    bool accumulate = false;
    SlotRows slots = {};
  };
  virtual void MatMuls(const float* x, int64_t n_tokens,
                       std::initializer_list<MatMulOut> outs) = 0;
  // An MoE layer's router and routing over a norm's output (NormMatMuls' `route`):
  // MatMulMoeRoute(*router, y, n_tokens, logits, bias, p, ids, w).
  struct MoeRouteOut {
    const DeviceMatrix* router;
    float* logits;
    const float* bias;
    kernels::MoeRouting p;
    int32_t* ids;
    float* w;
  };
  // RmsNorm(x -> y) over n_tokens rows of n values, then MatMuls(y, outs). `experts`: routed
  // experts that an ExpertsMatMuls over y (one row a token) will multiply next, after ops that
  // only read y: a backend may prepare y for them as well (the CUDA backend quantizes it for
  // them in the norm's kernel and skips that step in ExpertsMatMuls); null: none. `route`: the
  // router and routing over y after the products (a backend may run them in the products'
  // kernel); null: none.
  virtual void NormMatMuls(const float* x, const float* norm_w, float w_offset, float eps,
                           float* y, int64_t n_tokens, int64_t n,
                           std::initializer_list<MatMulOut> outs,
                           const DeviceExperts* experts = nullptr,
                           const MoeRouteOut* route = nullptr);
  // Gated(act, gate, up -> h) over n_tokens rows of n values, then MatMuls(h, outs). h may be
  // gate or up (in place); then, where every product takes quantized activations, a backend may
  // leave h unwritten (the CUDA backend: the activation computed inside the products' GEMV).
  virtual void GatedMatMuls(GatedActivation act, const float* gate, const float* up, float* h,
                            int64_t n_tokens, int64_t n, std::initializer_list<MatMulOut> outs);
  // out[t] = W[tokens[t] - row0, :] * scale, dequantized (embedding lookup); zeros for a token
  // outside [row0, row0 + rows) (a vocabulary-parallel shard: the ranks' rows are summed).
  virtual void EmbedRows(const DeviceMatrix& w, const StepBatch& b, float scale, float* out,
                         int64_t row0 = 0) = 0;
  // y = x / sqrt(mean(x^2) + eps) * (w + w_offset) over n_rows rows of n (kernels::RmsNorm);
  // row r of x and y starts at r * stride (stride 0: n).
  virtual void RmsNorm(const float* x, const float* w, float w_offset, float* y, int64_t n_rows,
                       int64_t n, float eps, int64_t stride = 0) = 0;
  // y += RmsNorm(x) over n_rows rows of n, contiguous (a post-norm into the residual stream:
  // Gemma's post-attention and post-feed-forward norms); x is left normalized or as it was. By
  // default RmsNorm in place, then Add.
  virtual void AddRmsNorm(float* y, float* x, const float* w, float w_offset, int64_t n_rows,
                          int64_t n, float eps);
  // y[t * n + i] += b[i].
  virtual void AddBiasRows(float* y, const float* b, int64_t n_rows, int64_t n) = 0;
  // y[i] += x[i].
  virtual void Add(float* y, const float* x, int64_t n) = 0;
  // y[i] *= s.
  virtual void Scale(float* y, float s, int64_t n) = 0;
  // y[i] = cap * tanh(y[i] / cap).
  virtual void Softcap(float* y, float cap, int64_t n) = 0;
  // out[i] = act(gate[i]) * up[i].
  virtual void Gated(GatedActivation act, const float* gate, const float* up, float* out,
                     int64_t n) = 0;
  // Rotates the first cfg.rot_dim values of each of n_heads heads in place (kernels::ApplyRope):
  // head h of token t starts at x + t * token_stride + h * head_stride, token t at position
  // b.pos[t]; inv_freq: rot_dim / 2 device floats.
  virtual void Rope(float* x, int64_t n_heads, int64_t head_stride, int64_t token_stride,
                    const StepBatch& b, const kernels::RopeConfig& cfg,
                    const float* inv_freq) = 0;
  // Writes each token's k [n_kv_heads, head_dim] and v [n_kv_heads, v_head_dim] into its slot;
  // an MLA latent cache (kernels/mla.h: v_head_dim 0) takes only k, the row [c | k_pe].
  virtual void KvWrite(const kernels::KvLayerView& kv, const StepBatch& b, const float* k,
                       const float* v) = 0;
  // The heads Rope rotates in one tensor (x null: none).
  struct RopeHeads {
    float* x = nullptr;
    int64_t n_heads = 0, head_stride = 0, token_stride = 0;
  };
  // Rope of q's and k's heads and `norm`, then KvWrite(kv, b, k_rows, v_rows) (k_rows holds k's
  // rotated heads and the normalized values): the step between the projections and the
  // attention. A backend may do it in one pass; by default, the calls one by one.
  virtual void RopeKvWrite(const RopeHeads& q, const RopeHeads& k, const StepBatch& b,
                           const kernels::RopeConfig& cfg, const float* inv_freq,
                           const kernels::KvLayerView& kv, const float* k_rows,
                           const float* v_rows, const RowNorm& norm = {});
  // Causal paged attention of every token of the batch over its sequence's cache (positions
  // <= its own, within the sliding window): q [n_tokens, n_heads, head_dim] -> out
  // [n_tokens, n_heads, v_head_dim] (kernels::PagedAttentionBatch).
  virtual void PagedAttention(const float* q, const kernels::KvLayerView& kv, const StepBatch& b,
                              const kernels::AttentionParams& p, float* out) = 0;
  // RopeKvWrite's arguments but the cache, for an attention to do first (AttentionMatMuls,
  // RopeMlaAbsorbQuery), and the heads' norms to do before it (NormHeads).
  struct RopeKv {
    RopeHeads q, k;
    const kernels::RopeConfig* cfg = nullptr;
    const float* inv_freq = nullptr;
    const float* k_rows = nullptr;
    const float* v_rows = nullptr;
    RowNorm norm;
    HeadNorms head_norm;
  };
  // rope's HeadNorms by RmsNorm (q's and k's heads, in place), where set.
  void NormHeads(const RopeKv& rope, int64_t n_tokens);
  // NormHeads and RopeKvWrite(*rope) where rope is given (q = rope->q.x), PagedAttention, then
  // MatMuls(out, outs) (the output projection). A backend may normalize, rotate and store inside
  // the attention -- q's and k's rows are then left as they were -- and prepare the attention's
  // output for the products as it writes it; by default, the calls one by one.
  virtual void AttentionMatMuls(const float* q, const kernels::KvLayerView& kv,
                                const StepBatch& b, const kernels::AttentionParams& p, float* out,
                                std::initializer_list<MatMulOut> outs,
                                const RopeKv* rope = nullptr);
  // --- multi-head latent attention (kernels/mla.h; kv_b: MlaWeights)
  // q [T, H, d_nope + d_rope] -> out [T, H, r + d_rope] (W_UK^T q_nope | q_pe).
  virtual void MlaAbsorbQuery(const float* q, const StepBatch& b, const MlaWeights& w,
                              const kernels::MlaParams& p, float* out) = 0;
  // NormHeads and RopeKvWrite(rope, into kv), then MlaAbsorbQuery: a backend may do the first
  // inside the second (q's and the latent rows are then left as they were); by default, the
  // calls one by one.
  virtual void RopeMlaAbsorbQuery(const RopeKv& rope, const kernels::KvLayerView& kv,
                                  const float* q, const StepBatch& b, const MlaWeights& w,
                                  const kernels::MlaParams& p, float* out);
  // Absorbed causal attention over the latent cache: q [T, H, r + d_rope] -> out [T, H, r].
  virtual void MlaAttention(const float* q, const kernels::KvLayerView& kv, const StepBatch& b,
                            const kernels::MlaParams& p, float* out) = 0;
  // o_lat [T, H, r] -> out [T, H * d_v] (W_UV o_lat per head).
  virtual void MlaProjectOutput(const float* o_lat, const StepBatch& b, const MlaWeights& w,
                                const kernels::MlaParams& p, float* out) = 0;
  // MlaProjectOutput, then MatMuls(out, outs) (the output projection o). A backend may prepare
  // out for the products as it writes it; by default, the two calls.
  virtual void MlaProjectMatMuls(const float* o_lat, const StepBatch& b, const MlaWeights& w,
                                 const kernels::MlaParams& p, float* out,
                                 std::initializer_list<MatMulOut> outs);

  // --- mixture of experts
  // Router logits [T, n_experts] -> ids, w [T, k] (kernels::MoeRoute); bias: device or null.
  virtual void MoeRoute(const float* logits, const float* bias, int64_t n_tokens,
                        const kernels::MoeRouting& p, int32_t* ids, float* w) = 0;
  // MatMul(router, x) into logits, then MoeRoute over them: a backend may route inside the
  // product's kernel; by default, the two calls.
  virtual void MatMulMoeRoute(const DeviceMatrix& router, const float* x, int64_t n_tokens,
                              float* logits, const float* bias, const kernels::MoeRouting& p,
                              int32_t* ids, float* w);
  // For every token t and slot j < k: y[(t k + j) rows + r] = W_e[r, :] . x_(t, j) with
  // e = ids[t k + j] and x_(t, j) the row t k + j of x when x_per_slot, else row t (0 when
  // expert e is not held here).
  virtual void ExpertsMatMul(const DeviceExperts& w, const float* x, int64_t n_tokens,
                             const int32_t* ids, int k, bool x_per_slot, float* y) = 0;
  // ExpertsMatMul of several stacked matrices with the same x (the routed experts' gate and up
  // projections). A backend may prepare x once and run them together; by default, one
  // ExpertsMatMul each.
  struct ExpertsOut {
    const DeviceExperts* w;
    float* y;
  };
  virtual void ExpertsMatMuls(const float* x, int64_t n_tokens, const int32_t* ids, int k,
                              bool x_per_slot, std::initializer_list<ExpertsOut> outs);
  // Gated(act, gate, up -> h) over the n_tokens x k (token, slot) rows of n values, then
  // ExpertsMatMul(w, h, n_tokens, ids, k, x_per_slot = true, y): the routed experts' down
  // projection. A backend may prepare h as it computes it (the CUDA backend quantizes it); by
  // default, the two calls.
  virtual void GatedExpertsMatMul(GatedActivation act, const float* gate, const float* up,
                                  float* h, int64_t n_tokens, int k, int64_t n,
                                  const DeviceExperts& w, const int32_t* ids, float* y);
  // out[t n + i] += sum_j w[t k + j] * y[(t k + j) n + i].
  virtual void SlotSum(const float* y, const float* w, int64_t n_tokens, int k, int64_t n,
                       float* out) = 0;
  // The shared experts of MoeDown: their gate and up rows [T, n] and their down projection
  // (null: the layer has none).
  struct SharedExperts {
    float* gate = nullptr;
    const float* up = nullptr;
    int64_t n = 0;
    const DeviceMatrix* down = nullptr;
  };
  // An MoE layer's down projections added to out [T, down.rows]: GatedExpertsMatMul over the
  // routed pairs' gate and up rows [T k, n] (h in place of gate) into ys [T k, down.rows], then
  // the shared experts' GatedMatMuls (h in place of shared.gate) with the routed rows' sum
  // weighted by w [T, k] in the down projection's store (SlotRows), accumulating into out --
  // or SlotSum where there are no shared experts. gate and shared.gate are left as the
  // activations or as they were. A backend may run it all in one kernel (the CUDA backend for a
  // decode step's few tokens); ys then has room for T (k + 1) rows.
  virtual void MoeDown(GatedActivation act, float* gate, const float* up, int64_t n_tokens,
                       int k, int64_t n, const DeviceExperts& down, const int32_t* ids,
                       const float* w, const SharedExperts& shared, float* ys, float* out);

  // dst[i] = src[rows[i]] for n rows of n_cols floats; rows: device int32.
  virtual void GatherRows(const float* src, const int32_t* rows, int64_t n, int64_t n_cols,
                          float* dst) = 0;
  // --- logit rows
  static constexpr int kTopLogitsMax = 256;
  // The most TopLogits returns for a few rows after a step (a nucleus wider than the best
  // kTopLogitsMax: Executor::CopyBestOfLogitRows), at a slower rate a row.
  static constexpr int kTopLogitsWide = 4096;
  // The k best of each of n_rows rows of n values (1 <= k <= kTopLogitsWide, k <= n), best
  // first in kernels::TopK's order, into val / idx [n_rows, k], and each row's first NaN or +inf
  // index (kernels::FindNanOrPosInf; -1: none) into first_bad [n_rows]: all that sampling a
  // greedy or top-k row reads (Sampler::SampleTop), so that a step brings back k pairs a row
  // instead of the row. scratch: TopLogitsScratchBytes(n_rows, n, k) bytes of device memory,
  // 8-byte aligned.
  virtual void TopLogits(const float* x, int64_t n_rows, int64_t n, int k, float* val,
                         int32_t* idx, int32_t* first_bad, void* scratch) = 0;
  virtual int64_t TopLogitsScratchBytes(int64_t n_rows, int64_t n, int k) const { return 0; }
  // The engine's changes to rows before sampling (LogitEdits), in place: row r's edits are
  // edits[rows[r].bias, rows[r].ban) -- each value added to its id's logit, one after another --,
  // then the ids its mask does not allow (where rows[r].mask >= 0: bit id % 32 of word
  // masks[rows[r].mask + id / 32] clear) and the ids of [ban, history) set to -inf, then
  // [history, end) -- the penalties of Sampler::ApplyPenalties on each id (the value its count
  // in the output), with the row's repetition / presence / frequency penalties, in its
  // arithmetic: the same values. Ids outside [0, n) are skipped.
  struct LogitEditRow {
    int32_t bias, ban, history, end;
    float repetition, presence, frequency;
    int32_t mask;  // -1: none
  };
  struct LogitEdit {
    int32_t id;
    float value;
  };
  virtual void EditLogits(float* x, int64_t n_rows, int64_t n, const LogitEditRow* rows,
                          const LogitEdit* edits, const uint32_t* masks) = 0;
  // Sampling's sums and draw where the logits are (a step then brings back a few values a row,
  // not the row). For each row r with a finite largest value m = best[r * best_stride]
  // (TopLogits' val):
  //   - inv_temperature > 0: the softmax's denominator kernels::TemperatureTotal into total[r]
  //     (what top-p needs beside the best logits: Sampler::SampleNucleus), and where uniform
  //     >= 0, plain temperature sampling's draw kernels::DrawInIdOrder with that uniform into
  //     drawn[r] and its logit into drawn_logit[r] -- the same id but where u * total falls
  //     within rounding of a boundary between two ids (a device may sum in another order);
  //   - flags & kLogSoftmaxTotal: kernels::LogSoftmaxTotal into log_total[r] (logprobs).
  // Anything not asked for, and every row with a best value of -inf or +inf: drawn -1, the
  // rest 0.
  struct TokenDraw {
    float inv_temperature;
    uint32_t flags;
    double uniform;
  };
  static constexpr uint32_t kLogSoftmaxTotal = 1;
  struct DrawResults {  // [n_rows] each
    int32_t* drawn;
    float* drawn_logit;
    double* total;
    double* log_total;
  };
  virtual void DrawTokens(const float* x, int64_t n_rows, int64_t n, const float* best,
                          int best_stride, const TokenDraw* draws, const DrawResults& out) = 0;

  // Copies block src to block dst in a KV layer (copy-on-write).
  void CopyKvBlock(const kernels::KvLayerView& kv, int32_t src, int32_t dst);

 protected:
  // Upload()'s checks (2-D, a supported type, INT8 with scales) and the matrix described with
  // its host bytes and scales as data (the backend replaces them with its copies).
  StatusOr<DeviceMatrix> Describe(const TensorView& w, const float* int8_scales) const;
};

// The device a spec names: "host" (HostDevice over `pool`, which must outlive it), "cuda" or
// "cuda:N" ("cuda" in an mpirun job: the GPU of the rank's local rank on its host). An error
// that says why when the backend is not built in or the device is absent.
StatusOr<std::unique_ptr<Device>> CreateDevice(const std::string& spec, ThreadPool* pool);
// The CUDA device index of "cuda" (0) / "cuda:N", -1 for "host" and registered names; an error
// naming the spec for anything else (the engine checks --device before loading a model).
StatusOr<int> ParseDeviceSpec(const std::string& spec);
// A backend linked in under its own device name, which CreateDevice then opens: the tests' CUDA
// emulator ("cuda-emu", backend/cuda/emulator.h) registers itself this way.
using DeviceFactory = StatusOr<std::unique_ptr<Device>> (*)();
void RegisterDevice(const std::string& name, DeviceFactory factory);
// Number of CUDA devices present (0 without the CUDA backend or without a GPU).
int CudaDeviceCount();

}  // namespace peng::backend
