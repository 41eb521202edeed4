// KvCache: the tensors of a paged KV cache -- for every layer, K and V arrays of
// [num_blocks][block_size][n_kv_heads][head_dim] values (F32, F16, or Q8_0 blocks of 32 along
// head_dim: `--kv-cache-dtype`) -- allocated once at start-up from a
// memory budget. Which sequence owns which block is decided elsewhere (kv/block_pool.h); this
// class only owns the memory. Not thread-safe; owned by the engine thread.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "core/dtype.h"
#include "core/status.h"
#include "kernels/ops.h"

namespace peng {

struct KvCacheSpec {
  struct Layer {
    int n_kv_heads = 0;
    int head_dim = 0;
    int v_head_dim = 0;
    int latent_dim = 0;  // MLA (no V): the first latent_dim values of a K row are its value
  };
  std::vector<Layer> layers;
  // OK if a cache of `dtype` can hold these layers: F32 and F16 any, Q8_0 (32-value blocks, an
  // fp16 scale each) rows whose dimensions are multiples of 32.
  Status CheckDtype(DType dtype) const;
  // Bytes one token occupies across all layers (K + V).
  int64_t BytesPerToken(DType dtype) const;
  // The view of layer `il` for a cache of num_blocks blocks, without its K / V pointers, and
  // the bytes its K and V arrays take (the caller places them: host or device memory).
  kernels::KvLayerView LayerView(int il, int64_t num_blocks, int block_size, DType dtype,
                                 int64_t* k_bytes, int64_t* v_bytes) const;
};

class KvCache {
 public:
  // Allocates num_blocks blocks of block_size tokens for every layer of `spec`.
  static StatusOr<std::unique_ptr<KvCache>> Create(const KvCacheSpec& spec, int64_t num_blocks,
                                                   int block_size, DType dtype);
  // Number of blocks that fit in `budget_bytes`.
  static int64_t BlocksForBudget(const KvCacheSpec& spec, int block_size, DType dtype,
                                 int64_t budget_bytes);

  const kernels::KvLayerView& layer(int i) const { return layers_[i]; }
  // Copies the K and V of block `src` to block `dst` in every layer (copy-on-write of a block
  // shared by several sequences before one of them writes into it).
  void CopyBlock(int32_t src, int32_t dst);
  int64_t num_blocks() const { return num_blocks_; }
  int block_size() const { return block_size_; }
  DType dtype() const { return dtype_; }
  int64_t bytes() const { return static_cast<int64_t>(storage_.size()); }

 private:
  std::vector<kernels::KvLayerView> layers_;
  std::vector<uint8_t> storage_;
  int64_t num_blocks_ = 0;
  int block_size_ = 0;
  DType dtype_ = DType::kF16;
};

}  // namespace peng
