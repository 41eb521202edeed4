// PipelineStage::Plan: which layers each stage runs, and the error for more stages than layers.
// (The stages' sends, and a split model's logits against one process, run under mpirun:
// tests/parallel/tensor_parallel_test.cc, pipeline_parallel_test_np2 and tp2_pp2_test_np4.)
#include "model/layers/pipeline.h"

#include <gtest/gtest.h>

#include <utility>
#include <vector>

namespace peng {
namespace {

// A communicator that only says where this rank is (Plan reads nothing else).
class Place final : public Communicator {
 public:
  Place(int rank, int size) : rank_(rank), size_(size) {}
  int rank() const override { return rank_; }
  int size() const override { return size_; }
  void AllReduceSum(float*, int64_t) override {}
  void ReduceScatterSum(const float*, float*, int64_t) override {}
  void AllGather(const void*, int64_t, void*) override {}
  void Gather(const void*, int64_t, void*, int) override {}
  void Broadcast(void*, int64_t, int) override {}
  void BroadcastPolled(void*, int64_t, int) override {}
  void AllToAll(const void*, int64_t, void*) override {}
  void AllToAllV(const void*, const int64_t*, void*, const int64_t*) override {}
  void Barrier() override {}
  [[noreturn]] void Abort(const std::string& message) override { std::abort(); }
  std::unique_ptr<Communicator> Split(int, int) override { return nullptr; }
  std::string Describe() const override { return "place"; }

 private:
  int rank_, size_;
};

std::vector<std::pair<int, int>> Ranges(int n_layers, int n_stages) {
  std::vector<std::pair<int, int>> out;
  for (int s = 0; s < n_stages; ++s) {
    Place place(s, n_stages);
    PipelineStage stage;
    EXPECT_TRUE(stage.Plan(n_layers, &place, "m").ok());
    EXPECT_EQ(stage.first(), s == 0);
    EXPECT_EQ(stage.last(), s == n_stages - 1);
    out.emplace_back(stage.begin(), stage.end());
  }
  return out;
}

TEST(PipelineStageTest, ContiguousLayersTheFirstStagesOneMore) {
  using R = std::vector<std::pair<int, int>>;
  EXPECT_EQ(Ranges(27, 4), (R{{0, 7}, {7, 14}, {14, 21}, {21, 27}}));  // DeepSeek-V2-Lite
  EXPECT_EQ(Ranges(24, 2), (R{{0, 12}, {12, 24}}));
  EXPECT_EQ(Ranges(3, 3), (R{{0, 1}, {1, 2}, {2, 3}}));
  EXPECT_EQ(Ranges(30, 4), (R{{0, 8}, {8, 16}, {16, 23}, {23, 30}}));
}

TEST(PipelineStageTest, AloneItRunsEveryLayer) {
  PipelineStage stage;
  ASSERT_TRUE(stage.Plan(5, nullptr, "m").ok());
  EXPECT_FALSE(stage.split());
  EXPECT_TRUE(stage.first() && stage.last());
  EXPECT_EQ(stage.begin(), 0);
  EXPECT_EQ(stage.end(), 5);
  Place one(0, 1);
  ASSERT_TRUE(stage.Plan(5, &one, "m").ok());
  EXPECT_FALSE(stage.split());
  EXPECT_EQ(stage.end(), 5);
}

TEST(PipelineStageTest, MoreStagesThanLayersIsAClearError) {
  Place place(1, 3);
  PipelineStage stage;
  const Status st = stage.Plan(2, &place, "tiny.gguf");
  ASSERT_FALSE(st.ok());
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(st.message(), "tiny.gguf: 2 layers cannot be split over pipeline parallel size 3");
}

// A step of a 40-token prompt chunk, a decode and a 20-token chunk with prompt logits, at 2
// stages (4 micro-batches at most, of 16 tokens at least: 61 / 16 = 3): three token ranges,
// the long prompt cut in two (its row in the second), the rows in the step's order.
TEST(PipelineStageTest, MicroBatchesCutTheStepsTokensInOrder) {
  Place place(0, 2);
  PipelineStage stage;
  ASSERT_TRUE(stage.Plan(4, &place, "m").ok());
  EXPECT_EQ(stage.max_micro_batches(), 4);
  const int32_t table[8] = {0, 1, 2, 3, 4, 5, 6, 7};
  ForwardBatch b;
  for (int i = 0; i < 61; ++i) b.tokens.push_back(100 + i);
  b.seqs.push_back({.n_tokens = 40, .pos0 = 0, .block_table = table, .n_blocks = 3});
  b.seqs.push_back({.n_tokens = 1, .pos0 = 10, .block_table = table + 3, .n_blocks = 1});
  b.seqs.push_back({.n_tokens = 20, .pos0 = 5, .block_table = table + 4, .n_blocks = 2,
                    .all_logits = true});
  std::vector<ForwardBatch> mbs;
  ASSERT_EQ(stage.MicroBatches(b, stage.max_micro_batches(), &mbs), 3);
  ASSERT_EQ(mbs.size(), 3u);
  struct Part {
    int64_t n, pos0;
    const int32_t* table;
    bool want, all;
    bool operator==(const Part&) const = default;
  };
  auto parts = [](const ForwardBatch& mb) {
    std::vector<Part> out;
    for (const SeqBatchEntry& e : mb.seqs)
      out.push_back({e.n_tokens, e.pos0, e.block_table, e.want_logits, e.all_logits});
    return out;
  };
  EXPECT_EQ(parts(mbs[0]), (std::vector<Part>{{20, 0, table, false, false}}));
  EXPECT_EQ(parts(mbs[1]), (std::vector<Part>{{20, 20, table, true, false}}));
  EXPECT_EQ(parts(mbs[2]), (std::vector<Part>{{1, 10, table + 3, true, false},
                                              {20, 5, table + 4, true, true}}));
  std::vector<int32_t> tokens;
  int64_t rows = 0;
  for (const ForwardBatch& mb : mbs) {
    tokens.insert(tokens.end(), mb.tokens.begin(), mb.tokens.end());
    rows += mb.NumLogitRows();
  }
  EXPECT_EQ(tokens, b.tokens);
  EXPECT_EQ(rows, b.NumLogitRows());
  // A second step into the same vectors: two micro-batches, nothing left of the first step's.
  b.tokens.resize(32);
  b.seqs = {{.n_tokens = 32, .pos0 = 0, .block_table = table, .n_blocks = 2}};
  ASSERT_EQ(stage.MicroBatches(b, 4, &mbs), 2);
  ASSERT_EQ(mbs.size(), 2u);
  EXPECT_EQ(parts(mbs[0]), (std::vector<Part>{{16, 0, table, false, false}}));
  EXPECT_EQ(parts(mbs[1]), (std::vector<Part>{{16, 16, table, true, false}}));
  EXPECT_EQ(mbs[1].tokens, std::vector<int32_t>(b.tokens.begin() + 16, b.tokens.end()));
  EXPECT_EQ(stage.MicroBatches(b, 1, &mbs), 1);  // (experts across replicas: one pass)
  b.tokens.resize(31);  // under two micro-batches' worth: whole
  b.seqs[0].n_tokens = 31;
  EXPECT_EQ(stage.MicroBatches(b, 4, &mbs), 1);
}

}  // namespace
}  // namespace peng
