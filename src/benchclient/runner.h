// Runs the serving benchmark: sends `num_prompts` streaming requests at Poisson arrival times
// (at most `max_concurrency` in flight when it is > 0) and collects one RequestResult each.
// A dispatcher thread releases requests at their send times into a queue; a fixed set of
// worker threads, each with its own keep-alive connection, takes them from it.
#pragma once

#include <cstdint>
#include <functional>
#include <limits>
#include <vector>

#include "benchclient/openai_client.h"

namespace peng::benchclient {

struct BenchConfig {
  ClientOptions client;
  int num_prompts = 100;
  double request_rate = std::numeric_limits<double>::infinity();  // requests/s
  int max_concurrency = 0;                                        // 0: unlimited
  int input_len = 256;   // words per prompt, about one token each
  int output_len = 128;  // max_tokens
  uint64_t seed = 0;
};

struct BenchRun {
  std::vector<RequestResult> results;  // in prompt order
  double duration_s = 0;               // first send -> last response done
  int num_workers = 0;
};

// Most requests in flight when no --max-concurrency is given (one thread each).
inline constexpr int kMaxWorkers = 1024;

// `on_done(done, total)` is called from worker threads, serialized, after every request.
BenchRun RunBenchmark(const BenchConfig& config,
                      const std::function<void(int, int)>& on_done = nullptr);

}  // namespace peng::benchclient
