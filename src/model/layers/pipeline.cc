#include "model/layers/pipeline.h"

#include <algorithm>
#include <cstdlib>

namespace peng {

Status PipelineStage::Plan(int n_layers, Communicator* pp, const std::string& path) {
  begin_ = 0;
  end_ = n_layers;
  if (!pp || pp->size() == 1) return OkStatus();
  n_stages_ = pp->size();
  stage_ = pp->rank();
  if (n_layers < n_stages_)
    return InvalidArgument(path + ": " + std::to_string(n_layers) +
                           " layers cannot be split over pipeline parallel size " +
                           std::to_string(n_stages_));
  pp_ = pp;
  max_micro_batches_ = 2 * n_stages_;
  if (const char* e = std::getenv("PENG_PP_MICRO_BATCHES"))  // (mpirun passes it to every rank)
    max_micro_batches_ = std::max(1, std::atoi(e));
  const int per = n_layers / n_stages_, extra = n_layers % n_stages_;
  begin_ = stage_ * per + std::min(stage_, extra);
  end_ = begin_ + per + (stage_ < extra ? 1 : 0);
  return OkStatus();
}

void PipelineStage::Receive(float* x, int64_t n) {
  if (pp_ && !first()) pp_->Recv(x, n * static_cast<int64_t>(sizeof(float)), stage_ - 1);
}

void PipelineStage::SendOn(const float* x, int64_t n) {
  if (pp_ && !last()) pp_->Send(x, n * static_cast<int64_t>(sizeof(float)), stage_ + 1);
}

void PipelineStage::ReturnLogits(float* logits, int64_t n) {
  if (!pp_ || n == 0) return;
  const int64_t bytes = n * static_cast<int64_t>(sizeof(float));
  if (last()) {
    pp_->Send(logits, bytes, 0);
  } else if (first()) {
    pp_->Recv(logits, bytes, n_stages_ - 1);
  }
}

int PipelineStage::MicroBatches(const ForwardBatch& batch, int most,
                                std::vector<ForwardBatch>* out) const {
  const int64_t T = static_cast<int64_t>(batch.tokens.size());
  const int64_t m = std::clamp<int64_t>(T / kMinMicroBatchTokens, 1, most);
  if (m == 1) return 1;
  out->resize(m);
  int64_t t = 0;  // the batch's token where the current sequence starts
  size_t si = 0;  // that sequence
  for (int64_t k = 0; k < m; ++k) {
    const int64_t a = T * k / m, b = T * (k + 1) / m;  // this micro-batch's tokens [a, b)
    ForwardBatch& mb = (*out)[k];
    mb.tokens.assign(batch.tokens.begin() + a, batch.tokens.begin() + b);
    mb.seqs.clear();
    mb.top = batch.top;
    for (; si < batch.seqs.size() && t < b;) {
      const SeqBatchEntry& s = batch.seqs[si];
      const int64_t from = std::max(a, t), to = std::min(b, t + s.n_tokens);
      SeqBatchEntry part = s;
      part.n_tokens = to - from;
      part.pos0 = s.pos0 + (from - t);
      // (its last token's row, or every token's; the rows keep the batch's order)
      part.want_logits = s.want_logits && (s.all_logits || to == t + s.n_tokens);
      mb.seqs.push_back(part);
      if (to < t + s.n_tokens) break;  // the sequence goes on in the next micro-batch
      t += s.n_tokens;
      ++si;
    }
  }
  return static_cast<int>(m);
}

}  // namespace peng
