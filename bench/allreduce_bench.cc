// All-reduce latency and bandwidth of the job's Communicator (run under mpirun; alone it
// measures the single-process no-op): for each message size, the median of `reps` timed
// all-reduces of FP32 values after a barrier, on rank 0. Sizes are given in tokens x hidden
// size, the shape of tensor parallelism's all-reduces (one after attention, one after the MLP).
//   mpirun -np 2 build/bench/allreduce_bench [hidden=896] [reps=200]
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <vector>

#include "parallel/communicator.h"

int main(int argc, char** argv) {
  const int64_t hidden = argc > 1 ? std::atoll(argv[1]) : 896;
  const int reps = argc > 2 ? std::atoi(argv[2]) : 200;
  peng::StatusOr<peng::Communicator*> world = peng::WorldComm();
  if (!world.ok()) {
    std::fprintf(stderr, "%s\n", world.status().ToString().c_str());
    return 1;
  }
  peng::Communicator* c = *world;
  if (c->rank() == 0)
    std::printf("%s; hidden %lld\n%8s %12s %14s %12s\n", c->Describe().c_str(),
                static_cast<long long>(hidden), "tokens", "bytes", "median_us", "GB/s");
  for (int64_t tokens : {1, 2, 4, 8, 16, 32, 64, 128, 512}) {
    std::vector<float> x(tokens * hidden, 1.f);
    std::vector<double> us;
    for (int r = 0; r < reps + 10; ++r) {
      c->Barrier();
      const auto t0 = std::chrono::steady_clock::now();
      c->AllReduceSum(x.data(), static_cast<int64_t>(x.size()));
      const double t = std::chrono::duration<double, std::micro>(
                           std::chrono::steady_clock::now() - t0).count();
      if (r >= 10) us.push_back(t);
      std::fill(x.begin(), x.end(), 1.f);
    }
    std::sort(us.begin(), us.end());
    const double med = us[us.size() / 2];
    const double bytes = static_cast<double>(x.size()) * sizeof(float);
    if (c->rank() == 0)
      std::printf("%8lld %12.0f %14.1f %12.2f\n", static_cast<long long>(tokens), bytes, med,
                  bytes / med / 1e3);
  }
  peng::FinalizeWorld();
  return 0;
}
