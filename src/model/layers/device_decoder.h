// DeviceDecoderModel: DecoderModel's forward pass (layers/decoder.h) on a backend::Device --
// the same graph, op for op, with the weights uploaded once in their stored types, the paged KV
// cache in device memory (same block ids and layout as on the CPU) and one host round trip per
// step: the batch's tokens, positions, KV slots and block tables go up in one copy, the logit
// rows come back. It is built from a loaded DecoderModel, which keeps the host side (the
// mapped file, the config, the tensor checks) and is the CPU reference it is tested against.
//
// Not yet on a device: tensor parallelism (a DecoderModel shard is refused) and INT8 W8A8
// activations (INT8 weights run as W8A16 on the device).
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "backend/device.h"
#include "model/layers/decoder.h"
#include "model/model.h"

namespace peng {

class DeviceDecoderModel {
 public:
  // Uploads `model`'s weights to `device`; both must outlive the result.
  static StatusOr<std::unique_ptr<DeviceDecoderModel>> Create(const DecoderModel& model,
                                                              backend::Device* device);
  ~DeviceDecoderModel();

  // Allocates the paged KV cache in device memory: num_blocks blocks of block_size tokens.
  Status AllocateKvCache(int64_t num_blocks, int block_size, DType dtype);
  int64_t num_kv_blocks() const { return num_blocks_; }
  int block_size() const { return block_size_; }
  // Device bytes of weights uploaded.
  int64_t weight_bytes() const { return weight_bytes_; }
  // Copies block src to block dst in every layer (copy-on-write; ordered before the next step).
  void CopyBlock(int32_t src, int32_t dst);
  // Model::Forward on the device: NumLogitRows() rows of vocab_size logits into host `logits`.
  Status Forward(const ForwardBatch& batch, float* logits);

 private:
  struct Layer {
    const float* attn_norm = nullptr;
    backend::DeviceMatrix wq, wk, wv, wo, w_gate, w_up, w_down;
    const float* bq = nullptr;
    const float* bk = nullptr;
    const float* bv = nullptr;
    const float* q_norm = nullptr;
    const float* k_norm = nullptr;
    const float* post_attn_norm = nullptr;
    const float* ffn_norm = nullptr;
    const float* post_ffn_norm = nullptr;
  };

  DeviceDecoderModel(const DecoderModel& model, backend::Device* device)
      : host_(model), dev_(device) {}
  Status Upload();
  StatusOr<backend::DeviceMatrix> Matrix(const Linear& l);
  StatusOr<const float*> Floats(const float* host, int64_t n);
  // Device scratch for T tokens and the step's metadata (grows, never shrinks).
  Status EnsureScratch(int64_t T, int64_t meta_ints);
  Status PrepareStep(const ForwardBatch& batch);
  void RunLayer(int il);

  const DecoderModel& host_;
  backend::Device* dev_;
  std::vector<void*> allocs_;  // everything this model allocated on the device
  int64_t weight_bytes_ = 0;

  backend::DeviceMatrix tok_embd_, output_;
  const float* output_norm_ = nullptr;
  std::vector<Layer> layers_;
  const float* inv_freq_ = nullptr;
  const float* inv_freq_local_ = nullptr;

  // KV cache
  std::vector<kernels::KvLayerView> kv_;
  int64_t num_blocks_ = 0;
  int block_size_ = 0;

  // Scratch
  int64_t scratch_tokens_ = 0, meta_capacity_ = 0, logit_capacity_ = 0;
  float *x_ = nullptr, *h_ = nullptr, *q_ = nullptr, *k_ = nullptr, *v_ = nullptr;
  float *attn_ = nullptr, *o_ = nullptr, *gate_ = nullptr, *up_ = nullptr, *logits_ = nullptr;
  int32_t* meta_ = nullptr;
  // This step
  backend::StepBatch step_;
  std::vector<int32_t> meta_host_;  // tokens, pos, slot, seq_of_token, table offsets, tables,
                                    // logit rows -- uploaded in one copy
  std::vector<int32_t> seq_first_, seq_n_;
  std::vector<const int32_t*> tables_;
  int64_t logit_rows_ = 0;
  const int32_t* d_logit_rows_ = nullptr;
};

}  // namespace peng
