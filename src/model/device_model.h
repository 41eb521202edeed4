// DeviceModel: a loaded model's forward pass on a backend::Device -- the same graph as the CPU
// model, op for op, with the weights uploaded once in their stored types, the paged KV cache in
// device memory (the same block ids and layout as on the CPU) and one host round trip per
// step: the batch's tokens, positions, KV slots, block tables and logit rows go up in one copy,
// the logit rows come back -- or, for rows sampled from their best logits alone (greedy,
// top-k: SeqBatchEntry::top_logits), those best logits (Device::TopLogits), and for rows of
// plain temperature sampling their best logit and the token drawn (Device::DrawTokens). It is
// built from the loaded host model, which keeps the host side (the mapped file, the config, the
// tensor checks) and is the CPU reference it is tested against (tests/device).
//
// This class holds what every graph shares (memory, the KV cache, the step's metadata, the
// embedding lookup and the LM head); a subclass per family runs the layers:
//   DeviceDecoderModel  (layers/decoder.h: Llama, Qwen2, Gemma 3)      model/device_model.cc
//   DeviceDeepseekModel (deepseek2/deepseek2.h: MLA + DeepSeekMoE)      model/deepseek2/
//                                                                       deepseek2_device.cc
// Tensor parallelism: the host model is a shard (layers/decoder.h, deepseek2/deepseek2.h); the
// device graph sums the row-parallel outputs and the vocabulary-parallel embedding with the
// device's collectives (Device::CreateCommunicator over the host group: NCCL on CUDA) and
// gathers the logit columns on the host of rank 0. Data parallelism needs nothing here (each
// replica's executor is a device executor; DeepSeek's expert parallelism across them
// exchanges the MoE layers' tokens with the device's collectives too). INT8 folders run in
// their scheme (W8A16, or W8A8: DeviceMatrix::int8_activations). Not yet on a device:
// DeepSeek's expanded prefill form (the absorbed form serves every step: prefill tokens multiply
// the FP32 kv_b, decodes the per-head k_b / v_b where the file stores them, backend::MlaWeights).
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <utility>
#include <vector>

#include "backend/device.h"
#include "model/layers/linear.h"
#include "model/layers/tensor_parallel.h"
#include "model/model.h"
#include "parallel/communicator.h"

namespace peng {

class DeviceModel {
 public:
  // `model` on `device` (both must outlive the result): a DecoderModel or DeepseekV2Model.
  static StatusOr<std::unique_ptr<DeviceModel>> Create(const Model& model,
                                                       backend::Device* device);
  virtual ~DeviceModel();

  // Allocates the paged KV cache in device memory: num_blocks blocks of block_size tokens.
  Status AllocateKvCache(int64_t num_blocks, int block_size, DType dtype);
  // Before AllocateKvCache: runs one step of the largest shape the engine schedules --
  // max_tokens tokens (a prompt chunk and min(max_seqs, max_tokens) - 1 decodes), a logit row
  // a sequence -- over a KV cache of its own, freed after with the steps recorded over it, so
  // that the scratch a step grows (the model's, and the device's: the FP16 copy of a quantized
  // matrix, cuBLAS's workspace) is held before the KV cache takes the rest of the memory
  // (vLLM's profile run). Every rank of a tensor-parallel group calls it with the same shape
  // (the step's collectives). Not held ahead: prompt logits (rows for every token), a
  // grammar's masks, block tables longer than the step's.
  Status ReserveStepScratch(int64_t max_tokens, int64_t max_seqs, int block_size, DType dtype);
  int64_t num_kv_blocks() const { return num_blocks_; }
  int block_size() const { return block_size_; }
  // Device bytes of weights uploaded.
  int64_t weight_bytes() const { return weight_bytes_; }
  // Copies block src to block dst in every layer (copy-on-write; ordered before the next step).
  void CopyBlock(int32_t src, int32_t dst);
  // Model::Forward on the device: NumLogitRows() rows of vocab_size logits into host `logits`.
  Status Forward(const ForwardBatch& batch, float* logits);
  // Threads that copy the logits on from the device's host memory (null: one).
  void set_host_pool(ThreadPool* pool) { host_pool_ = pool; }
  // The most best logits a row may ask for instead of the row (SeqBatchEntry::top_logits, into
  // ForwardBatch::top; Device::TopLogits on the device): 0 under tensor parallelism (the
  // vocabulary is split over the ranks) and with PENG_DEVICE_TOP_LOGITS=0 (whole rows, the
  // comparison of docs/devices.md).
  int top_logits_max() const;
  // Logit row `row` of the last Forward whole into host `dst` (a row that came back as its best
  // logits and needs the rest: Sampler::SampleNucleus), until the next Forward.
  Status CopyLogitRow(int64_t row, float* dst);
  // The best k (1 <= k <= Device::kTopLogitsWide, k <= vocab) of each of the last Forward's
  // logit rows `rows`, best first, into host val / idx [rows.size(), k]: a nucleus that reaches
  // past a row's best top_logits_max() (Sampler::SampleNucleus): kWideRows rows at a time
  // gathered on the device, their TopLogits in one launch and one copy; until the next
  // Forward. Where top_logits_max() > 0.
  Status CopyBestOfLogitRows(std::span<const int64_t> rows, int k, float* val, int32_t* idx);

 protected:
  DeviceModel(const Model& host, backend::Device* device) : host_(host), dev_(device) {}
  // Uploads the layers' weights (the subclass) after the shared ones.
  virtual Status UploadLayers() = 0;
  // Per-layer scratch for T tokens (the subclass; called when T grows).
  virtual Status EnsureLayerScratch(int64_t T) = 0;
  // One layer over step_: x_ in, x_ out. What fails on the host inside it (a copy of the
  // experts' routing back to the host) goes to layer_status_, which the step returns.
  virtual void RunLayer(int il) = 0;
  // Before the layers of a step of T > 0 tokens: what may fail (the subclass; e.g. the step's
  // exchange of token counts and its scratch for expert parallelism across replicas).
  virtual Status BeginLayers(int64_t T) { return OkStatus(); }
  // A step without tokens (a data-parallel replica with nothing scheduled whose host model
  // steps with all replicas, Model::StepsWithAllReplicas): the layers' collectives alone.
  virtual Status IdleStep() { return OkStatus(); }

  // The shared weights, then the layers'. `tp`: the host model's tensor-parallel group (null
  // alone): the device collectives are set up over it and the vocabulary split as the host's.
  Status Upload(const Linear& tok_embd, const Linear& output, const float* output_norm,
                Communicator* tp);
  StatusOr<backend::DeviceMatrix> Matrix(const Linear& l);
  StatusOr<const float*> Floats(const float* host, int64_t n);
  // A device scratch array of n floats (or ints), replacing *p (freed) when given.
  template <typename T>
  Status Scratch(int64_t n, T** p);
  // x_ += post_norm(the sum over the tensor-parallel ranks of W in, + bias): a block's output
  // projection W added to the residual stream. `product` runs W on the block's input into the
  // output it is given (MatMuls or GatedMatMuls); o is a [T, hidden] scratch. Alone and
  // without a post norm (RMSNorm with post.w, post.offset, post.eps: Gemma 3), the bias and
  // the add are folded into the product (MatMulOut::accumulate).
  struct PostNorm {
    const float* w = nullptr;
    float offset = 0.f, eps = 0.f;
  };
  template <typename Product>
  void Residual(const backend::DeviceMatrix& w, const float* bias, const PostNorm& post,
                float* o, Product product) {
    const int64_t T = step_.n_tokens, D = host_.config().hidden_size;
    if (!comm_ && !post.w) {
      product({&w, x_, bias, true});
      return;
    }
    product({&w, o});
    if (comm_) comm_->AllReduceSum(o, T * D);  // row parallel: each rank holds a share
    if (bias) dev_->AddBiasRows(o, bias, T, D);
    if (post.w) {
      dev_->AddRmsNorm(x_, o, post.w, post.offset, T, D, post.eps);
    } else {
      dev_->Add(x_, o, T * D);
    }
  }

  const Model& host_;
  backend::Device* dev_;
  // The device's collectives (tensor parallel; else null): the device's own communicator, or the
  // host group itself when that works on the device's memory (the host device).
  Communicator* comm_ = nullptr;
  std::unique_ptr<Communicator> own_comm_;
  // The layers' collectives of their own (expert parallelism across replicas; null: none) and
  // the rows they and the ops between them take this step (set by BeginLayers, before the step
  // is recorded: part of its shape). Such a step is recorded only where that communicator's
  // collectives can be and those rows are at most kGraphMaxTokens (no op allocates then).
  Communicator* layer_comm_ = nullptr;
  int64_t layer_rows_ = 0;
  bool layer_host_sync_ = false;  // the layers wait for the host this step: never recorded
  Status layer_status_;  // (RunLayer's first host-side failure in this step)
  std::vector<void*> allocs_;  // everything this model allocated on the device
  int64_t weight_bytes_ = 0;

  std::vector<kernels::KvLayerView> kv_;
  float* x_ = nullptr;  // the residual stream [T, hidden]
  float* h_ = nullptr;  // [T, hidden] scratch (normed input; the logit rows at the end)
  backend::StepBatch step_;

 private:
  Status PrepareStep(const ForwardBatch& batch);
  // The step's results to the host: batch.top (its rows' best logits) when top_k > 0, the
  // other rows whole into `logits`.
  Status CopyLogits(const ForwardBatch& batch, int top_k, bool draws, float* logits);
  int64_t DrawnDoublesAt(int top_k) const;
  Status UploadEdits(const ForwardBatch& batch, bool masked);
  backend::Device::DrawResults Drawn(int top_k);
  Status EnsureScratch(int64_t T, int64_t meta_ints);
  void FreeKvCache();

  backend::DeviceMatrix tok_embd_, output_;
  Communicator* host_tp_ = nullptr;
  VocabParallel vocab_;             // this rank's embedding / LM head rows (tensor parallel)
  // The step's logit rows on the host as they come back: device-copyable host memory
  // (Device::AllocHost) where the device has it, else local_logits_.
  float* host_logits_ = nullptr;
  int64_t host_logits_n_ = 0;  // the largest size asked for (host_logits_ may be null)
  ThreadPool* host_pool_ = nullptr;  // copies them on to the caller's array
  std::vector<float> local_logits_;  // this rank's logit columns on the host (tensor parallel)
  const float* output_norm_ = nullptr;
  int64_t num_blocks_ = 0;
  int block_size_ = 0;
  int64_t scratch_tokens_ = 0, meta_capacity_ = 0, logit_capacity_ = 0;
  float* logits_ = nullptr;
  // TopLogits' [val | idx | first_bad] and DrawTokens' results (Drawn) of logit_capacity_ rows
  // at k = top_logits_max(), its scratch (an allocation of its own: the CUDA kernels' 8-byte
  // keys need the alignment), and the host copy of a step's results.
  int32_t* top_ = nullptr;
  int32_t* top_scratch_ = nullptr;
  std::vector<int32_t> top_host_;
  // CopyBestOfLogitRows' [val | idx] of kWideRows rows at k up to Device::kTopLogitsWide, then
  // their first_bad and their row ids; the rows gathered (a launch and a copy for kWideRows);
  // its TopLogits scratch (allocated with top_, once); its host copy.
  static constexpr int64_t kWideRows = 16;
  int32_t* wide_ = nullptr;
  float* wide_rows_ = nullptr;
  int32_t* wide_scratch_ = nullptr;
  std::vector<int32_t> wide_host_;
  int32_t* meta_ = nullptr;
  // This step: the logit rows' draws (Device::TokenDraw), tokens, pos, slot, seq_of_token, table
  // offsets, the sequences' first tokens, logit rows, tables -- uploaded in one copy (the host
  // side of step_ points into it).
  std::vector<int32_t> meta_host_;
  std::vector<int64_t> pos_;           // PrepareStep's scratch (reused)
  std::vector<int32_t> seq_of_token_;
  std::vector<int32_t> seq_n_;
  std::vector<const int32_t*> tables_;
  int64_t logit_rows_ = 0;
  const int32_t* d_logit_rows_ = nullptr;
  const backend::Device::TokenDraw* d_draws_ = nullptr;  // [logit rows], meta_'s start
  // The step's LogitEdits (UploadEdits): [logit rows] Device::LogitEditRow, in a step with a
  // grammar's mask [logit rows] slots of MaskWords() words, then the edits.
  int32_t* edits_ = nullptr;
  int64_t edits_capacity_ = 0;
  std::vector<backend::Device::LogitEditRow> edit_rows_;
  std::vector<backend::Device::LogitEdit> edit_list_;
  std::vector<uint32_t> mask_host_;  // the masks' slots from the first masked row's to the last's
  std::vector<std::pair<int64_t, const std::vector<uint32_t>*>> mask_rows_;  // (logit row, mask)
  // A mask's words: a bit a logit (grammar::MaskWords of the vocabulary).
  int64_t MaskWords() const { return (output_.rows + 31) / 32; }
  // Where UploadEdits puts the masks' slots and the edits in edits_ (ints; the rows at 0).
  int64_t MasksAt() const { return 8 * logit_rows_; }
  int64_t EditsAt(bool masked) const {
    return MasksAt() + (masked ? logit_rows_ * MaskWords() : 0);
  }
  // Steps replayed as graphs: decode sizes, up to 64 sequences (the CUDA backend's GEMV sizes).
  static constexpr int64_t kGraphMaxTokens = 64;
};

// The families' device graphs (DeviceModel::Create picks by the host model's type).
class DecoderModel;
class DeepseekV2Model;
StatusOr<std::unique_ptr<DeviceModel>> CreateDeviceDecoder(const DecoderModel& model,
                                                           backend::Device* device);
StatusOr<std::unique_ptr<DeviceModel>> CreateDeviceDeepseek(const DeepseekV2Model& model,
                                                            backend::Device* device);

}  // namespace peng
