// Shared by the device tests: a model run through the CPU engine's executor and through a
// device's (the device graph, model/device_model.h), fed identical steps -- two prefills
// of different lengths (one with logits for every token), then decode steps for both, then a
// third sequence that starts from a copy of the first one's first block (copy-on-write) --
// with every step's logits collected.
#pragma once

#include <gtest/gtest.h>

#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <functional>
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include "core/test_paths.h"
#include "engine/engine.h"
#include "engine/executor.h"
#include "engine/sampler.h"
#include "kernels/ops.h"
#include "model/registry.h"
#include "quant/quantize.h"

namespace peng::device_test {

constexpr int kBlockSize = 16;
constexpr int64_t kBlocks = 16;

// The models the graph is checked on: the tiny HF fixtures (Llama, Qwen2 with biases, Gemma 3
// with q/k norms, post norms, sliding windows and soft-capping) and the real GGUF files
// (skipped when not downloaded).
inline std::vector<std::string> ModelPaths(bool with_tiny = true) {
  std::vector<std::string> out;
  if (with_tiny)
    for (const char* m : {"llama", "qwen2", "gemma3"})
      out.push_back(test_util::SourceDir() + "/tests/data/hf_tiny/" + m);
  for (const char* f : {"smollm2-135m-instruct-q4_1.gguf", "gemma-3-270m-q4_k_m.gguf",
                        "qwen2.5-coder-0.5b-instruct-q4_k_m.gguf"}) {
    const std::string p = test_util::ModelFile(f);
    if (!p.empty()) out.push_back(p);
  }
  return out;
}

// `peng quantize` of the model folder `dir` (a tiny fixture: tests/data/hf_tiny/llama, ...)
// with `scheme` ("w8a16", "w8a8"), written once per process under the test's temporary
// directory as device_int8_<pid>_<folder name>_<scheme>.
inline std::string Int8Folder(const std::string& dir, const std::string& scheme) {
  const std::string out = ::testing::TempDir() + "/device_int8_" + std::to_string(::getpid()) +
                          "_" + std::filesystem::path(dir).filename().string() + "_" + scheme;
  if (std::filesystem::exists(out + "/quant_config.json")) return out;
  QuantizeOptions o;
  o.input = dir;
  o.output = out;
  o.scheme = scheme;
  o.threads = 2;
  const auto r = QuantizeModel(o);
  EXPECT_TRUE(r.ok()) << dir << " " << scheme << ": " << r.status().ToString();
  return out;
}

// The tiny DeepSeek-V2 fixtures (tests/deepseek_model_test.cc): plain q / q LoRA, greedy and
// group-limited routing, YaRN, attention bias, fused experts.
inline std::vector<std::string> DeepseekPaths() {
  std::vector<std::string> out;
  for (const char* m : {"lite", "lite_fused", "v2", "mscale"})
    out.push_back(test_util::SourceDir() + "/tests/data/deepseek_tiny/" + m);
  return out;
}

// A small DeepSeek-V2 GGUF in Q4_0 (make_deepseek_gguf: 2 layers, one dense, 8 experts of which
// 2 routed and 2 shared), written once a run: the DeepSeek graph through the quantized GEMVs,
// experts and per-head kv_b (attn_k_b / attn_v_b). The tool is the build's, or
// $PENG_MAKE_DEEPSEEK_GGUF (the GPU machine's bundle); empty (those checks skipped) without
// either.
inline std::string QuantizedDeepseekPath() {
  static const std::string* path = [] {
    auto* p = new std::string();
    const char* e = std::getenv("PENG_MAKE_DEEPSEEK_GGUF");
#ifdef PENG_MAKE_DEEPSEEK_GGUF
    const std::string tool = e && *e ? e : PENG_MAKE_DEEPSEEK_GGUF;
#else
    const std::string tool = e && *e ? e : "";
#endif
    if (tool.empty()) return p;
    *p = ::testing::TempDir() + "peng_device_ds_q4_0_" + std::to_string(::getpid()) + ".gguf";
    const std::string cmd = tool + " -o " + *p +
                            " --layers 2 --dense 1 --experts 8 --shared 2 --topk 2 --vocab 1024"
                            " --hidden 256 --ffn 512 --moe-ffn 128 --heads 4 --threads 1 "
                            "> /dev/null";
    if (std::system(cmd.c_str()) != 0) {
      std::printf("[cuda] %s failed: no quantized DeepSeek file\n", cmd.c_str());
      p->clear();
    }
    return p;
  }();
  static const bool removed_at_exit =
      std::atexit([] { if (!path->empty()) std::remove(path->c_str()); }) == 0;
  (void)removed_at_exit;
  return *path;
}

// max |a - b| / max |a| over every step's logits (0 when identical).
inline double RelativeDistance(const std::vector<std::vector<float>>& a,
                               const std::vector<std::vector<float>>& b) {
  double scale = 1e-30, worst = 0;
  EXPECT_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size() && i < b.size(); ++i) {
    EXPECT_EQ(a[i].size(), b[i].size()) << "step " << i;
    for (size_t j = 0; j < a[i].size() && j < b[i].size(); ++j) {
      scale = std::max(scale, std::abs(double{a[i][j]}));
      worst = std::max(worst, std::abs(double{a[i][j]} - b[i][j]));
    }
  }
  return worst / scale;
}

// The steps: token ids derived from the vocabulary size so every model gets valid ones.
struct Steps {
  std::vector<ForwardBatch> batches;
  std::vector<std::vector<int32_t>> tables;  // block tables (sequence -> blocks)
  std::vector<std::pair<int32_t, int32_t>> copies_before;  // per batch: block copy or {-1,-1}
};

// with_chunk: a last step of 39 tokens (below).
inline Steps MakeSteps(int64_t vocab, bool with_chunk = false) {
  Steps s;
  s.tables = {{0, 1, 2}, {3, 4, 5}, {6, 7, 8}};
  auto tok = [&](int64_t i) { return static_cast<int32_t>((i * 7919 + 13) % vocab); };
  auto seq = [&](int si, int64_t n, int64_t pos0, bool all) {
    SeqBatchEntry e;
    e.n_tokens = n;
    e.pos0 = pos0;
    e.block_table = s.tables[si].data();
    e.n_blocks = static_cast<int64_t>(s.tables[si].size());
    e.all_logits = all;
    return e;
  };
  ForwardBatch prefill;  // 20 + 7 tokens
  for (int64_t i = 0; i < 20; ++i) prefill.tokens.push_back(tok(i));
  for (int64_t i = 0; i < 7; ++i) prefill.tokens.push_back(tok(100 + i));
  prefill.seqs = {seq(0, 20, 0, true), seq(1, 7, 0, false)};
  s.batches.push_back(prefill);
  s.copies_before.push_back({-1, -1});
  for (int step = 0; step < 3; ++step) {  // decode both
    ForwardBatch d;
    d.tokens = {tok(200 + step), tok(300 + step)};
    d.seqs = {seq(0, 1, 20 + step, false), seq(1, 1, 7 + step, false)};
    s.batches.push_back(d);
    s.copies_before.push_back({-1, -1});
  }
  // Sequence 2 shares sequence 0's first 16 tokens: block 0 copied into block 6, then its own
  // tokens from position 16 on, next to a decode of sequence 0.
  ForwardBatch fork;
  for (int64_t i = 0; i < 5; ++i) fork.tokens.push_back(tok(400 + i));
  fork.tokens.push_back(tok(500));
  fork.seqs = {seq(2, 5, 16, true), seq(0, 1, 23, false)};
  s.batches.push_back(fork);
  s.copies_before.push_back({0, 6});
  if (!with_chunk) return s;
  // A 38-token chunk of sequence 1 (positions 10-47: its three blocks full) next to a decode of
  // sequence 0: 39 tokens, past 32 (the CUDA backend's experts grouped by expert, inside a
  // recorded graph).
  ForwardBatch chunk;
  for (int64_t i = 0; i < 38; ++i) chunk.tokens.push_back(tok(600 + i));
  chunk.tokens.push_back(tok(700));
  chunk.seqs = {seq(1, 38, 10, false), seq(0, 1, 24, false)};
  s.batches.push_back(chunk);
  s.copies_before.push_back({-1, -1});
  return s;
}

struct Run {
  std::vector<std::vector<float>> logits;  // per step
  std::vector<float> hidden;               // the first step's residual stream (capture)
  int64_t hidden_size = 0;                 // (hidden holds layers + 1 blocks of [T, this])
  std::vector<int64_t> kernels;            // per step: kernels the device launched
  std::vector<TopLogits> top;              // per step, with top_logits (RunSteps)
  // Per step, with top_logits: the same rows' best half the vocabulary (at most the executor's
  // top_logits_wide) after the step (Executor::CopyBestOfLogitRows; val, idx and k alone).
  std::vector<TopLogits> wide;
};

// Which rows of RunSteps with top_logits have their softmax total summed and their token drawn
// too (SeqBatchEntry::draw_inv_temperature): steps 0, 1 and 3 one row each (1 and 3: the same
// shape as step 2, which draws none), at these temperatures and uniforms -- step 3's -1, the
// total alone.
inline bool DrawsToken(size_t step, size_t seq) { return (step + seq) % 3 == 1; }
inline float DrawInvTemperature(size_t step) { return 1.0f / (0.5f + 0.25f * step); }
inline double DrawUniform(size_t step, size_t seq) {
  return step == 3 ? -1.0 : std::fmod(0.37 * step + 0.11 * seq + 0.05, 1.0);
}
// And the log-softmax's total (SeqBatchEntry::log_total): step 1's row and step 3's other.
inline bool WantsLogTotal(size_t step, size_t seq) {
  return (step == 1 && DrawsToken(step, seq)) || (step == 3 && !DrawsToken(step, seq));
}

// And the changes the device makes to a row first (SeqBatchEntry::edits): steps 0's and 1's
// drawing rows, with these -- a bias that lifts id 1, a ban, the penalties over a history; step
// 1's also a grammar's mask (LogitEdits::allow) that allows no id 3, 8, 13, ...
inline bool EditsRow(size_t step, size_t seq) { return step <= 1 && DrawsToken(step, seq); }
struct StepEdits {
  explicit StepEdits(int64_t vocab) : history(std::vector<int32_t>{1, 4}) {
    for (int32_t id : {4, 6, 6}) history.Append(id);
    params.repetition_penalty = 1.5f;
    params.presence_penalty = 0.5f;
    params.frequency_penalty = 0.8f;
    edits.bias = {{1, 3.f}, {2, -100.f}};
    edits.ban = {0};
    edits.repetition_penalty = params.repetition_penalty;
    edits.presence_penalty = params.presence_penalty;
    edits.frequency_penalty = params.frequency_penalty;
    for (const TokenHistory::Entry& e : history.distinct())
      edits.history.push_back({e.id, static_cast<float>(e.output_count)});
    masked = edits;
    masked.allow.assign((vocab + 31) / 32, 0u);  // (grammar::MaskWords)
    for (int64_t id = 0; id < vocab; ++id)
      if (Allowed(id)) masked.allow[id / 32] |= 1u << (id % 32);
  }
  static bool Allowed(int64_t id) { return id % 5 != 3; }
  const LogitEdits& For(size_t step) const { return step == 1 ? masked : edits; }
  // What the engine and the sampler do to step `step`'s whole row.
  std::vector<float> Apply(const float* row, int64_t vocab, size_t step) const {
    std::vector<float> r(row, row + vocab);
    for (const auto& [id, v] : edits.bias) r[id] += v;
    for (int64_t id = 0; id < vocab && step == 1; ++id)
      if (!Allowed(id)) r[id] = -std::numeric_limits<float>::infinity();
    for (int32_t id : edits.ban) r[id] = -std::numeric_limits<float>::infinity();
    Sampler(params).ApplyPenalties(r.data(), vocab, history);
    return r;
  }
  TokenHistory history;
  SamplingParams params;
  LogitEdits edits, masked;
};

// The model at `path` through the executor of `device` -- "cpu": the CPU engine's
// LocalExecutor (Model::Forward over a host KvCache); else the DeviceExecutor (the device graph,
// its KV cache in device memory) -- fed MakeSteps' batches and block copies.
// replace: the first step's residual stream entering each layer is replaced with these values
// (ForwardBatch::replace_hidden; the device graph only). top_logits > 0: every row of a
// sequence without all_logits asks for its best top_logits instead (SeqBatchEntry::top_logits;
// the device graph only), into Run::top and Run::wide. setup: called on the model once it is
// loaded.
inline Run RunSteps(const std::string& path, const std::string& device, DType kv_dtype,
                    const std::vector<float>* replace = nullptr, bool with_chunk = false,
                    int top_logits = 0, const std::function<void(Model*)>& setup = {}) {
  Run r;
  StatusOr<std::unique_ptr<Model>> model = LoadModel(path);
  EXPECT_TRUE(model.ok()) << path << ": " << model.status().ToString();
  if (!model.ok()) return r;
  if (setup) setup(model->get());
  const int64_t vocab = (*model)->config().vocab_size;
  r.hidden_size = (*model)->config().hidden_size;
  EngineOptions o;
  o.threads = 2;
  o.device = device;
  o.num_kv_blocks = kBlocks;
  o.block_size = kBlockSize;
  o.kv_dtype = kv_dtype;
  StatusOr<std::unique_ptr<Executor>> ex = CreateLocalExecutor(o, std::move(*model));
  EXPECT_TRUE(ex.ok()) << device << ": " << ex.status().ToString();
  if (!ex.ok()) return r;
  Steps s = MakeSteps(vocab, with_chunk);
  r.top.resize(s.batches.size());
  r.wide.resize(s.batches.size());
  const StepEdits edits(vocab);
  for (size_t i = 0; i < s.batches.size(); ++i) {
    std::vector<BlockCopy> copies;
    if (s.copies_before[i].first >= 0)
      copies.push_back({s.copies_before[i].first, s.copies_before[i].second});
    ForwardBatch& b = s.batches[i];
    if (i == 0) {
      b.capture_hidden = &r.hidden;
      b.replace_hidden = replace;
    }
    if (top_logits > 0) {
      b.top = &r.top[i];
      for (size_t j = 0; j < b.seqs.size(); ++j) {
        SeqBatchEntry& e = b.seqs[j];
        e.top_logits = e.all_logits ? 0 : top_logits;
        if (e.top_logits > 0 && DrawsToken(i, j)) {
          e.draw_inv_temperature = DrawInvTemperature(i);
          e.draw_uniform = DrawUniform(i, j);
        }
        e.log_total = e.top_logits > 0 && WantsLogTotal(i, j);
        if (e.top_logits > 0 && EditsRow(i, j)) e.edits = &edits.For(i);
      }
    }
    std::vector<float> logits(b.NumLogitRows() * vocab);
    const int64_t k0 = (*ex)->DeviceKernelLaunches();
    const Status st = (*ex)->Execute(b, copies, logits.data());
    EXPECT_TRUE(st.ok()) << device << ": " << st.ToString();
    r.kernels.push_back((*ex)->DeviceKernelLaunches() - k0);
    const int wide = static_cast<int>(std::min<int64_t>((*ex)->top_logits_wide(), vocab / 2));
    if (top_logits > 0 && wide > 0) {  // (the rows asked for their best: not all_logits)
      std::vector<int64_t> rows;
      int64_t row = 0;
      for (const SeqBatchEntry& e : b.seqs) {
        if (e.want_logits && !e.all_logits) rows.push_back(row);
        row += e.all_logits ? e.n_tokens : e.want_logits;
      }
      // (asked for again and again: 40 rows or more, past what one launch takes on a device)
      const size_t n = rows.size();
      while (!rows.empty() && rows.size() < 40) rows.push_back(rows[rows.size() - n]);
      TopLogits& w = r.wide[i];
      w.k = wide;
      w.val.resize(rows.size() * wide);
      w.idx.resize(rows.size() * wide);
      const Status ws = (*ex)->CopyBestOfLogitRows(rows, wide, w.val.data(), w.idx.data());
      EXPECT_TRUE(ws.ok()) << device << ": " << ws.ToString();
      for (size_t j = n; j < rows.size(); ++j) {  // (each time the same)
        const auto at = [&](size_t row) { return w.idx.begin() + row * wide; };
        EXPECT_TRUE(std::equal(at(j), at(j + 1), at(j % n))) << "step " << i << " ask " << j;
      }
      w.val.resize(n * wide);
      w.idx.resize(n * wide);
    }
    r.logits.push_back(std::move(logits));
  }
  return r;
}

// A RunSteps with top_logits (top) against one without (whole) on the same device: each asked
// row's best equal kernels::TopK of the whole row (changed as StepEdits says where it is
// edited), the first NaN / +inf none, the drawn tokens kernels::DrawInIdOrder's, and the rows
// of prompt logits (all_logits) equal whole.
inline void ExpectTopOfWholeRows(const Run& whole, const Run& top, int64_t vocab) {
  const Steps s = MakeSteps(vocab, whole.logits.size() > 5);
  ASSERT_EQ(top.logits.size(), whole.logits.size());
  for (size_t i = 0; i < whole.logits.size(); ++i) {
    const TopLogits& t = top.top[i];
    const TopLogits& wide = top.wide[i];
    int64_t row = 0, wide_row = 0;
    for (const SeqBatchEntry& e : s.batches[i].seqs) {
      const int64_t rows = e.all_logits ? e.n_tokens : 1;
      const size_t j = &e - s.batches[i].seqs.data();
      const std::vector<float> edited =
          EditsRow(i, j) ? StepEdits(vocab).Apply(whole.logits[i].data() + row * vocab, vocab, i)
                         : std::vector<float>();
      const float* w = EditsRow(i, j) ? edited.data() : whole.logits[i].data() + row * vocab;
      if (e.all_logits) {
        EXPECT_TRUE(std::equal(w, w + rows * vocab, top.logits[i].data() + row * vocab))
            << "step " << i << ": the prompt logits";
      } else {
        ASSERT_GT(t.k, 0);
        std::vector<float> val(t.k);
        std::vector<int32_t> idx(t.k);
        kernels::TopK(w, vocab, t.k, val.data(), idx.data());
        EXPECT_EQ(std::vector<int32_t>(t.idx.begin() + row * t.k, t.idx.begin() + (row + 1) * t.k),
                  idx)
            << "step " << i << " row " << row;
        EXPECT_TRUE(std::equal(val.begin(), val.end(), t.val.begin() + row * t.k));
        EXPECT_EQ(t.first_bad[row], -1);
        if (wide.k > 0) {  // (the same row's best half the vocabulary, after the step)
          val.resize(wide.k);
          idx.resize(wide.k);
          kernels::TopK(w, vocab, wide.k, val.data(), idx.data());
          const int64_t at = wide_row++ * wide.k;
          EXPECT_TRUE(std::equal(idx.begin(), idx.end(), wide.idx.begin() + at))
              << "step " << i << " row " << row << ": the best " << wide.k;
          EXPECT_TRUE(std::equal(val.begin(), val.end(), wide.val.begin() + at));
          val.resize(t.k);
          idx.resize(t.k);
        }
        // The drawn token: kernels::DrawInIdOrder of the whole row (the device may sum in
        // another order: the same id but within rounding of a boundary, which these are not);
        // the total kernels::TemperatureTotal's, within 1e-12.
        const bool sums = DrawsToken(i, j), draws = sums && DrawUniform(i, j) >= 0;
        EXPECT_EQ(t.drawn[row], draws ? kernels::DrawInIdOrder(w, vocab, val[0],
                                                               DrawInvTemperature(i),
                                                               DrawUniform(i, j))
                                      : -1)
            << "step " << i << " row " << row;
        const double total =
            sums ? kernels::TemperatureTotal(w, vocab, val[0], DrawInvTemperature(i)) : 0.0;
        EXPECT_NEAR(t.total[row], total, 1e-12 * total) << "step " << i << " row " << row;
        if (sums) {
          EXPECT_GT(total, 1.0);
        }
        EXPECT_EQ(t.drawn_logit[row], draws ? w[t.drawn[row]] : 0.f);
        const double log_total =
            WantsLogTotal(i, j) ? kernels::LogSoftmaxTotal(w, vocab, val[0]) : 0.0;
        EXPECT_NEAR(t.log_total[row], log_total, 1e-12 * log_total) << "step " << i;
      }
      row += rows;
    }
  }
}

inline std::unique_ptr<Model> Load(const std::string& path) {
  auto m = LoadModel(path);
  EXPECT_TRUE(m.ok()) << path << ": " << m.status().ToString();
  return m.ok() ? std::move(*m) : nullptr;
}

}  // namespace peng::device_test
