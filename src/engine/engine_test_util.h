// Helpers shared by the engine tests: submit requests, read their streams to the end, check
// that everything was freed.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

#include "engine/engine.h"

namespace peng::test_util {

using Ids = std::vector<int32_t>;

// How long a test waits for the next event of a stream (or for the engine to drain) before it
// calls the engine hung: 60 s, times PENG_TEST_TIME_SCALE when set (scripts/test_arm64.sh sets
// it: under qemu a batch's prefill can take minutes).
inline std::chrono::seconds Patience() {
  const char* s = std::getenv("PENG_TEST_TIME_SCALE");
  const int scale = s != nullptr ? std::max(1, std::atoi(s)) : 1;
  return std::chrono::seconds(60 * scale);
}

// Everything a request's stream delivered, per completion index.
struct Result {
  std::vector<Ids> tokens;
  std::vector<std::string> text;
  std::vector<std::string> finish;
  std::vector<std::vector<TokenLogprob>> logprobs;
  std::string error;  // of the last event that carried one
};

inline Result Collect(RequestStream* stream, int n) {
  Result r;
  r.tokens.resize(n);
  r.text.resize(n);
  r.finish.resize(n);
  r.logprobs.resize(n);
  RequestOutput ev;
  bool timed_out = false;
  while (stream->Next(&ev, Patience(), &timed_out)) {
    EXPECT_FALSE(timed_out);
    if (timed_out) break;
    r.tokens[ev.index].insert(r.tokens[ev.index].end(), ev.token_ids.begin(), ev.token_ids.end());
    r.text[ev.index] += ev.text;
    r.logprobs[ev.index].insert(r.logprobs[ev.index].end(), ev.logprobs.begin(), ev.logprobs.end());
    EXPECT_EQ(ev.completion_tokens, static_cast<int64_t>(r.tokens[ev.index].size()));
    if (ev.finish_reason) r.finish[ev.index] = *ev.finish_reason;
    if (!ev.error.empty()) r.error = ev.error;
    ev = RequestOutput();
  }
  return r;
}

// Submits every request at once, then reads all streams.
inline std::vector<Result> RunBatch(Engine* e, const std::vector<GenerateRequest>& reqs) {
  std::vector<std::shared_ptr<RequestStream>> streams;
  for (const GenerateRequest& r : reqs) {
    auto s = e->Submit(r);
    EXPECT_TRUE(s.ok()) << s.status().ToString();
    streams.push_back(s.ok() ? *s : nullptr);
  }
  std::vector<Result> out;
  for (size_t i = 0; i < reqs.size(); ++i) {
    if (streams[i]) {
      out.push_back(Collect(streams[i].get(), reqs[i].n));
    } else {  // refused: empty completions, so that callers can still index them
      Result r;
      r.tokens.resize(reqs[i].n);
      r.text.resize(reqs[i].n);
      r.finish.resize(reqs[i].n);
      r.logprobs.resize(reqs[i].n);
      out.push_back(std::move(r));
    }
  }
  return out;
}

inline Result RunOne(Engine* e, const GenerateRequest& r) { return RunBatch(e, {r})[0]; }

// A greedy request that ignores EOS.
inline GenerateRequest Greedy(const std::string& id, Ids prompt, int max_tokens, int n = 1) {
  GenerateRequest r;
  r.id = id;
  r.prompt = std::move(prompt);
  r.params.temperature = 0;
  r.params.ignore_eos = true;
  r.params.max_tokens = max_tokens;
  r.n = n;
  return r;
}

// Waits for the engine to go idle (Drain: it takes no new requests afterwards); then no block
// may be in use and no request queued.
inline void ExpectIdleAndFreed(Engine* e) {
  ASSERT_TRUE(e->Drain(Patience()));
  const EngineStats st = e->GetStats();
  EXPECT_EQ(st.kv_blocks_used, 0);
  EXPECT_EQ(st.num_running, 0);
  EXPECT_EQ(st.num_waiting, 0);
}

}  // namespace peng::test_util
