#include "benchclient/runner.h"

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <mutex>
#include <thread>

#include "benchclient/workload.h"

namespace peng::benchclient {
namespace {

using Clock = std::chrono::steady_clock;

// Indices of requests whose send time has come; Pop() returns -1 once closed and drained.
class ReadyQueue {
 public:
  void Push(int i) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      q_.push_back(i);
    }
    cv_.notify_one();
  }
  void Close() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      closed_ = true;
    }
    cv_.notify_all();
  }
  int Pop() {
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait(lock, [&] { return closed_ || !q_.empty(); });
    if (q_.empty()) return -1;
    const int i = q_.front();
    q_.pop_front();
    return i;
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<int> q_;
  bool closed_ = false;
};

}  // namespace

BenchRun RunBenchmark(const BenchConfig& config, const std::function<void(int, int)>& on_done) {
  const int n = config.num_prompts;
  const std::vector<std::string> prompts = MakePrompts(n, config.input_len, config.seed);
  const std::vector<double> arrivals = ArrivalOffsets(n, config.request_rate, config.seed);
  BenchRun run;
  run.results.resize(n);
  run.num_workers = std::min(n, config.max_concurrency > 0 ? config.max_concurrency : kMaxWorkers);

  ReadyQueue ready;
  std::mutex done_mu;
  int done = 0;
  const Clock::time_point start = Clock::now();
  std::vector<std::thread> workers;
  for (int w = 0; w < run.num_workers; ++w) {
    workers.emplace_back([&] {
      auto client = OpenAiClient::Create(config.client);
      for (int i; (i = ready.Pop()) >= 0;) {
        RequestResult& r = run.results[i];
        const double sent_s = std::chrono::duration<double>(Clock::now() - start).count();
        if (client.ok()) {
          r = (*client)->Stream(prompts[i], config.output_len);
        } else {
          r.error = client.status().ToString();
        }
        r.start_s = sent_s;
        std::lock_guard<std::mutex> lock(done_mu);
        ++done;
        if (on_done) on_done(done, n);
      }
    });
  }
  for (int i = 0; i < n; ++i) {
    std::this_thread::sleep_until(start + std::chrono::duration_cast<Clock::duration>(
                                              std::chrono::duration<double>(arrivals[i])));
    ready.Push(i);
  }
  ready.Close();
  for (std::thread& t : workers) t.join();
  run.duration_s = std::chrono::duration<double>(Clock::now() - start).count();
  return run;
}

}  // namespace peng::benchclient
