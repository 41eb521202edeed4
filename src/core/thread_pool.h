// ThreadPool: a fork-join pool for compute kernels. The calling thread takes part as worker 0,
// so a pool of N threads starts N-1 OS threads. Run() blocks until every worker has finished
// its share; workers spin briefly between jobs (decode issues hundreds of small jobs per
// token) and then sleep. Run() must be called from one thread at a time (the engine thread);
// it is not re-entrant.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <mutex>
#include <thread>
#include <vector>

namespace peng {

class ThreadPool {
 public:
  // num_threads <= 0 means the number of physical cores.
  explicit ThreadPool(int num_threads = 0);
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  int num_threads() const { return num_threads_; }

  // Calls fn(thread_index, num_threads) on every worker and waits for all of them.
  template <typename Fn>
  void Run(Fn&& fn) {
    if (num_threads_ == 1) {
      fn(0, 1);
      return;
    }
    RunImpl(&Trampoline<Fn>, &fn);
  }

  // Splits [0, n) into contiguous chunks, one per worker: fn(begin, end).
  template <typename Fn>
  void ParallelFor(int64_t n, Fn&& fn) {
    if (n <= 0) return;
    Run([&](int ti, int nt) {
      const int64_t chunk = (n + nt - 1) / nt;
      const int64_t b = ti * chunk;
      const int64_t e = b + chunk < n ? b + chunk : n;
      if (b < e) fn(b, e);
    });
  }

 private:
  using JobFn = void (*)(void* ctx, int ti, int nt);
  template <typename Fn>
  static void Trampoline(void* ctx, int ti, int nt) {
    (*static_cast<Fn*>(ctx))(ti, nt);
  }
  void RunImpl(JobFn fn, void* ctx);
  void WorkerLoop(int ti);

  int num_threads_;
  std::vector<std::thread> threads_;
  std::atomic<uint64_t> generation_{0};
  std::atomic<int> pending_{0};
  std::atomic<bool> stop_{false};
  JobFn job_fn_ = nullptr;
  void* job_ctx_ = nullptr;
  std::mutex mu_;
  std::condition_variable cv_;
};

// fn(begin, end) over [0, rows): split among the pool's threads (ParallelFor) when there are
// enough rows of enough values for the split to pay -- a parallel region costs a few
// microseconds -- else in the calling thread (also when pool is null). For per-row work between
// the big kernels of a batched step (activation quantization, norms, RoPE and cache writes,
// logit checks), which would otherwise leave every other thread waiting.
template <typename Fn>
void ForRows(ThreadPool* pool, int64_t rows, int64_t row_values, Fn&& fn) {
  if (pool && pool->num_threads() > 1 && rows >= 2 * pool->num_threads() &&
      rows * row_values >= (int64_t{1} << 14)) {
    pool->ParallelFor(rows, fn);
  } else if (rows > 0) {
    fn(int64_t{0}, rows);
  }
}

}  // namespace peng
