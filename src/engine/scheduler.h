// Scheduler: decides, once per engine step, which sequences run and how many of their tokens
// (vLLM v1 style). There are no prefill and decode phases: every sequence has
// num_computed_tokens catching up with its tokens (prompt + output so far), under a per-step
// token budget (max_num_batched_tokens) and at most max_num_seqs running.
//
//   1. Running sequences first, in admission order: each gets min(its uncomputed tokens,
//      budget left) -- a decode is 1 token, an unfinished prompt a chunk. When the KV pool
//      is short, the NEWEST running sequence is preempted (blocks freed, moved to the front
//      of the waiting queue, recomputed later) until the allocation fits.
//   2. Then FIFO admission from the waiting queue while budget, seats and blocks last
//      (not in a step that preempted). A new sequence starts after its cached prefix.
//
// A sequence that cannot fit even alone in the whole pool is put in `too_long` for the engine
// to finish; it is never rescheduled. The scheduler does not own sequences: the engine keeps
// them alive until it calls Finish(). Not thread-safe; owned by the engine thread.
#pragma once

#include <cstdint>
#include <deque>
#include <vector>

#include "kv/kv_cache_manager.h"

namespace peng {

struct Sequence {
  int64_t id = 0;                   // unique; the KV cache manager's sequence id
  std::vector<int32_t> tokens;      // prompt + output so far
  int64_t num_prompt_tokens = 0;
  int64_t num_computed_tokens = 0;  // tokens whose K/V are in the cache
  int64_t num_preemptions = 0;
  bool running = false;
  bool use_prefix_cache = true;     // false: computes every token (scoring: logits of each)

  int64_t num_tokens() const { return static_cast<int64_t>(tokens.size()); }
};

struct ScheduledSeq {
  Sequence* seq = nullptr;
  int64_t num_new_tokens = 0;  // tokens [num_computed_tokens, + num_new_tokens) run this step
};

struct SchedulerOutput {
  std::vector<ScheduledSeq> scheduled;  // in running order
  std::vector<BlockCopy> copies;        // copy-on-write to perform before the forward pass
  std::vector<Sequence*> preempted;     // this step
  std::vector<Sequence*> too_long;      // can never fit in the pool: finish them
  int64_t num_tokens = 0;               // sum of num_new_tokens
  void Clear();
};

struct SchedulerConfig {
  int64_t max_num_batched_tokens = 512;
  int max_num_seqs = 64;
};

class Scheduler {
 public:
  Scheduler(const SchedulerConfig& config, KvCacheManager* kv) : config_(config), kv_(kv) {}

  // Queues a new sequence at the back of the waiting queue.
  void Add(Sequence* seq);
  // Adds a sequence forked from a running one (its blocks already shared) as running.
  void AddRunning(Sequence* seq);
  // Plans one step. The result is valid until the next call.
  const SchedulerOutput& Schedule();
  // After the forward pass: advances num_computed_tokens of the scheduled sequences and
  // caches their newly filled blocks. Call before appending sampled tokens.
  void OnStepDone();
  // Removes a finished or aborted sequence and frees its blocks at once.
  void Finish(Sequence* seq);

  int64_t num_running() const { return static_cast<int64_t>(running_.size()); }
  int64_t num_waiting() const { return static_cast<int64_t>(waiting_.size()); }
  bool empty() const { return running_.empty() && waiting_.empty(); }
  int64_t num_preemptions_total() const { return preemptions_; }
  const std::vector<Sequence*>& running() const { return running_; }

 private:
  void Preempt(Sequence* seq);
  bool FitsInPool(const Sequence* seq) const;

  SchedulerConfig config_;
  KvCacheManager* kv_;
  std::vector<Sequence*> running_;  // admission order; the newest last
  std::deque<Sequence*> waiting_;
  SchedulerOutput out_;
  int64_t preemptions_ = 0;
};

}  // namespace peng
