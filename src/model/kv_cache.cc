#include "model/kv_cache.h"

#include <cstring>
#include <string>

namespace peng {

Status KvCacheSpec::CheckDtype(DType dtype) const {
  if (dtype != DType::kF16 && dtype != DType::kF32 && dtype != DType::kQ8_0)
    return InvalidArgument(std::string("KV cache dtype must be f16, f32 or q8_0, got ") +
                           DTypeName(dtype));
  if (dtype != DType::kQ8_0) return OkStatus();
  for (size_t il = 0; il < layers.size(); ++il) {
    const Layer& l = layers[il];
    for (int dim : {l.head_dim, l.v_head_dim, l.latent_dim}) {
      if (dim % 32 != 0)
        return InvalidArgument("a q8_0 KV cache needs head dimensions that are multiples of 32; "
                               "layer " + std::to_string(il) + " has " + std::to_string(dim) +
                               " (use --kv-cache-dtype f16)");
    }
    // The rows are rotated in runs (kernels::RotationBlock), and an MLA row's runs must not
    // straddle its latent's end.
    if (l.latent_dim > 0 && l.latent_dim % kernels::RotationBlock(l.head_dim) != 0)
      return InvalidArgument("a q8_0 KV cache needs the MLA latent (" +
                             std::to_string(l.latent_dim) + " of layer " + std::to_string(il) +
                             ") a multiple of 64 when its rows are (use --kv-cache-dtype f16)");
  }
  return OkStatus();
}

int64_t KvCacheSpec::BytesPerToken(DType dtype) const {
  int64_t total = 0;
  for (const Layer& l : layers)
    total += static_cast<int64_t>(RowBytes(dtype, int64_t{l.n_kv_heads} * l.head_dim) +
                                  RowBytes(dtype, int64_t{l.n_kv_heads} * l.v_head_dim));
  return total;
}

int64_t KvCache::BlocksForBudget(const KvCacheSpec& spec, int block_size, DType dtype,
                                 int64_t budget_bytes) {
  const int64_t per_block = spec.BytesPerToken(dtype) * block_size;
  return per_block > 0 ? budget_bytes / per_block : 0;
}

StatusOr<std::unique_ptr<KvCache>> KvCache::Create(const KvCacheSpec& spec, int64_t num_blocks,
                                                   int block_size, DType dtype) {
  PENG_RETURN_IF_ERROR(spec.CheckDtype(dtype));
  if (num_blocks <= 0 || block_size <= 0)
    return InvalidArgument("KV cache needs at least one block (num_blocks=" +
                           std::to_string(num_blocks) +
                           ", block_size=" + std::to_string(block_size) + ")");
  auto kv = std::make_unique<KvCache>();
  kv->num_blocks_ = num_blocks;
  kv->block_size_ = block_size;
  kv->dtype_ = dtype;
  const int64_t total = spec.BytesPerToken(dtype) * block_size * num_blocks;
  try {
    kv->storage_.assign(static_cast<size_t>(total), 0);
  } catch (const std::bad_alloc&) {
    return ResourceExhausted("cannot allocate " + std::to_string(total) + " bytes of KV cache");
  }
  uint8_t* p = kv->storage_.data();
  for (size_t il = 0; il < spec.layers.size(); ++il) {
    int64_t k_bytes, v_bytes;
    kernels::KvLayerView v =
        spec.LayerView(static_cast<int>(il), num_blocks, block_size, dtype, &k_bytes, &v_bytes);
    v.k = p;
    v.v = p + k_bytes;
    p += k_bytes + v_bytes;
    kv->layers_.push_back(v);
  }
  return kv;
}

kernels::KvLayerView KvCacheSpec::LayerView(int il, int64_t num_blocks, int block_size,
                                            DType dtype, int64_t* k_bytes,
                                            int64_t* v_bytes) const {
  const Layer& l = layers[il];
  kernels::KvLayerView v;
  v.dtype = dtype;
  v.num_blocks = num_blocks;
  v.block_size = block_size;
  v.n_kv_heads = l.n_kv_heads;
  v.head_dim = l.head_dim;
  v.v_head_dim = l.v_head_dim;
  const int64_t tokens = num_blocks * block_size;
  *k_bytes = tokens * static_cast<int64_t>(RowBytes(dtype, int64_t{l.n_kv_heads} * l.head_dim));
  *v_bytes = tokens * static_cast<int64_t>(RowBytes(dtype, int64_t{l.n_kv_heads} * l.v_head_dim));
  return v;
}

void KvCache::CopyBlock(int32_t src, int32_t dst) {
  if (src == dst) return;
  for (const kernels::KvLayerView& l : layers_) {
    const auto k_bytes =
        static_cast<int64_t>(RowBytes(dtype_, int64_t{block_size_} * l.n_kv_heads * l.head_dim));
    const auto v_bytes =
        static_cast<int64_t>(RowBytes(dtype_, int64_t{block_size_} * l.n_kv_heads * l.v_head_dim));
    auto* k = static_cast<uint8_t*>(l.k);
    auto* v = static_cast<uint8_t*>(l.v);
    std::memcpy(k + dst * k_bytes, k + src * k_bytes, k_bytes);
    std::memcpy(v + dst * v_bytes, v + src * v_bytes, v_bytes);
  }
}

}  // namespace peng
