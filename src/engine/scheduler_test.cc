#include "engine/scheduler.h"

#include <gtest/gtest.h>

#include <numeric>
#include <string>

namespace peng {
namespace {

using Ids = std::vector<int32_t>;

Sequence MakeSeq(int64_t id, int n_tokens, int32_t first_token = 0) {
  Sequence s;
  s.id = id;
  s.tokens.resize(n_tokens);
  std::iota(s.tokens.begin(), s.tokens.end(), first_token);
  s.num_prompt_tokens = n_tokens;
  return s;
}

// "A:6 B:4" -- which sequences run this step and how many tokens each.
std::string Plan(const SchedulerOutput& out) {
  std::string s;
  for (const ScheduledSeq& x : out.scheduled) {
    if (!s.empty()) s += ' ';
    s += static_cast<char>('A' + x.seq->id) + (":" + std::to_string(x.num_new_tokens));
  }
  return s;
}

// Ends a step: advances the computed tokens and appends a sampled token to every sequence
// that reached the end of its tokens.
void Step(Scheduler& sched) {
  sched.OnStepDone();
  for (Sequence* s : sched.running())
    if (s->num_computed_tokens == s->num_tokens()) s->tokens.push_back(1000);
}

TEST(SchedulerTest, BudgetSplitsBetweenPromptsAndDecodes) {
  KvCacheManager kv(16, 4, true);
  Scheduler sched({.max_num_batched_tokens = 10, .max_num_seqs = 4}, &kv);
  Sequence a = MakeSeq(0, 6), b = MakeSeq(1, 7, 100), c = MakeSeq(2, 3, 200);
  sched.Add(&a);
  sched.Add(&b);
  sched.Add(&c);
  EXPECT_EQ(Plan(sched.Schedule()), "A:6 B:4");
  EXPECT_EQ(kv.block_table(0), (Ids{0, 1}));
  EXPECT_EQ(kv.block_table(1), (Ids{2}));
  EXPECT_EQ(sched.num_waiting(), 1);
  Step(sched);
  // A decodes one token, B finishes its prompt, C gets the rest of the budget.
  EXPECT_EQ(Plan(sched.Schedule()), "A:1 B:3 C:3");
  EXPECT_EQ(kv.block_table(1), (Ids{2, 3}));
  EXPECT_EQ(kv.block_table(2), (Ids{4}));
  Step(sched);
  EXPECT_EQ(Plan(sched.Schedule()), "A:1 B:1 C:1");
  EXPECT_EQ(sched.Schedule().num_tokens, 3);
}

TEST(SchedulerTest, MaxNumSeqsLimitsAdmission) {
  KvCacheManager kv(16, 4, true);
  Scheduler sched({.max_num_batched_tokens = 100, .max_num_seqs = 2}, &kv);
  Sequence a = MakeSeq(0, 2), b = MakeSeq(1, 2, 10), c = MakeSeq(2, 2, 20);
  sched.Add(&a);
  sched.Add(&b);
  sched.Add(&c);
  EXPECT_EQ(Plan(sched.Schedule()), "A:2 B:2");
  Step(sched);
  sched.Finish(&a);
  EXPECT_EQ(Plan(sched.Schedule()), "B:1 C:2");
}

TEST(SchedulerTest, ChunkedPrefillAcrossSteps) {
  KvCacheManager kv(16, 4, true);
  Scheduler sched({.max_num_batched_tokens = 4, .max_num_seqs = 4}, &kv);
  Sequence a = MakeSeq(0, 10);
  sched.Add(&a);
  EXPECT_EQ(Plan(sched.Schedule()), "A:4");
  Step(sched);
  EXPECT_EQ(a.num_computed_tokens, 4);
  EXPECT_EQ(Plan(sched.Schedule()), "A:4");
  Step(sched);
  EXPECT_EQ(Plan(sched.Schedule()), "A:2");
  EXPECT_EQ(kv.block_table(0), (Ids{0, 1, 2}));
  Step(sched);
  EXPECT_EQ(a.num_tokens(), 11);  // sampled after the last chunk
  EXPECT_EQ(Plan(sched.Schedule()), "A:1");
}

TEST(SchedulerTest, PreemptsNewestAndResumesWithPrefixCache) {
  KvCacheManager kv(4, 4, true);
  Scheduler sched({.max_num_batched_tokens = 64, .max_num_seqs = 4}, &kv);
  Sequence a = MakeSeq(0, 7), b = MakeSeq(1, 7, 100);
  sched.Add(&a);
  sched.Add(&b);
  EXPECT_EQ(Plan(sched.Schedule()), "A:7 B:7");
  Step(sched);
  EXPECT_EQ(Plan(sched.Schedule()), "A:1 B:1");  // slot 7 is in each one's second block
  Step(sched);
  // Both need a third block; one is free after preempting B, the newest.
  const SchedulerOutput& out = sched.Schedule();
  EXPECT_EQ(Plan(out), "A:1");
  ASSERT_EQ(out.preempted.size(), 1u);
  EXPECT_EQ(out.preempted[0], &b);
  EXPECT_EQ(kv.block_table(0), (Ids{0, 1, 3}));
  EXPECT_EQ(b.num_computed_tokens, 0);
  EXPECT_EQ(sched.num_waiting(), 1);
  EXPECT_EQ(sched.num_preemptions_total(), 1);
  Step(sched);
  // B's first block is still cached, but B needs two more and only block 2 is free.
  EXPECT_EQ(Plan(sched.Schedule()), "A:1");
  Step(sched);
  sched.Finish(&a);
  EXPECT_EQ(kv.num_used_blocks(), 0);
  // B resumes after its cached first block: 9 tokens, 4 cached, 5 recomputed.
  EXPECT_EQ(Plan(sched.Schedule()), "B:5");
  EXPECT_EQ(b.num_computed_tokens, 4);
  EXPECT_EQ(kv.block_table(1), (Ids{2, 3, 1}));
  EXPECT_EQ(kv.prefix_cache_hits(), 4);
  Step(sched);
  EXPECT_EQ(b.num_tokens(), 10);
  EXPECT_EQ(Plan(sched.Schedule()), "B:1");
}

TEST(SchedulerTest, AbortFreesBlocksAtOnce) {
  KvCacheManager kv(8, 4, true);
  Scheduler sched({.max_num_batched_tokens = 64, .max_num_seqs = 1}, &kv);
  Sequence a = MakeSeq(0, 9), b = MakeSeq(1, 3, 50);
  sched.Add(&a);
  sched.Add(&b);
  EXPECT_EQ(Plan(sched.Schedule()), "A:9");
  EXPECT_EQ(kv.num_used_blocks(), 3);
  sched.Finish(&b);  // waiting: nothing to free
  sched.Finish(&a);
  EXPECT_EQ(kv.num_used_blocks(), 0);
  EXPECT_TRUE(sched.empty());
  EXPECT_EQ(Plan(sched.Schedule()), "");
}

TEST(SchedulerTest, PrefixCacheHitSkipsComputedTokens) {
  KvCacheManager kv(16, 4, true);
  Scheduler sched({.max_num_batched_tokens = 64, .max_num_seqs = 4}, &kv);
  Sequence a = MakeSeq(0, 10), b = MakeSeq(1, 10);
  sched.Add(&a);
  EXPECT_EQ(Plan(sched.Schedule()), "A:10");
  Step(sched);
  sched.Finish(&a);
  sched.Add(&b);
  EXPECT_EQ(Plan(sched.Schedule()), "B:2");
  EXPECT_EQ(b.num_computed_tokens, 8);
  EXPECT_EQ(kv.block_table(1), (Ids{0, 1, 3}));
  EXPECT_EQ(kv.prefix_cache_queries(), 20);
  EXPECT_EQ(kv.prefix_cache_hits(), 8);
}

TEST(SchedulerTest, SequenceLargerThanThePoolIsRejected) {
  KvCacheManager kv(2, 4, true);
  Scheduler sched({.max_num_batched_tokens = 64, .max_num_seqs = 4}, &kv);
  Sequence big = MakeSeq(0, 9), a = MakeSeq(1, 8, 20);
  sched.Add(&big);
  sched.Add(&a);
  const SchedulerOutput& out = sched.Schedule();
  EXPECT_EQ(Plan(out), "B:8");
  EXPECT_EQ(out.too_long, std::vector<Sequence*>{&big});
  Step(sched);  // a now has 9 tokens: it outgrows the pool while running alone
  const SchedulerOutput& out2 = sched.Schedule();
  EXPECT_EQ(Plan(out2), "");
  EXPECT_EQ(out2.too_long, std::vector<Sequence*>{&a});
  EXPECT_EQ(kv.num_used_blocks(), 0);
  EXPECT_TRUE(sched.empty());
}

}  // namespace
}  // namespace peng
