#include "kv/block_pool.h"

#include "core/check.h"

namespace peng {

BlockPool::BlockPool(int64_t num_blocks) : ref_counts_(num_blocks, 0) {
  for (int64_t i = 0; i < num_blocks; ++i) free_.push_back(static_cast<int32_t>(i));
}

std::optional<std::vector<int32_t>> BlockPool::Allocate(int64_t n) {
  if (n > num_free()) return std::nullopt;
  std::vector<int32_t> out;
  out.reserve(n);
  for (int64_t i = 0; i < n; ++i) {
    const int32_t b = free_.front();
    free_.pop_front();
    PENG_DCHECK(ref_counts_[b] == 0);
    ref_counts_[b] = 1;
    out.push_back(b);
  }
  return out;
}

void BlockPool::Retain(int32_t block) {
  PENG_CHECK(ref_counts_[block] > 0);
  ++ref_counts_[block];
}

void BlockPool::Release(const std::vector<int32_t>& blocks) {
  for (int32_t b : blocks) {
    PENG_CHECK(ref_counts_[b] > 0);
    if (--ref_counts_[b] == 0) free_.push_back(b);
  }
}

void BlockPool::CheckInvariants() const {
  std::vector<char> is_free(ref_counts_.size(), 0);
  for (int32_t b : free_) {
    PENG_CHECK_MSG(!is_free[b], "block twice on the free list");
    is_free[b] = 1;
  }
  for (size_t b = 0; b < ref_counts_.size(); ++b)
    PENG_CHECK_MSG(is_free[b] == (ref_counts_[b] == 0), "block free xor referenced");
}

bool BlockTable::EnsureCapacity(BlockPool* pool, int block_size, int64_t n_tokens) {
  const int64_t need = (n_tokens + block_size - 1) / block_size - static_cast<int64_t>(blocks_.size());
  if (need <= 0) return true;
  auto got = pool->Allocate(need);
  if (!got) return false;
  blocks_.insert(blocks_.end(), got->begin(), got->end());
  return true;
}

void BlockTable::Clear(BlockPool* pool) {
  pool->Release(blocks_);
  blocks_.clear();
}

}  // namespace peng
