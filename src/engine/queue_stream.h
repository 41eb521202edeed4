// QueueStream: the RequestStream the engine hands out (and the server tests' fake engine):
// a locked queue of events for `n` completions, with an optional notify callback called
// after each Push() without the lock held. Thread-safe.
#pragma once

#include <chrono>
#include <condition_variable>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>

#include "engine/engine.h"

namespace peng {

class QueueStream : public RequestStream {
 public:
  explicit QueueStream(int n) : n_(n), open_(n) {}
  int num_completions() const { return n_; }

  void Push(RequestOutput out) {
    std::shared_ptr<std::function<void()>> notify;
    {
      std::lock_guard<std::mutex> lk(mu_);
      if (out.finish_reason) --open_;
      q_.push_back(std::move(out));
      cv_.notify_all();
      notify = notify_;
    }
    if (notify) (*notify)();
  }

  void SetNotify(std::function<void()> fn) override {
    std::shared_ptr<std::function<void()>> now;
    {
      std::lock_guard<std::mutex> lk(mu_);
      notify_ = fn ? std::make_shared<std::function<void()>>(std::move(fn)) : nullptr;
      if (notify_ && (!q_.empty() || open_ == 0)) now = notify_;
    }
    if (now) (*now)();
  }

  bool Next(RequestOutput* out, std::chrono::milliseconds timeout, bool* timed_out) override {
    std::unique_lock<std::mutex> lk(mu_);
    *timed_out = false;
    if (!cv_.wait_for(lk, timeout, [&] { return !q_.empty() || open_ == 0; })) {
      *timed_out = true;
      return true;
    }
    if (q_.empty()) return false;
    *out = std::move(q_.front());
    q_.pop_front();
    return true;
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<RequestOutput> q_;
  const int n_;
  int open_;  // completions without their final event yet
  std::shared_ptr<std::function<void()>> notify_;  // copied out, called without mu_
};

}  // namespace peng
