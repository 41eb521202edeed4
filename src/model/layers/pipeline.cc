#include "model/layers/pipeline.h"

#include <algorithm>

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

}  // namespace peng
