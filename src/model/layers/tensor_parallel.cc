#include "model/layers/tensor_parallel.h"

#include <algorithm>

namespace peng {

StatusOr<TpSlice> SplitAtBlocks(int64_t total, int64_t granularity, int tp, int rank,
                                const std::string& what) {
  const int64_t g = std::max<int64_t>(granularity, 1);
  auto cut = [&](int64_t i) { return i == tp ? total : (total * i / tp + g / 2) / g * g; };
  TpSlice s{cut(rank), cut(rank + 1) - cut(rank)};
  if (s.size <= 0)
    return InvalidArgument(what + " of " + std::to_string(total) + " (blocks of " +
                           std::to_string(g) + ") cannot be split for tensor parallel size " +
                           std::to_string(tp));
  return s;
}

StatusOr<int64_t> ColumnGranularityOf(const ModelFiles& files,
                                      const std::vector<std::string>& names) {
  int64_t g = 1;
  for (const std::string& name : names) {
    if (!files.Find(name)) continue;
    PENG_ASSIGN_OR_RETURN(const int64_t n, Linear::ColumnGranularity(files, name));
    g = std::max(g, n);  // block sizes are 1, 32 and 256: the largest is a multiple of the others
  }
  return g;
}

Status VocabParallel::Plan(int64_t vocab, Communicator* tp, const std::string& path) {
  vocab_ = vocab;
  tp_ = tp && tp->size() > 1 ? tp : nullptr;
  if (!tp_) {
    begin_ = 0;
    size_ = stride_ = vocab;
    return OkStatus();
  }
  const int64_t n = tp_->size();
  stride_ = (vocab + n - 1) / n;
  begin_ = std::min<int64_t>(tp_->rank() * stride_, vocab);
  size_ = std::min<int64_t>(stride_, vocab - begin_);
  if (size_ <= 0)
    return InvalidArgument(path + ": the vocabulary of " + std::to_string(vocab) +
                           " is too small for tensor parallel size " + std::to_string(n));
  return OkStatus();
}

void VocabParallel::Embed(const Linear& embd, const int32_t* tokens, int64_t T, int64_t D,
                          float* x) {
  for (int64_t i = 0; i < T; ++i) {
    const int64_t row = tokens[i] - begin_;
    if (row >= 0 && row < size_) {
      embd.DequantizeRow(row, x + i * D);
    } else {
      std::fill_n(x + i * D, D, 0.f);
    }
  }
  if (tp_) tp_->AllReduceSum(x, T * D);
}

bool VocabParallel::Project(const Linear& out, const float* x, const Int8Acts* xq, int64_t rows,
                            float* logits, ThreadPool* pool, Int8Acts* scratch) {
  if (!tp_) {
    out.Forward(x, xq, rows, logits, pool, scratch);  // [rows, vocab]
    return true;
  }
  all_.resize(rows * stride_ * tp_->size());
  out.Forward(x, xq, rows, all_.data(), pool, scratch);
  return GatherLogits(all_.data(), rows, logits);
}

bool VocabParallel::GatherLogits(const float* mine, int64_t rows, float* logits) {
  // This rank's vocabulary columns, gathered on rank 0 as [tp][rows][stride_].
  const int64_t S = stride_, n = tp_->size();
  local_.assign(rows * S, 0.f);
  for (int64_t r = 0; r < rows; ++r)  // [rows, size_] -> [rows, S] (the last rank pads)
    std::copy_n(mine + r * size_, size_, local_.data() + r * S);
  all_.resize(rows * S * n);
  tp_->Gather(local_.data(), rows * S * static_cast<int64_t>(sizeof(float)), all_.data(), 0);
  if (tp_->rank() != 0) return false;
  for (int64_t k = 0; k < n; ++k) {
    const int64_t v0 = std::min<int64_t>(k * S, vocab_);
    const int64_t m = std::min<int64_t>(S, vocab_ - v0);
    for (int64_t r = 0; r < rows; ++r)
      std::copy_n(all_.data() + (k * rows + r) * S, m, logits + r * vocab_ + v0);
  }
  return true;
}

}  // namespace peng
