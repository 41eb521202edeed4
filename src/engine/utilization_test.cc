// The engine's utilization accounting (EngineStats) against independent measurements on a
// real model: bytes read per step against the weight bytes in the GGUF file, arithmetic
// against 2 x the matmul parameters per token, the bandwidth gauge against those bytes over
// the test's own wall clock, the phase times against the busy time.
#include <chrono>
#include <cmath>
#include <thread>

#include <gtest/gtest.h>

#include "core/test_paths.h"
#include "engine/engine.h"
#include "engine/engine_test_util.h"
#include "formats/gguf.h"

namespace peng {
namespace {

class Utilization : public ::testing::Test {
 protected:
  void SetUp() override {
    if (path_.empty()) GTEST_SKIP() << "smollm2-135m-instruct-q4_1.gguf not found";
  }
  EngineOptions Options(int threads, int64_t max_model_len) const {
    EngineOptions o;
    o.model_path = path_;
    o.threads = threads;
    o.max_model_len = max_model_len;
    return o;
  }
  const std::string path_ = test_util::ModelFile("smollm2-135m-instruct-q4_1.gguf");
};

TEST_F(Utilization, SmolLM2DecodeMatchesTheFileAndTheWallClock) {
  // Independent of the kernels' counters: every 2-D weight is read once per step (the tied
  // token embedding as the LM head); norms are 1-D. Arithmetic: 2 per weight per token.
  auto gguf = GgufFile::Open(path_);
  ASSERT_TRUE(gguf.ok()) << gguf.status().ToString();
  int64_t file_bytes = 0, params = 0;
  for (const TensorView& t : (*gguf)->tensors()) {
    if (t.ndim() != 2) continue;
    file_bytes += static_cast<int64_t>(t.size_bytes);
    params += t.numel();
  }
  EngineOptions o = Options(2, 1024);
  // The gauges cover the whole run, so that they and the test's wall clock measure the same
  // period (the default 2 s window is the last part of it; the machine may be shared).
  o.utilization_window_s = 600;
  auto e = Engine::Create(o);
  ASSERT_TRUE(e.ok()) << e.status().ToString();
  Engine* engine = e->get();
  const EngineStats s0 = engine->GetStats();
  EXPECT_GT(s0.peak_read_bytes_per_s, 1e8);
  EXPECT_GT(s0.peak_flops_f32_per_s, 1e8);
  EXPECT_GT(s0.peak_ops_int8_per_s, 1e8);
  EXPECT_EQ(s0.steps_total, 0);

  // One sequence decoding.
  const int prompt_len = 8, max_tokens = 200;
  GenerateRequest r = test_util::Greedy("u", test_util::Ids(prompt_len, 1000), max_tokens);
  r.params.ignore_eos = true;
  const auto t0 = std::chrono::steady_clock::now();
  const test_util::Result res = test_util::RunOne(engine, r);
  const double wall = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  // The stream ends inside the last step; that step's stats are published just after.
  EngineStats s = engine->GetStats();
  while (s.requests_finished_total < 1) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
    s = engine->GetStats();
  }
  // The last step ends (and its busy time is counted) after the stream's end, so the bound on
  // the busy time is the wall time until its stats were seen.
  const double wall_published =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  ASSERT_EQ(res.tokens[0].size(), static_cast<size_t>(max_tokens));
  // One prefill step, then one step per further token.
  ASSERT_EQ(s.steps_total, max_tokens);
  const double steps = static_cast<double>(s.steps_total);
  EXPECT_NEAR(s.weight_bytes_total / steps, file_bytes, 0.02 * file_bytes);
  const double tokens = prompt_len + max_tokens - 1;  // the last token is never fed back
  EXPECT_NEAR(static_cast<double>(s.ops_int8_total), 2.0 * params * tokens, 0.02 * 2 * params * tokens);
  EXPECT_GT(s.flops_f32_total, 0);  // attention
  EXPECT_GT(s.kv_bytes_total, 0);

  // The gauges (bytes per second of step time) against the file's bytes over the wall time
  // measured here: the engine is busy all along (the KV cache adds a few percent).
  const double independent_bw = file_bytes * steps / wall;
  EXPECT_NEAR(s.read_bytes_per_s, independent_bw, 0.2 * independent_bw)
      << "gauge " << s.read_bytes_per_s / 1e9 << " GB/s, independent " << independent_bw / 1e9;
  EXPECT_NEAR(s.bandwidth_utilization, s.read_bytes_per_s / s.peak_read_bytes_per_s, 1e-9);
  EXPECT_GT(s.bandwidth_utilization, 0);
  EXPECT_GT(s.compute_utilization, 0);
  EXPECT_LT(s.compute_utilization, 1);  // decoding one sequence is far from compute-bound
  EXPECT_NEAR(s.busy_fraction, wall / o.utilization_window_s, 0.2 * wall / o.utilization_window_s);
  // Busy time (the sum of the phases): inside the wall time, and equal to the step times the
  // utilization window summed (the window covers the whole run here).
  EXPECT_NEAR(s.busy_seconds_total(), s.busy_fraction * o.utilization_window_s, 1e-6);
  EXPECT_LE(s.busy_seconds_total(), wall_published);
  EXPECT_GT(s.busy_seconds_total(), 0.8 * wall);
  EXPECT_GT(s.phase_seconds_total[kPhaseForward], 0.5 * s.busy_seconds_total());
  EXPECT_GT(s.phase_seconds_total[kPhaseSample], 0);
  EXPECT_GT(s.phase_seconds_total[kPhaseEmit], 0);
  EXPECT_EQ(s.queue_wait_count, 1);
  EXPECT_GE(s.queue_wait_seconds_sum, 0);
  EXPECT_LT(s.queue_wait_seconds_sum, wall);
  std::printf("decode: %.2f GB/s by the gauge, %.2f GB/s independent, peak %.2f GB/s (%.0f%%); "
              "busy %.3f of %.3f s\n",
              s.read_bytes_per_s / 1e9, independent_bw / 1e9, s.peak_read_bytes_per_s / 1e9,
              100 * s.bandwidth_utilization, s.busy_seconds_total(), wall);
}

TEST_F(Utilization, TheWindowEmptiesWhenIdle) {
  EngineOptions o = Options(1, 64);
  o.utilization_window_s = 1.0;
  auto e = Engine::Create(o);
  ASSERT_TRUE(e.ok()) << e.status().ToString();
  test_util::RunOne(e->get(), test_util::Greedy("a", {1, 2, 3}, 4));
  EXPECT_GT((*e)->GetStats().busy_fraction, 0);
  EXPECT_GT((*e)->GetStats().read_bytes_per_s, 0);
  std::this_thread::sleep_for(std::chrono::milliseconds(1100));
  const EngineStats idle = (*e)->GetStats();
  EXPECT_EQ(idle.busy_fraction, 0);
  EXPECT_EQ(idle.read_bytes_per_s, 0);
  EXPECT_EQ(idle.bandwidth_utilization, 0);
  EXPECT_EQ(idle.steps_total, 4);
  o.utilization_window_s = 0;
  EXPECT_EQ(Engine::Create(o).status().message(), "utilization_window_s must be > 0");
}

TEST_F(Utilization, PeaksGivenByOptionsAreKept) {
  EngineOptions o = Options(1, 64);
  o.peak_read_bytes_per_s = 1e10;
  o.peak_flops_f32_per_s = 2e11;
  o.peak_ops_int8_per_s = 3e11;
  auto e = Engine::Create(o);
  ASSERT_TRUE(e.ok()) << e.status().ToString();
  const EngineStats s = (*e)->GetStats();
  EXPECT_EQ(s.peak_read_bytes_per_s, 1e10);
  EXPECT_EQ(s.peak_flops_f32_per_s, 2e11);
  EXPECT_EQ(s.peak_ops_int8_per_s, 3e11);
}

}  // namespace
}  // namespace peng
