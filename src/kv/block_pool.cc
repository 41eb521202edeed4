#include "kv/block_pool.h"

#include <xxhash.h>

#include <algorithm>

#include "core/check.h"

namespace peng {

BlockPool::BlockPool(int64_t num_blocks) : blocks_(num_blocks) {
  for (int64_t i = 0; i < num_blocks; ++i) PushTail(static_cast<int32_t>(i));
}

uint64_t BlockPool::XxHash(uint64_t parent_hash, std::span<const int32_t> tokens) {
  return XXH64(tokens.data(), tokens.size_bytes(), parent_hash);
}

void BlockPool::PushTail(int32_t b) {
  Block& blk = blocks_[b];
  blk.prev = tail_;
  blk.next = kNone;
  (tail_ == kNone ? head_ : blocks_[tail_].next) = b;
  tail_ = b;
  ++num_free_;
}

void BlockPool::Unlink(int32_t b) {
  Block& blk = blocks_[b];
  (blk.prev == kNone ? head_ : blocks_[blk.prev].next) = blk.next;
  (blk.next == kNone ? tail_ : blocks_[blk.next].prev) = blk.prev;
  blk.prev = blk.next = kNone;
  --num_free_;
}

void BlockPool::Evict(int32_t b) {
  Block& blk = blocks_[b];
  if (!blk.cached) return;
  cached_.erase(blk.hash);
  blk.cached = false;
  blk.tokens.clear();
}

bool BlockPool::AllocateInto(int64_t n, std::vector<int32_t>* out) {
  if (n > num_free_) return false;
  for (int64_t i = 0; i < n; ++i) {
    const int32_t b = head_;
    Unlink(b);
    Evict(b);
    blocks_[b].ref = 1;
    out->push_back(b);
  }
  return true;
}

std::optional<std::vector<int32_t>> BlockPool::Allocate(int64_t n) {
  std::vector<int32_t> out;
  if (!AllocateInto(n, &out)) return std::nullopt;
  return out;
}

void BlockPool::Touch(int32_t b) {
  if (blocks_[b].ref++ == 0) Unlink(b);
}

void BlockPool::Retain(int32_t b) {
  PENG_CHECK(blocks_[b].ref > 0);
  ++blocks_[b].ref;
}

void BlockPool::Release(std::span<const int32_t> blocks) {
  for (int32_t b : blocks) {
    PENG_CHECK(blocks_[b].ref > 0);
    if (--blocks_[b].ref == 0) PushTail(b);
  }
}

std::optional<int32_t> BlockPool::Lookup(uint64_t hash, uint64_t parent_hash,
                                         std::span<const int32_t> tokens) const {
  auto it = cached_.find(hash);
  if (it == cached_.end()) return std::nullopt;
  const Block& blk = blocks_[it->second];
  if (blk.parent_hash != parent_hash || !std::ranges::equal(blk.tokens, tokens))
    return std::nullopt;  // hash collision
  return it->second;
}

void BlockPool::Cache(int32_t b, uint64_t hash, uint64_t parent_hash,
                      std::span<const int32_t> tokens) {
  Block& blk = blocks_[b];
  PENG_CHECK(blk.ref > 0);
  if (blk.cached || cached_.count(hash)) return;
  cached_.emplace(hash, b);
  blk.cached = true;
  blk.hash = hash;
  blk.parent_hash = parent_hash;
  blk.tokens.assign(tokens.begin(), tokens.end());
}

std::vector<int32_t> BlockPool::FreeListForTesting() const {
  std::vector<int32_t> out;
  for (int32_t b = head_; b != kNone; b = blocks_[b].next) out.push_back(b);
  return out;
}

void BlockPool::CheckInvariants() const {
  std::vector<char> on_list(blocks_.size(), 0);
  int64_t n = 0;
  int32_t prev = kNone;
  for (int32_t b = head_; b != kNone; prev = b, b = blocks_[b].next) {
    PENG_CHECK_MSG(!on_list[b], "block twice on the free list");
    PENG_CHECK_MSG(blocks_[b].prev == prev, "free list back link broken");
    on_list[b] = 1;
    ++n;
  }
  PENG_CHECK_MSG(prev == tail_ && n == num_free_, "free list tail or count wrong");
  for (size_t b = 0; b < blocks_.size(); ++b) {
    PENG_CHECK_MSG(on_list[b] == (blocks_[b].ref == 0), "block free xor referenced");
    PENG_CHECK_MSG(blocks_[b].ref >= 0, "negative ref count");
    if (blocks_[b].cached) {
      auto it = cached_.find(blocks_[b].hash);
      PENG_CHECK_MSG(it != cached_.end() && it->second == static_cast<int32_t>(b),
                     "cached block missing from the hash map");
    }
  }
  for (const auto& [hash, b] : cached_)
    PENG_CHECK_MSG(blocks_[b].cached && blocks_[b].hash == hash, "hash map entry stale");
}

}  // namespace peng
