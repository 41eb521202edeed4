#include "core/thread_pool.h"

#include "core/cpu_features.h"

#if defined(__x86_64__)
#include <immintrin.h>
#define PENG_PAUSE() _mm_pause()
#elif defined(__aarch64__)
#define PENG_PAUSE() asm volatile("yield")
#else
#define PENG_PAUSE() \
  do {               \
  } while (0)
#endif

namespace peng {
namespace {
constexpr int kSpinIterations = 1 << 14;
}

ThreadPool::ThreadPool(int num_threads) {
  num_threads_ = num_threads > 0 ? num_threads : GetCpuFeatures().physical_cores;
  for (int i = 1; i < num_threads_; ++i) threads_.emplace_back([this, i] { WorkerLoop(i); });
}

ThreadPool::~ThreadPool() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_.store(true);
    generation_.fetch_add(1);
  }
  cv_.notify_all();
  for (auto& t : threads_) t.join();
}

void ThreadPool::RunImpl(JobFn fn, void* ctx) {
  job_fn_ = fn;
  job_ctx_ = ctx;
  pending_.store(num_threads_ - 1, std::memory_order_relaxed);
  {
    std::lock_guard<std::mutex> lock(mu_);
    generation_.fetch_add(1, std::memory_order_release);
  }
  cv_.notify_all();
  fn(ctx, 0, num_threads_);
  while (pending_.load(std::memory_order_acquire) != 0) PENG_PAUSE();
}

void ThreadPool::WorkerLoop(int ti) {
  uint64_t seen = 0;
  for (;;) {
    int spins = 0;
    while (generation_.load(std::memory_order_acquire) == seen && spins < kSpinIterations) {
      PENG_PAUSE();
      ++spins;
    }
    if (generation_.load(std::memory_order_acquire) == seen) {
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait(lock, [&] { return generation_.load(std::memory_order_acquire) != seen; });
    }
    seen = generation_.load(std::memory_order_acquire);
    if (stop_.load()) return;
    job_fn_(job_ctx_, ti, num_threads_);
    pending_.fetch_sub(1, std::memory_order_acq_rel);
  }
}

}  // namespace peng
