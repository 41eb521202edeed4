// BlockPool: bookkeeping of the fixed-size blocks of a paged KV cache -- which physical block
// ids are free, how many block tables reference each used block, and which blocks hold a
// cached full block of tokens (automatic prefix caching). It holds no tensors.
//
// Free blocks sit on an O(1) doubly linked list in LRU eviction order: a block whose last
// reference is dropped goes to the tail, Allocate() takes from the head. A freed block that
// holds a cached full block keeps its cache entry while it waits on the free list, so a later
// request with the same prefix can take it back (Touch); the entry is dropped only when the
// block is handed out again (evicted). "No free block" is a normal outcome (nullopt / false,
// nothing changed), not an error: the scheduler reacts by preempting.
//
// Cached blocks are keyed by a hash chain: hash(block i) = xxHash64 of block i's token ids,
// seeded with hash(block i - 1) (0 for the first block). A hit is re-checked against the
// parent hash and token ids stored with the block, so a 64-bit collision is a miss, not
// wrong output.
//
// Not thread-safe; owned by the engine thread.
#pragma once

#include <cstdint>
#include <initializer_list>
#include <optional>
#include <span>
#include <unordered_map>
#include <vector>

namespace peng {

class BlockPool {
 public:
  using HashFn = uint64_t (*)(uint64_t parent_hash, std::span<const int32_t> tokens);

  explicit BlockPool(int64_t num_blocks);

  int64_t num_blocks() const { return static_cast<int64_t>(blocks_.size()); }
  int64_t num_free() const { return num_free_; }  // includes cached blocks waiting for reuse
  int64_t num_used() const { return num_blocks() - num_free_; }
  int64_t num_cached() const { return static_cast<int64_t>(cached_.size()); }

  // n blocks from the head of the free list (ref count 1 each), evicting their cache entries;
  // nullopt (and nothing taken) if fewer are free.
  std::optional<std::vector<int32_t>> Allocate(int64_t n);
  // Appends n fresh blocks to *out; false (nothing changed) if fewer are free.
  bool AllocateInto(int64_t n, std::vector<int32_t>* out);
  // Adds a reference to a block; a free (cached) block leaves the free list.
  void Touch(int32_t block);
  // Adds a reference to a used block (sharing, e.g. n > 1).
  void Retain(int32_t block);
  // Drops one reference to each block, in the given order; blocks reaching zero go to the
  // tail of the free list (still cached if they were).
  void Release(std::span<const int32_t> blocks);
  void Release(std::initializer_list<int32_t> blocks) { Release({blocks.begin(), blocks.size()}); }
  int ref_count(int32_t block) const { return blocks_[block].ref; }
  bool is_free(int32_t block) const { return blocks_[block].ref == 0; }

  // Prefix cache. The hash of a full block whose parent has hash `parent_hash`.
  uint64_t HashBlock(uint64_t parent_hash, std::span<const int32_t> tokens) const {
    return hash_fn_(parent_hash, tokens);
  }
  // The block caching exactly these tokens after this parent, if any.
  std::optional<int32_t> Lookup(uint64_t hash, uint64_t parent_hash,
                                std::span<const int32_t> tokens) const;
  // Records `block` (in use, full) as holding `tokens`; no-op if the hash is already taken
  // (same content cached twice, or a collision) or the block is already cached.
  void Cache(int32_t block, uint64_t hash, uint64_t parent_hash, std::span<const int32_t> tokens);
  bool is_cached(int32_t block) const { return blocks_[block].cached; }

  // Free list from head (next to be allocated) to tail, for tests.
  std::vector<int32_t> FreeListForTesting() const;
  // Replaces the hash function (e.g. a constant, to force collisions).
  void SetHashFnForTesting(HashFn fn) { hash_fn_ = fn; }

  // Aborts if an invariant is broken: free list consistent with ref counts (every block free
  // xor referenced), cache map consistent with per-block cache entries.
  void CheckInvariants() const;

  static uint64_t XxHash(uint64_t parent_hash, std::span<const int32_t> tokens);

 private:
  static constexpr int32_t kNone = -1;
  struct Block {
    int ref = 0;
    int32_t prev = kNone, next = kNone;  // free list links (valid while ref == 0)
    bool cached = false;
    uint64_t hash = 0, parent_hash = 0;
    std::vector<int32_t> tokens;  // content when cached, for the re-check
  };

  void PushTail(int32_t b);
  void Unlink(int32_t b);
  void Evict(int32_t b);

  std::vector<Block> blocks_;
  int32_t head_ = kNone, tail_ = kNone;
  int64_t num_free_ = 0;
  std::unordered_map<uint64_t, int32_t> cached_;  // hash -> block
  HashFn hash_fn_ = &XxHash;
};

}  // namespace peng
