// PipelineStage: this rank's share of a model split by layers (pipeline parallelism,
// `--pipeline-parallel-size`): stage s of n runs a contiguous range of the layers, the first
// stage also the embedding, the last the final norm and the LM head. The stages of one tensor-
// parallel index form a Communicator in stage order (`pp`); every stage runs every step, in
// turn: stage s receives the residual stream [T, hidden] from stage s - 1, runs its layers and
// sends it on to s + 1; the last stage's logits go back to the first stage, whose rank 0 runs
// the engine. Each stage binds (and packs) only its layers' weights and keeps only their KV
// cache (the KvCacheSpec of another stage's layer is empty).
//
// A step's batch runs as micro-batches (Run): contiguous ranges of its tokens -- whole
// sequences, or a long prompt's chunks in order, as chunked prefill cuts them -- so that stage
// s works on micro-batch m while stage s + 1 works on m - 1 (M micro-batches over S stages
// keep the stages busy M / (M + S - 1) of the step). The arithmetic is the one process's: the
// same ops on the same rows.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "core/status.h"
#include "model/model.h"
#include "parallel/communicator.h"

namespace peng {

class PipelineStage {
 public:
  // `pp` null or of size 1: the whole model. The n_layers layers split into pp->size()
  // contiguous ranges, the first n_layers % size stages one layer more.
  Status Plan(int n_layers, Communicator* pp, const std::string& path);
  bool split() const { return pp_ != nullptr; }
  bool first() const { return stage_ == 0; }
  bool last() const { return stage_ == n_stages_ - 1; }
  int begin() const { return begin_; }  // this stage's layers [begin(), end())
  int end() const { return end_; }
  bool Holds(int il) const { return il >= begin_ && il < end_; }

  // The residual stream x [n] from the stage before (all but the first).
  void Receive(float* x, int64_t n);
  // x [n] to the stage after (all but the last).
  void SendOn(const float* x, int64_t n);
  // The step's logits [n] from the last stage to the first: sent by the last, received by the
  // first (the ranks that hold them: tensor-parallel rank 0 of each); nothing elsewhere.
  void ReturnLogits(float* logits, int64_t n);

  // How many micro-batches `batch` (a step's, T > 0; see above) runs as: up to `most`, each
  // of at least kMinMicroBatchTokens tokens, the same on every rank that gets the batch; for
  // more than one, they go into *out (its vectors reused from step to step).
  static constexpr int64_t kMinMicroBatchTokens = 16;
  int MicroBatches(const ForwardBatch& batch, int most, std::vector<ForwardBatch>* out) const;
  // The model's forward pass over a step (T > 0): alone, `one` over the batch; split, `one`
  // over each micro-batch (this stage's part of the model's pass over it, its logit rows into
  // the logits it is given: the last stage's), then the step's logit rows [rows, vocab] back
  // to the first stage (`holder`: this rank holds them, ReturnLogits). `one_pass`: the step
  // whole (a model whose layers exchange tokens with other replicas': their counts must agree).
  template <typename Fn>
  Status Run(const ForwardBatch& batch, float* logits, int64_t vocab, bool holder,
             bool one_pass, Fn&& one) {
    if (!split()) return one(batch, logits);
    if (batch.capture_hidden)  // (the same batch on every stage: all return here)
      return InvalidArgument("hidden states are not captured under pipeline parallelism");
    if (MicroBatches(batch, one_pass ? 1 : max_micro_batches_, &micro_) == 1) {
      PENG_RETURN_IF_ERROR(one(batch, logits));
    } else {
      int64_t row = 0;
      for (const ForwardBatch& mb : micro_) {
        PENG_RETURN_IF_ERROR(one(mb, logits + row * vocab));
        row += mb.NumLogitRows();
      }
    }
    if (holder) ReturnLogits(logits, batch.NumLogitRows() * vocab);
    return OkStatus();
  }
  // The micro-batches a step runs as at most (PENG_PP_MICRO_BATCHES, default 2 x the stages).
  int max_micro_batches() const { return max_micro_batches_; }
  // The layers of `all` this stage holds.
  template <typename Layer>
  std::span<const Layer> Layers(const std::vector<Layer>& all) const {
    return {all.data() + begin_, all.data() + end_};
  }

 private:
  Communicator* pp_ = nullptr;
  int stage_ = 0, n_stages_ = 1, begin_ = 0, end_ = 0;
  int max_micro_batches_ = 1;
  std::vector<ForwardBatch> micro_;  // (Run's)
};

}  // namespace peng
