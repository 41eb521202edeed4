// The Communicator's collectives with exact expected values, on every rank of an MPI job
// (ctest runs it under `mpirun -np 2` and `-np 4`; alone it checks the single-process one).
#include "parallel/communicator.h"
#include "world.h"

#include <gtest/gtest.h>

#include <chrono>
#include <cstdint>
#include <thread>
#include <numeric>
#include <vector>

namespace peng {
namespace {

using test_util::World;

TEST(CommunicatorTest, AllReduceSumsEveryElement) {
  Communicator* c = World();
  const int n = c->size(), r = c->rank();
  std::vector<float> x(1000);
  for (int i = 0; i < 1000; ++i) x[i] = static_cast<float>(i * (r + 1));
  c->AllReduceSum(x.data(), 1000);
  const float ranks = static_cast<float>(n * (n + 1) / 2);  // sum of (r + 1)
  for (int i = 0; i < 1000; ++i) ASSERT_EQ(x[i], i * ranks) << i;
}

// Rank r contributes in[k * 5 + i] = (r + 1) * (100 k + i); rank k gets the sum over r of its
// block: (100 k + i) * n (n + 1) / 2.
TEST(CommunicatorTest, ReduceScatterGivesEachRankItsSummedBlock) {
  Communicator* c = World();
  const int n = c->size(), r = c->rank();
  std::vector<float> in(5 * n), out(5, -1.f);
  for (int k = 0; k < n; ++k)
    for (int i = 0; i < 5; ++i) in[k * 5 + i] = static_cast<float>((r + 1) * (100 * k + i));
  c->ReduceScatterSum(in.data(), out.data(), 5);
  const float ranks = static_cast<float>(n * (n + 1) / 2);
  for (int i = 0; i < 5; ++i) EXPECT_EQ(out[i], (100 * r + i) * ranks) << i;
}

TEST(CommunicatorTest, AllGatherOrdersByRank) {
  Communicator* c = World();
  const int n = c->size(), r = c->rank();
  const int32_t mine[3] = {r, 10 * r, 100 * r};
  std::vector<int32_t> all(3 * n, -1);
  c->AllGather(mine, sizeof mine, all.data());
  for (int k = 0; k < n; ++k) {
    EXPECT_EQ(all[3 * k], k);
    EXPECT_EQ(all[3 * k + 1], 10 * k);
    EXPECT_EQ(all[3 * k + 2], 100 * k);
  }
}

TEST(CommunicatorTest, GatherOnTheRootOnly) {
  Communicator* c = World();
  const int n = c->size(), r = c->rank();
  for (int root = 0; root < n; ++root) {
    const int32_t mine[2] = {r, -r};
    std::vector<int32_t> all(2 * n, 7);
    c->Gather(mine, sizeof mine, all.data(), root);
    for (int k = 0; k < n; ++k) {
      EXPECT_EQ(all[2 * k], r == root ? k : 7);
      EXPECT_EQ(all[2 * k + 1], r == root ? -k : 7);
    }
  }
}

TEST(CommunicatorTest, BroadcastFromEveryRoot) {
  Communicator* c = World();
  for (int root = 0; root < c->size(); ++root) {
    int64_t v[2] = {c->rank() == root ? 42 + root : -1, c->rank() == root ? -7 : 0};
    c->Broadcast(v, sizeof v, root);
    EXPECT_EQ(v[0], 42 + root);
    EXPECT_EQ(v[1], -7);
  }
}

TEST(CommunicatorTest, PolledBroadcastAfterADelay) {
  Communicator* c = World();
  for (int root = 0; root < c->size(); ++root) {
    if (c->rank() == root) std::this_thread::sleep_for(std::chrono::milliseconds(20));
    int64_t v = c->rank() == root ? 1000 + root : -1;
    c->BroadcastPolled(&v, sizeof v, root);  // the others poll, then sleep between polls
    EXPECT_EQ(v, 1000 + root);
  }
}

TEST(CommunicatorTest, AllToAllTransposes) {
  Communicator* c = World();
  const int n = c->size(), r = c->rank();
  std::vector<int32_t> in(n), out(n, -1);
  for (int k = 0; k < n; ++k) in[k] = 100 * r + k;  // to rank k
  c->AllToAll(in.data(), sizeof(int32_t), out.data());
  for (int k = 0; k < n; ++k) EXPECT_EQ(out[k], 100 * k + r);  // from rank k
}

// Rank r sends (r + k) % 3 values to rank k (none for some pairs), each 1000 r + 10 k + i.
TEST(CommunicatorTest, AllToAllVSendsEachPairItsOwnCount) {
  Communicator* c = World();
  const int n = c->size(), r = c->rank();
  auto count = [](int from, int to) { return (from + to) % 3; };
  std::vector<int32_t> in;
  std::vector<int64_t> send(n), recv(n);
  for (int k = 0; k < n; ++k) {
    for (int i = 0; i < count(r, k); ++i) in.push_back(1000 * r + 10 * k + i);
    send[k] = count(r, k) * int64_t{sizeof(int32_t)};
    recv[k] = count(k, r) * int64_t{sizeof(int32_t)};
  }
  std::vector<int32_t> out;
  for (int k = 0; k < n; ++k) out.resize(out.size() + count(k, r), -1);
  c->AllToAllV(in.data(), send.data(), out.data(), recv.data());
  size_t at = 0;
  for (int k = 0; k < n; ++k)
    for (int i = 0; i < count(k, r); ++i) EXPECT_EQ(out[at++], 1000 * k + 10 * r + i);
}

TEST(CommunicatorTest, SplitMakesTensorParallelGroups) {
  Communicator* c = World();
  if (c->size() % 2 != 0) GTEST_SKIP() << "needs an even number of ranks";
  // tp = 2 innermost: ranks {0, 1}, {2, 3}, ...
  std::unique_ptr<Communicator> tp = c->Split(c->rank() / 2, c->rank() % 2);
  EXPECT_EQ(tp->size(), 2);
  EXPECT_EQ(tp->rank(), c->rank() % 2);
  float x = static_cast<float>(c->rank());
  tp->AllReduceSum(&x, 1);
  EXPECT_EQ(x, static_cast<float>(2 * (c->rank() / 2) * 2 + 1));  // 2g + (2g + 1)
  c->Barrier();
}

}  // namespace
}  // namespace peng

int main(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);
  peng::World();
  if (peng::World()->rank() != 0) ::testing::GTEST_FLAG(output) = "";
  const int rc = RUN_ALL_TESTS();
  peng::FinalizeWorld();
  return rc;
}
