// BlockPool: bookkeeping of the fixed-size blocks of a paged KV cache -- which physical block
// ids are free and how many sequences reference each used block. It holds no tensors. Free
// blocks are handed out in FIFO order of their release (least recently freed first), which is
// the eviction order prefix caching will use. "No free block" is a normal outcome (nullopt),
// not an error: the scheduler reacts by preempting. Not thread-safe; owned by the engine
// thread.
#pragma once

#include <cstdint>
#include <deque>
#include <optional>
#include <vector>

namespace peng {

class BlockPool {
 public:
  explicit BlockPool(int64_t num_blocks);

  int64_t num_blocks() const { return static_cast<int64_t>(ref_counts_.size()); }
  int64_t num_free() const { return static_cast<int64_t>(free_.size()); }
  int64_t num_used() const { return num_blocks() - num_free(); }

  // n fresh blocks (ref count 1 each), or nullopt (and nothing taken) if fewer are free.
  std::optional<std::vector<int32_t>> Allocate(int64_t n);
  // Adds a reference to a used block (sharing, e.g. prefix caching or n > 1).
  void Retain(int32_t block);
  // Drops one reference to each block; blocks reaching zero return to the free list in order.
  void Release(const std::vector<int32_t>& blocks);
  int ref_count(int32_t block) const { return ref_counts_[block]; }

  // Checks internal invariants (every block free xor referenced); aborts if broken.
  void CheckInvariants() const;

 private:
  std::vector<int> ref_counts_;
  std::deque<int32_t> free_;
};

// The blocks of one sequence, in logical order, and how many token slots they provide.
class BlockTable {
 public:
  const std::vector<int32_t>& blocks() const { return blocks_; }
  int64_t capacity_tokens(int block_size) const {
    return static_cast<int64_t>(blocks_.size()) * block_size;
  }
  // Grows the table so that it holds `n_tokens`; false (table unchanged) if the pool is full.
  bool EnsureCapacity(BlockPool* pool, int block_size, int64_t n_tokens);
  // Returns every block to the pool.
  void Clear(BlockPool* pool);

 private:
  std::vector<int32_t> blocks_;
};

}  // namespace peng
