#include "kv/kv_cache_manager.h"

#include <algorithm>

#include "core/check.h"

namespace peng {

KvCacheManager::KvCacheManager(int64_t num_blocks, int block_size, bool enable_prefix_caching)
    : pool_(num_blocks), block_size_(block_size), prefix_caching_(enable_prefix_caching) {
  PENG_CHECK(block_size > 0);
}

double KvCacheManager::usage() const {
  return num_blocks() ? static_cast<double>(num_used_blocks()) / num_blocks() : 0.0;
}

ComputedBlocks KvCacheManager::GetComputedBlocks(std::span<const int32_t> tokens) const {
  ComputedBlocks out;
  if (!prefix_caching_) return out;
  out.num_query_tokens = static_cast<int64_t>(tokens.size());
  const int64_t max_blocks = (out.num_query_tokens - 1) / block_size_;  // keep one to compute
  uint64_t parent = 0;
  for (int64_t i = 0; i < max_blocks; ++i) {
    auto block_tokens = tokens.subspan(i * block_size_, block_size_);
    const uint64_t h = pool_.HashBlock(parent, block_tokens);
    std::optional<int32_t> b = pool_.Lookup(h, parent, block_tokens);
    if (!b) break;
    out.blocks.push_back(*b);
    out.hashes.push_back(h);
    parent = h;
  }
  out.num_tokens = static_cast<int64_t>(out.blocks.size()) * block_size_;
  return out;
}

bool KvCacheManager::AllocateSlots(int64_t seq, int64_t num_computed_tokens,
                                   int64_t num_new_tokens, const ComputedBlocks* computed,
                                   std::vector<BlockCopy>* copies) {
  static const Seq kEmpty;
  auto it = seqs_.find(seq);
  PENG_CHECK_MSG((it == seqs_.end()) == (computed != nullptr),
                 "pass ComputedBlocks exactly when admitting a new sequence");
  const Seq& s = it != seqs_.end() ? it->second : kEmpty;
  const std::vector<int32_t>& have = computed ? computed->blocks : s.blocks;
  if (computed) PENG_CHECK(num_computed_tokens == computed->num_tokens);

  // Cached blocks about to be taken off the free list are not available for allocation.
  int64_t reclaimed = 0;
  if (computed)
    for (int32_t b : have) reclaimed += pool_.is_free(b);
  const int64_t end = num_computed_tokens + num_new_tokens;
  const int64_t need = std::max<int64_t>(
      0, (end + block_size_ - 1) / block_size_ - static_cast<int64_t>(have.size()));
  const int64_t first = num_computed_tokens / block_size_;  // block of the first write
  const bool cow = num_new_tokens > 0 && first < static_cast<int64_t>(have.size()) &&
                   pool_.ref_count(have[first]) > 1;
  if (need + cow + reclaimed > pool_.num_free()) return false;

  if (computed) {
    Seq& ns = seqs_[seq];
    for (int32_t b : computed->blocks) pool_.Touch(b);
    ns.blocks = computed->blocks;
    ns.hashes = computed->hashes;
    queries_ += computed->num_query_tokens;
    hits_ += computed->num_tokens;
    it = seqs_.find(seq);
  }
  Seq& t = it->second;
  if (cow) {
    const int32_t src = t.blocks[first];
    std::vector<int32_t> fresh;
    pool_.AllocateInto(1, &fresh);
    pool_.Release({src});
    t.blocks[first] = fresh[0];
    copies->push_back({src, fresh[0]});
  }
  PENG_CHECK(pool_.AllocateInto(need, &t.blocks));
  DebugCheck();
  return true;
}

void KvCacheManager::CacheFullBlocks(int64_t seq, std::span<const int32_t> tokens,
                                     int64_t num_computed_tokens) {
  if (!prefix_caching_) return;
  Seq& s = seqs_.at(seq);
  const int64_t full = std::min<int64_t>(num_computed_tokens / block_size_,
                                         static_cast<int64_t>(s.blocks.size()));
  for (int64_t i = static_cast<int64_t>(s.hashes.size()); i < full; ++i) {
    const uint64_t parent = i ? s.hashes[i - 1] : 0;
    auto block_tokens = tokens.subspan(i * block_size_, block_size_);
    const uint64_t h = pool_.HashBlock(parent, block_tokens);
    pool_.Cache(s.blocks[i], h, parent, block_tokens);
    s.hashes.push_back(h);
  }
  DebugCheck();
}

void KvCacheManager::Fork(int64_t parent, int64_t child) {
  PENG_CHECK(!seqs_.count(child));
  const Seq& p = seqs_.at(parent);
  for (int32_t b : p.blocks) pool_.Retain(b);
  seqs_[child] = seqs_.at(parent);
  DebugCheck();
}

void KvCacheManager::Free(int64_t seq) {
  auto it = seqs_.find(seq);
  if (it == seqs_.end()) return;
  std::vector<int32_t>& b = it->second.blocks;
  std::reverse(b.begin(), b.end());  // the tail of the sequence is evicted first
  pool_.Release(b);
  seqs_.erase(it);
  DebugCheck();
}

void KvCacheManager::CheckInvariants() const {
  pool_.CheckInvariants();
  std::vector<int> refs(pool_.num_blocks(), 0);
  for (const auto& [id, s] : seqs_) {
    PENG_CHECK_MSG(s.hashes.size() <= s.blocks.size(), "more hashes than blocks");
    for (int32_t b : s.blocks) ++refs[b];
  }
  for (int64_t b = 0; b < pool_.num_blocks(); ++b)
    PENG_CHECK_MSG(refs[b] == pool_.ref_count(static_cast<int32_t>(b)),
                   "ref count differs from the number of block tables holding the block");
}

void KvCacheManager::DebugCheck() const {
#ifndef NDEBUG
  CheckInvariants();
#endif
}

}  // namespace peng
