// PipelineStage: this rank's share of a model split by layers (pipeline parallelism,
// `--pipeline-parallel-size`): stage s of n runs a contiguous range of the layers, the first
// stage also the embedding, the last the final norm and the LM head. The stages of one tensor-
// parallel index form a Communicator in stage order (`pp`); every stage runs every step, in
// turn: stage s receives the residual stream [T, hidden] from stage s - 1, runs its layers and
// sends it on to s + 1; the last stage's logits go back to the first stage, whose rank 0 runs
// the engine. The arithmetic is the one process's, op for op: the logits are the same bits.
// Each stage binds (and packs) only its layers' weights and keeps only their KV cache (the
// KvCacheSpec of another stage's layer is empty).
#pragma once

#include <cstdint>
#include <string>

#include "core/status.h"
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

 private:
  Communicator* pp_ = nullptr;
  int stage_ = 0, n_stages_ = 1, begin_ = 0, end_ = 0;
};

}  // namespace peng
