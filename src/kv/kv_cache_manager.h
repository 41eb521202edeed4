// KvCacheManager: hands KV blocks to sequences (vLLM v1 style). Each sequence, named by an
// integer id chosen by the caller, owns a block table (logical block -> physical block id) and
// the hash chain of its full blocks. The scheduler asks for slots before every step; the
// manager answers with blocks or with "no" (nothing changed), and the scheduler preempts.
//
//   GetComputedBlocks(tokens)  the longest cached prefix of a new sequence (whole blocks,
//                              never all of its tokens: the last one must be computed)
//   AllocateSlots(...)         room for num_new_tokens more tokens (taking the cached prefix
//                              on admission); copy-on-write of a shared last block
//   CacheFullBlocks(...)       after a step: record newly filled (computed) blocks
//   Fork(parent, child)        n > 1: the child shares every block of the parent
//   Free(seq)                  blocks go back tail first, so a sequence's end is evicted first
//
// Copy-on-write: a block referenced by several tables is never written. When a sequence is
// about to write into such a block (the partially filled last block shared after a Fork), the
// manager gives it a fresh block and returns the copy (src, dst) that the caller must perform
// on the KV tensors before the forward pass. Not thread-safe; owned by the engine thread.
#pragma once

#include <cstdint>
#include <span>
#include <unordered_map>
#include <vector>

#include "kv/block_pool.h"

namespace peng {

struct BlockCopy {
  int32_t src = 0;
  int32_t dst = 0;
  bool operator==(const BlockCopy&) const = default;
};

// A cached prefix found for a new sequence.
struct ComputedBlocks {
  std::vector<int32_t> blocks;
  std::vector<uint64_t> hashes;
  int64_t num_tokens = 0;        // blocks.size() * block_size
  int64_t num_query_tokens = 0;  // tokens looked up (for the hit-rate counters)
};

class KvCacheManager {
 public:
  KvCacheManager(int64_t num_blocks, int block_size, bool enable_prefix_caching);

  int block_size() const { return block_size_; }
  int64_t num_blocks() const { return pool_.num_blocks(); }
  int64_t num_used_blocks() const { return pool_.num_used(); }
  int64_t num_free_blocks() const { return pool_.num_free(); }
  double usage() const;
  int64_t prefix_cache_queries() const { return queries_; }  // tokens looked up
  int64_t prefix_cache_hits() const { return hits_; }        // tokens found
  BlockPool& pool() { return pool_; }

  ComputedBlocks GetComputedBlocks(std::span<const int32_t> tokens) const;

  // Makes room for tokens [num_computed_tokens, num_computed_tokens + num_new_tokens) of
  // `seq`. On admission pass the sequence's ComputedBlocks (num_computed_tokens must then be
  // computed->num_tokens); it creates the sequence. Appends copy-on-write copies to *copies.
  // False, with nothing changed, if the pool is short.
  bool AllocateSlots(int64_t seq, int64_t num_computed_tokens, int64_t num_new_tokens,
                     const ComputedBlocks* computed, std::vector<BlockCopy>* copies);
  // Caches the full blocks among the first `num_computed_tokens` of `tokens` (the sequence's
  // tokens so far) that are not cached yet.
  void CacheFullBlocks(int64_t seq, std::span<const int32_t> tokens, int64_t num_computed_tokens);
  void Fork(int64_t parent, int64_t child);
  void Free(int64_t seq);

  bool has_seq(int64_t seq) const { return seqs_.count(seq) != 0; }
  const std::vector<int32_t>& block_table(int64_t seq) const { return seqs_.at(seq).blocks; }
  int64_t num_seqs() const { return static_cast<int64_t>(seqs_.size()); }

  // Pool invariants, plus: every ref count equals the number of block tables holding the
  // block. Aborts if broken. Called after every change in debug builds.
  void CheckInvariants() const;

 private:
  struct Seq {
    std::vector<int32_t> blocks;
    std::vector<uint64_t> hashes;  // of blocks[0 .. hashes.size()), all full
  };
  void DebugCheck() const;

  BlockPool pool_;
  int block_size_;
  bool prefix_caching_;
  std::unordered_map<int64_t, Seq> seqs_;
  int64_t queries_ = 0, hits_ = 0;
};

}  // namespace peng
