// A scripted fake Engine for the server tests: every completion yields max_tokens tokens "x"
// (id 7), one per `delay_ms`, then "length" -- or, with `fail_after` > 0, finishes with
// "error" after that many tokens. Test-only.
#pragma once

#include <atomic>
#include <condition_variable>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <utility>
#include <thread>
#include <vector>

#include "engine/engine.h"
#include "engine/queue_stream.h"
#include "server/test_http.h"

namespace peng::server::testing {

using FakeStream = QueueStream;

class FakeEngine : public Engine {
 public:
  FakeEngine() { config_.vocab_size = 100; }
  ~FakeEngine() override { Stop(); }

  StatusOr<std::shared_ptr<RequestStream>> Submit(GenerateRequest r) override {
    std::lock_guard<std::mutex> lock(mu_);
    if (draining_) return ResourceExhausted("the engine is shutting down");
    if (queue_full) return ResourceExhausted("too many waiting requests");
    if (!fatal_error_.empty()) return Internal("the engine cannot run: " + fatal_error_);
    if (Status s = r.params.Validate(); !s.ok()) return s;
    auto stream = std::make_shared<FakeStream>(r.n);
    ++running_;
    last_params = r.params;
    threads_.emplace_back([this, r, stream] { Run(r, stream); });
    return std::shared_ptr<RequestStream>(stream);
  }
  void Abort(const std::string& id) override {
    std::lock_guard<std::mutex> lock(mu_);
    aborted_.insert(id);
  }
  EngineStats GetStats() const override {
    EngineStats s;
    s.num_running = running_;
    s.kv_blocks_used = running_;
    s.kv_blocks_total = 64;
    std::lock_guard<std::mutex> lock(mu_);
    s.fatal_error = fatal_error_;
    return s;
  }
  const Tokenizer* tokenizer() const override { return nullptr; }
  const ModelConfig& model_config() const override { return config_; }
  int64_t max_model_len() const override { return 64; }
  bool Drain(std::chrono::milliseconds timeout) override {
    {
      std::lock_guard<std::mutex> lock(mu_);
      draining_ = true;
    }
    return WaitFor([&] { return running_ == 0; },
                   std::min(60.0, std::chrono::duration<double>(timeout).count()));
  }
  void Stop() override {
    std::vector<std::thread> threads;
    {
      std::lock_guard<std::mutex> lock(mu_);
      stop_ = draining_ = true;
      threads.swap(threads_);
    }
    for (auto& t : threads) t.join();
  }
  bool WasAborted(const std::string& prefix) {
    std::lock_guard<std::mutex> lock(mu_);
    for (const auto& id : aborted_) {
      if (id.rfind(prefix, 0) == 0) return true;
    }
    return false;
  }
  int running() const { return running_; }
  // As an engine whose device lost its context (EngineStats::fatal_error).
  void SetFatalError(std::string e) {
    std::lock_guard<std::mutex> lock(mu_);
    fatal_error_ = std::move(e);
  }

  std::atomic<int> delay_ms{0};
  std::atomic<bool> queue_full{false};
  std::atomic<int> fail_after{0};
  SamplingParams last_params;

 private:
  void Run(const GenerateRequest& r, const std::shared_ptr<FakeStream>& stream) {
    for (int t = 1; t <= r.params.max_tokens; ++t) {
      std::this_thread::sleep_for(std::chrono::milliseconds(delay_ms.load()));
      bool abort;
      {
        std::lock_guard<std::mutex> lock(mu_);
        abort = stop_ || aborted_.count(r.id) != 0;
      }
      for (int i = 0; i < r.n; ++i) {
        RequestOutput o;
        o.index = i;
        o.prompt_tokens = static_cast<int64_t>(r.prompt.size());
        o.completion_tokens = abort ? t - 1 : t;
        if (abort) {
          o.finish_reason.emplace("abort");  // (emplace: `=` trips a GCC 12 -O1 warning)
        } else if (fail_after > 0 && t > fail_after) {
          o.finish_reason.emplace("error");
          o.error = "injected failure";
          o.completion_tokens = t - 1;
        } else {
          o.token_ids = {7};
          o.text.push_back('x');  // (= "x" trips a GCC 12 -Wrestrict false positive)
          if (r.params.want_logprobs) o.logprobs = {TokenLogprob{7, -0.25f, {{7, -0.25f}}, ""}};
          if (t == r.params.max_tokens) o.finish_reason.emplace("length");
        }
        stream->Push(std::move(o));
      }
      if (abort || (fail_after > 0 && t > fail_after)) break;
    }
    --running_;
  }

  ModelConfig config_;
  mutable std::mutex mu_;
  std::string fatal_error_;
  std::vector<std::thread> threads_;
  std::set<std::string> aborted_;
  std::atomic<int> running_{0};
  bool draining_ = false;
  bool stop_ = false;
};

}  // namespace peng::server::testing
