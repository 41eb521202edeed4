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

}  // namespace
}  // namespace peng
