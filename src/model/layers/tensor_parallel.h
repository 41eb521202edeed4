// The pieces of tensor parallelism every model shares (DecoderModel, DeepseekV2Model): how a
// dimension is cut across the ranks, and the vocabulary-parallel embedding and LM head.
//
// A rank's slice of a dimension is contiguous; a dimension that is the columns of a row-parallel
// matrix (FFN, experts' intermediate size) is cut at whole blocks of that matrix's storage.
// The vocabulary: rank k owns rows [k * S, (k + 1) * S) of the embedding and the LM head
// (S = ceil(vocab / tp); the last rank may own fewer). The embedding of a token is looked up by
// the rank that has its row (the others write zeros) and summed over the ranks; the LM head's
// logits of every rank are gathered on rank 0, the only rank that samples.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/status.h"
#include "model/layers/linear.h"
#include "parallel/communicator.h"

namespace peng {

class ThreadPool;

// A rank's contiguous share [begin, begin + size) of a dimension.
struct TpSlice {
  int64_t begin = 0;
  int64_t size = 0;
};

// The share of rank `rank` of `total` values split over `tp` ranks as evenly as blocks of
// `granularity` values allow (the last rank takes what is left). An error naming `what` when a
// rank would get nothing.
StatusOr<TpSlice> SplitAtBlocks(int64_t total, int64_t granularity, int tp, int rank,
                                const std::string& what);

// The coarsest column granularity (Linear::ColumnGranularity) of the tensors `names` that the
// files have (absent ones are skipped): a cut at its multiples is valid for every layer, whatever
// mix of block types the file uses.
StatusOr<int64_t> ColumnGranularityOf(const ModelFiles& files,
                                      const std::vector<std::string>& names);

class VocabParallel {
 public:
  // `tp` null or of size 1: the whole vocabulary.
  Status Plan(int64_t vocab, Communicator* tp, const std::string& path);
  int64_t begin() const { return begin_; }
  int64_t size() const { return size_; }

  // x[T, D] = the embedding rows of `tokens` (summed over the ranks).
  void Embed(const Linear& embd, const int32_t* tokens, int64_t T, int64_t D, float* x);
  // logits[rows, vocab] = out(x); with tensor parallelism only on rank 0 (returns false on the
  // other ranks, whose `logits` are untouched).
  bool Project(const Linear& out, const float* x, const Int8Acts* xq, int64_t rows,
               float* logits, ThreadPool* pool, Int8Acts* scratch);
  // The gather of Project: `mine` [rows, size()] (this rank's columns, computed elsewhere, e.g.
  // on a device) into logits [rows, vocab] on rank 0 (returns false on the others).
  bool GatherLogits(const float* mine, int64_t rows, float* logits);

 private:
  Communicator* tp_ = nullptr;
  int64_t vocab_ = 0, begin_ = 0, size_ = 0;
  int64_t stride_ = 0;  // ceil(vocab / tp): each rank's slot in the gather
  std::vector<float> local_, all_;
};

}  // namespace peng
