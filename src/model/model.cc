#include "model/model.h"

#include <cstring>

namespace peng {

int64_t ForwardBatch::NumLogitRows() const {
  int64_t n = 0;
  for (const SeqBatchEntry& s : seqs)
    if (s.want_logits) n += s.all_logits ? s.n_tokens : 1;
  return n;
}

Status PrepareBatch(const ForwardBatch& batch, int64_t num_blocks, int block_size,
                    int64_t vocab_size, int64_t* pos, int32_t* seq_of_token) {
  const int64_t T = static_cast<int64_t>(batch.tokens.size());
  int64_t t = 0;
  for (size_t si = 0; si < batch.seqs.size(); ++si) {
    const SeqBatchEntry& s = batch.seqs[si];
    const int64_t end = s.pos0 + s.n_tokens;
    if (s.n_tokens <= 0 || s.pos0 < 0 || s.n_blocks * block_size < end)
      return InvalidArgument("batch entry " + std::to_string(si) + " does not fit its block table");
    for (int64_t b = 0; b < (end + block_size - 1) / block_size; ++b)
      if (s.block_table[b] < 0 || s.block_table[b] >= num_blocks)
        return InvalidArgument("batch entry " + std::to_string(si) + " has invalid block id");
    if (t + s.n_tokens > T) return InvalidArgument("batch token count does not match its sequences");
    for (int64_t i = 0; i < s.n_tokens; ++i, ++t) {
      pos[t] = s.pos0 + i;
      seq_of_token[t] = static_cast<int32_t>(si);
    }
  }
  if (t != T) return InvalidArgument("batch token count does not match its sequences");
  for (int64_t i = 0; i < T; ++i) {
    const int32_t id = batch.tokens[i];
    if (id < 0 || id >= vocab_size)
      return InvalidArgument("token id " + std::to_string(id) + " out of range [0, " +
                             std::to_string(vocab_size) + ")");
  }
  return OkStatus();
}

void RopeRows(const int64_t* pos, int64_t T, const kernels::RopeConfig& cfg,
              const std::vector<float>& inv_freq, std::vector<float>* cs) {
  cs->resize(static_cast<size_t>(T) * cfg.rot_dim);
  for (int64_t t = 0; t < T; ++t)
    kernels::RopeCosSin(pos[t], cfg, inv_freq.data(), cs->data() + t * cfg.rot_dim);
}

int64_t GatherLogitRows(const ForwardBatch& batch, const float* x, int64_t hidden, float* sel) {
  int64_t rows = 0, t = 0;
  for (const SeqBatchEntry& s : batch.seqs) {
    if (s.want_logits) {
      const int64_t first = s.all_logits ? t : t + s.n_tokens - 1;
      for (int64_t i = first; i < t + s.n_tokens; ++i, ++rows)
        std::memcpy(sel + rows * hidden, x + i * hidden, hidden * sizeof(float));
    }
    t += s.n_tokens;
  }
  return rows;
}

}  // namespace peng
