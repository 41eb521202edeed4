// Linear: one weight matrix W [rows, cols] of a model and how to multiply by it, whatever its
// storage: F32/F16/BF16 or a GGML block-quantized type (kernels::MatMul), or INT8 with one F32
// scale per output row from a `peng quantize` folder (kernels::Int8MatMul*). For INT8 the
// model's scheme decides the activations: W8A16 multiplies FP32 activations (dequantizing
// weights on the fly); W8A8 quantizes each token's activations to int8 (or takes them already
// quantized from a fused RMSNorm, see Int8Acts) and runs exact int32 dot products. In exact
// mode (kernels::SetExactActivations) INT8 weights use the W8A16 path. Copyable value type;
// the weight bytes belong to the ModelFiles it was bound from.
#pragma once

#include <cstdint>
#include <deque>
#include <memory>
#include <string>
#include <vector>

#include "core/status.h"
#include "core/tensor.h"
#include "core/thread_pool.h"
#include "kernels/int8_gemm.h"
#include "model/model_files.h"

namespace peng {

// Int8 activations [T, cols] with one scale per token and group of 32 values (W8A8 input;
// kernels::QuantizeActivations), reused across steps.
struct Int8Acts {
  std::vector<int8_t> q;
  std::vector<float> scales;
  int64_t tokens = 0, cols = 0;
  void Resize(int64_t t, int64_t c);
};

// FP32 view of a small tensor of n values (norm weights, biases) named GGUF-style in `files`:
// the file's own bytes when they are aligned F32, else converted into a new vector appended to
// *owned (a deque, so earlier views stay valid). nullptr without error when optional and absent.
StatusOr<const float*> BindVector(const ModelFiles& files, const std::string& name, int64_t n,
                                  bool optional, std::deque<std::vector<float>>* owned);

class Linear;

// What one decoded token's matrix-vector products with the weights cost: the bytes read (the
// bandwidth bound of decoding) and the multiply-adds, split by how the kernels do them (integer
// dot products for block-quantized and INT8 weights, FP32 FMAs for float weights): the compute
// bound of a batch, which reads the weights once for all its tokens. Attention is not counted.
struct WeightTraffic {
  int64_t bytes = 0;
  int64_t int_multiply_adds = 0;
  int64_t float_multiply_adds = 0;
  void Add(const Linear& l, int64_t times = 1);
};

class Linear {
 public:
  Linear() = default;
  // Binds GGUF-style `name` from `files`, checking shape [rows, cols] and that the type is
  // supported (INT8 needs its scale and cols a multiple of 32).
  static StatusOr<Linear> Bind(const ModelFiles& files, const std::string& name, int64_t rows,
                               int64_t cols);
  // One matrix of a stacked 3-D tensor `name` of shape [n, total_rows, cols] (e.g. the experts
  // of an MoE layer): rows [row0, row0 + rows) of matrix `index` (a fused gate_up tensor holds
  // gate and up as two row ranges). Checks the 3-D shape and the type (INT8 is not supported);
  // block-quantized rows are whole blocks, so any row range is a valid matrix. The Linear
  // reports `display_name` as its name.
  static StatusOr<Linear> BindSlice(const ModelFiles& files, const std::string& name, int64_t n,
                                    int64_t total_rows, int64_t cols, int64_t index, int64_t row0,
                                    int64_t rows, const std::string& display_name);

  // A tensor-parallel shard of the 2-D matrix `name` [rows_total, cols_total]: rows
  // [row0, row0 + rows) (column parallel: a slice of the outputs, a view into the file) and
  // columns [col0, col0 + cols) (row parallel: a slice of the inputs). A column slice is copied
  // into memory this Linear owns (the kernels read whole rows), so a rank reads and keeps only
  // its own part of the file; col0 and cols must be whole blocks of the stored type (INT8:
  // multiples of 32). The whole matrix when the ranges cover it.
  static StatusOr<Linear> BindShard(const ModelFiles& files, const std::string& name,
                                    int64_t rows_total, int64_t cols_total, int64_t row0,
                                    int64_t rows, int64_t col0, int64_t cols);
  // Columns [col0, col0 + cols) of this matrix (a row-parallel shard, e.g. of one expert of a
  // stacked tensor), copied into memory the result owns; whole blocks of the stored type.
  StatusOr<Linear> Columns(const ModelFiles& files, int64_t col0, int64_t cols) const;
  // Values per block of the matrix `name` as stored (32 for Q4_0, 256 for the K-quants, 32 for
  // INT8 -- the kernels' group --, 1 for float types): the granularity of a column split.
  static StatusOr<int64_t> ColumnGranularity(const ModelFiles& files, const std::string& name);

  bool bound() const { return w_ != nullptr; }
  const TensorView& tensor() const { return *w_; }
  // The GGUF-style name it was bound under ("blk.3.attn_q.weight"), whatever the file's name.
  const std::string& name() const { return name_; }
  int64_t rows() const { return rows_; }
  int64_t cols() const { return cols_; }
  bool is_int8() const { return int8_; }
  // INT8: the per-row scales (host memory); nullptr otherwise.
  const float* int8_scales() const { return int8_ ? scales_ : nullptr; }
  // INT8 of the W8A8 scheme: int8 activations outside exact mode.
  bool int8_activations() const { return int8_ && scheme_ == QuantScheme::kW8A8; }
  // True when Forward would quantize FP32 input itself (so a fused RMSNorm should do it).
  bool WantsInt8Acts() const;
  // Bytes of weights (and scales) read by one pass over the matrix.
  int64_t bytes() const;

  // y[t * rows + r] = sum_c W[r, c] x[t * cols + c]. `xq` (optional) holds the same activations
  // already quantized per token (used by W8A8 weights, ignored otherwise); `scratch` is used
  // when W8A8 weights get no xq.
  void Forward(const float* x, const Int8Acts* xq, int64_t n_tokens, float* y, ThreadPool* pool,
               Int8Acts* scratch) const;
  // Forward of several Linears with the same input x (Q/K/V, gate/up) into ys[i]: block-quantized
  // and float weights go through one kernels::MatMulGroup (activations quantized once, one
  // parallel region); otherwise (INT8) one Forward each. Same results as n Forwards.
  static void ForwardGroup(const Linear* const* ls, float* const* ys, int n, const float* x,
                           const Int8Acts* xq, int64_t n_tokens, ThreadPool* pool,
                           Int8Acts* scratch);
  // W[r, :] as floats (embedding lookup, diagnostics).
  void DequantizeRow(int64_t r, float* out) const;

 private:
  // Bind without the panels (BindShard slices the view first).
  static StatusOr<Linear> BindView(const ModelFiles& files, const std::string& name,
                                   int64_t rows, int64_t cols);
  // Points the view at the matrix packed into the kernels' panel layout (kernels::PackPanels),
  // where the active ISA has one for its type.
  void AttachPanels();
  kernels::Int8Weights Int8View() const;
  // W8A8: an error naming the tensor and row where a weight is -128 (the file's tensors, once,
  // when bound: the shards and column copies made from them are not scanned again).
  Status CheckW8A8Range(const ModelFiles& files) const;
  // Makes this an INT8 matrix with `scales` (one per row), after checking the column count.
  Status AttachInt8Scales(const ModelFiles& files, const float* scales);

  const TensorView* w_ = nullptr;
  std::string name_;
  int64_t rows_ = 0, cols_ = 0;
  bool int8_ = false;
  QuantScheme scheme_ = QuantScheme::kNone;
  const float* scales_ = nullptr;
  std::shared_ptr<std::vector<float>> owned_scales_;    // when the file's are unaligned
  std::shared_ptr<TensorView> owned_view_;              // BindSlice / BindShard: the view
  std::shared_ptr<uint8_t> owned_bytes_;                // Columns: a column slice
  std::shared_ptr<const uint8_t> owned_panels_;         // AttachPanels: the packed copy
};

}  // namespace peng
