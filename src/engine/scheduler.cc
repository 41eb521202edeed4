#include "engine/scheduler.h"

#include <algorithm>

#include "core/check.h"

namespace peng {

void SchedulerOutput::Clear() {
  scheduled.clear();
  copies.clear();
  preempted.clear();
  too_long.clear();
  num_tokens = 0;
}

void Scheduler::Add(Sequence* seq) { waiting_.push_back(seq); }

void Scheduler::AddRunning(Sequence* seq) {
  PENG_CHECK(kv_->has_seq(seq->id));
  seq->running = true;
  running_.push_back(seq);
}

bool Scheduler::FitsInPool(const Sequence* seq) const {
  const int64_t bs = kv_->block_size();
  return (seq->num_tokens() + bs - 1) / bs <= kv_->num_blocks();
}

const SchedulerOutput& Scheduler::Schedule() {
  out_.Clear();
  int64_t budget = config_.max_num_batched_tokens;
  // 1. Running sequences: decodes and unfinished prompt chunks.
  for (size_t i = 0; i < running_.size() && budget > 0;) {
    Sequence* s = running_[i];
    const int64_t n = std::min(s->num_tokens() - s->num_computed_tokens, budget);
    bool fits = true;
    while (n > 0 && !(fits = kv_->AllocateSlots(s->id, s->num_computed_tokens, n, nullptr,
                                                &out_.copies))) {
      Sequence* victim = running_.back();
      if (victim == s && running_.size() == 1) {  // alone and still too big: never fits
        Finish(s);
        out_.too_long.push_back(s);
        break;
      }
      Preempt(victim);
      if (victim == s) break;
    }
    if (!fits) break;  // s left the running list, and so did everything after it
    if (n > 0) out_.scheduled.push_back({s, n});
    budget -= n;
    ++i;
  }
  // 2. Waiting sequences, first come first served, starting after their cached prefix.
  while (out_.preempted.empty() && !waiting_.empty() && budget > 0 &&
         static_cast<int64_t>(running_.size()) < config_.max_num_seqs) {
    Sequence* s = waiting_.front();
    if (!FitsInPool(s)) {
      waiting_.pop_front();
      out_.too_long.push_back(s);
      continue;
    }
    ComputedBlocks cached =
        s->use_prefix_cache ? kv_->GetComputedBlocks(s->tokens) : ComputedBlocks{};
    const int64_t n = std::min(s->num_tokens() - cached.num_tokens, budget);
    if (!kv_->AllocateSlots(s->id, cached.num_tokens, n, &cached, &out_.copies)) break;
    waiting_.pop_front();
    s->num_computed_tokens = cached.num_tokens;
    s->running = true;
    running_.push_back(s);
    out_.scheduled.push_back({s, n});
    budget -= n;
  }
  out_.num_tokens = config_.max_num_batched_tokens - budget;
  return out_;
}

void Scheduler::OnStepDone() {
  for (const ScheduledSeq& s : out_.scheduled) {
    s.seq->num_computed_tokens += s.num_new_tokens;
    kv_->CacheFullBlocks(s.seq->id, s.seq->tokens, s.seq->num_computed_tokens);
  }
}

void Scheduler::Preempt(Sequence* seq) {
  PENG_CHECK(running_.back() == seq);
  running_.pop_back();
  kv_->Free(seq->id);
  seq->running = false;
  seq->num_computed_tokens = 0;
  ++seq->num_preemptions;
  ++preemptions_;
  waiting_.push_front(seq);
  out_.preempted.push_back(seq);
}

void Scheduler::Finish(Sequence* seq) {
  if (seq->running) {
    running_.erase(std::find(running_.begin(), running_.end(), seq));
  } else if (auto it = std::find(waiting_.begin(), waiting_.end(), seq); it != waiting_.end()) {
    waiting_.erase(it);
  }
  seq->running = false;
  kv_->Free(seq->id);
}

}  // namespace peng
