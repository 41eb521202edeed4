#include "model/device_model.h"

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "model/deepseek2/deepseek2.h"
#include "model/layers/decoder.h"

namespace peng {

using backend::DeviceMatrix;

StatusOr<std::unique_ptr<DeviceModel>> DeviceModel::Create(const Model& model,
                                                           backend::Device* device) {
  if (const auto* d = dynamic_cast<const DecoderModel*>(&model))
    return CreateDeviceDecoder(*d, device);
  if (const auto* d = dynamic_cast<const DeepseekV2Model*>(&model))
    return CreateDeviceDeepseek(*d, device);
  return Unimplemented("architecture " + model.config().arch + " has no device graph");
}

DeviceModel::~DeviceModel() {
  (void)dev_->Synchronize();
  for (void* p : allocs_) dev_->Free(p);
  dev_->FreeHost(host_logits_);
}

StatusOr<DeviceMatrix> DeviceModel::Matrix(const Linear& l) {
  StatusOr<DeviceMatrix> m = dev_->Upload(l.tensor(), l.int8_scales());
  if (!m.ok()) return m.status();
  m->int8_activations = l.int8_activations();
  if (m->data != l.tensor().data) {  // a copy on the device (the host device keeps the file's)
    allocs_.push_back(const_cast<void*>(m->data));
    if (m->scales) allocs_.push_back(const_cast<float*>(m->scales));
  }
  weight_bytes_ += static_cast<int64_t>(RowBytes(m->dtype, m->cols)) * m->rows;  // (the file's)
  return m;
}

StatusOr<const float*> DeviceModel::Floats(const float* host, int64_t n) {
  if (!host) return static_cast<const float*>(nullptr);
  PENG_ASSIGN_OR_RETURN(float* p, dev_->UploadFloats(host, n));
  allocs_.push_back(p);
  return static_cast<const float*>(p);
}

template <typename T>
Status DeviceModel::Scratch(int64_t n, T** p) {
  dev_->ClearGraphs();  // (recorded steps point at the old buffers)
  if (*p) {
    dev_->Free(*p);
    allocs_.erase(std::find(allocs_.begin(), allocs_.end(), static_cast<void*>(*p)));
  }
  PENG_ASSIGN_OR_RETURN(void* q, dev_->Alloc(n * static_cast<int64_t>(sizeof(T))));
  allocs_.push_back(q);
  *p = static_cast<T*>(q);
  return OkStatus();
}
template Status DeviceModel::Scratch<float>(int64_t, float**);
template Status DeviceModel::Scratch<int32_t>(int64_t, int32_t**);

Status DeviceModel::Upload(const Linear& tok_embd, const Linear& output,
                           const float* output_norm, Communicator* tp) {
  if (tp && tp->size() > 1) {
    host_tp_ = tp;
    PENG_RETURN_IF_ERROR(vocab_.Plan(host_.config().vocab_size, tp, "the device model"));
    PENG_ASSIGN_OR_RETURN(own_comm_, dev_->CreateCommunicator(tp));
    comm_ = own_comm_ ? own_comm_.get() : tp;
  }
  PENG_ASSIGN_OR_RETURN(tok_embd_, Matrix(tok_embd));
  if (&output.tensor() == &tok_embd.tensor()) {
    output_ = tok_embd_;
  } else {
    PENG_ASSIGN_OR_RETURN(output_, Matrix(output));
  }
  PENG_ASSIGN_OR_RETURN(output_norm_, Floats(output_norm, host_.config().hidden_size));
  PENG_RETURN_IF_ERROR(UploadLayers());
  return dev_->Synchronize();
}

int DeviceModel::top_logits_max() const {
  static const bool on = [] {
    const char* e = std::getenv("PENG_DEVICE_TOP_LOGITS");
    return !(e && std::string(e) == "0");
  }();
  return !on || host_tp_ || output_.rows < backend::Device::kTopLogitsMax
             ? 0
             : backend::Device::kTopLogitsMax;
}

Status DeviceModel::AllocateKvCache(int64_t num_blocks, int block_size, DType dtype) {
  if (!kv_.empty()) return Internal("the device KV cache is already allocated");
  const KvCacheSpec spec = host_.kv_spec();
  PENG_RETURN_IF_ERROR(spec.CheckDtype(dtype));  // (every type it takes, devices take)
  for (size_t il = 0; il < spec.layers.size(); ++il) {
    int64_t k_bytes, v_bytes;
    kernels::KvLayerView v =
        spec.LayerView(static_cast<int>(il), num_blocks, block_size, dtype, &k_bytes, &v_bytes);
    PENG_ASSIGN_OR_RETURN(v.k, dev_->Alloc(k_bytes));
    allocs_.push_back(v.k);
    if (v_bytes > 0) {  // (an MLA latent cache has no V)
      PENG_ASSIGN_OR_RETURN(v.v, dev_->Alloc(v_bytes));
      allocs_.push_back(v.v);
    }
    kv_.push_back(v);
  }
  num_blocks_ = num_blocks;
  block_size_ = block_size;
  return OkStatus();
}

void DeviceModel::FreeKvCache() {
  (void)dev_->Synchronize();
  for (const kernels::KvLayerView& v : kv_) {
    for (void* p : {static_cast<void*>(v.k), static_cast<void*>(v.v)}) {
      if (!p) continue;
      dev_->Free(p);
      allocs_.erase(std::find(allocs_.begin(), allocs_.end(), p));
    }
  }
  kv_.clear();
  num_blocks_ = 0;
  block_size_ = 0;
  dev_->ClearGraphs();  // (recorded steps point at the freed cache)
}

Status DeviceModel::ReserveStepScratch(int64_t max_tokens, int64_t max_seqs, int block_size,
                                       DType dtype) {
  if (!kv_.empty()) return Internal("the step scratch is reserved before the KV cache");
  if (max_tokens < 1 || max_seqs < 1 || block_size < 1)
    return InvalidArgument("the largest step: tokens, sequences and block size must be >= 1");
  const int64_t S = std::min(max_seqs, max_tokens), chunk = max_tokens - (S - 1);
  const int64_t chunk_blocks = (chunk + block_size - 1) / block_size;
  PENG_RETURN_IF_ERROR(AllocateKvCache(chunk_blocks + S - 1, block_size, dtype));
  std::vector<int32_t> table(chunk_blocks + S - 1);
  for (size_t i = 0; i < table.size(); ++i) table[i] = static_cast<int32_t>(i);
  ForwardBatch batch;
  batch.tokens.assign(max_tokens, 0);  // (an id of every vocabulary)
  TopLogits top;
  batch.top = &top;
  const int top_k = std::min(1, top_logits_max());  // rows as the engine asks for them
  for (int64_t s = 0; s < S; ++s) {
    SeqBatchEntry e;
    e.n_tokens = s == 0 ? chunk : 1;
    e.block_table = table.data() + (s == 0 ? 0 : chunk_blocks + s - 1);
    e.n_blocks = s == 0 ? chunk_blocks : 1;
    e.top_logits = top_k;
    batch.seqs.push_back(e);
  }
  std::vector<float> logits(top_k > 0 ? 1 : S * host_.config().vocab_size);
  Status st = Forward(batch, logits.data());
  if (st.ok()) st = dev_->Synchronize();
  FreeKvCache();
  if (!st.ok())
    return Status(st.code(), "the largest step (" + std::to_string(max_tokens) + " tokens, " +
                                 std::to_string(S) + " sequences; --max-num-batched-tokens, " +
                                 "--max-num-seqs) does not run on the device: " + st.message());
  return OkStatus();
}

void DeviceModel::CopyBlock(int32_t src, int32_t dst) {
  for (const kernels::KvLayerView& v : kv_) dev_->CopyKvBlock(v, src, dst);
}

Status DeviceModel::EnsureScratch(int64_t T, int64_t meta_ints) {
  const ModelConfig& c = host_.config();
  if (meta_ints > meta_capacity_) {
    const int64_t n = std::max(meta_ints, 2 * meta_capacity_);
    PENG_RETURN_IF_ERROR(Scratch(n, &meta_));
    meta_capacity_ = n;
  }
  if (logit_rows_ > logit_capacity_) {  // rows of logits: often far fewer than tokens
    PENG_RETURN_IF_ERROR(Scratch(logit_rows_ * output_.rows, &logits_));
    if (top_logits_max() > 0) {  // TopLogits' results, then its scratch
      const int64_t bytes = dev_->TopLogitsScratchBytes(logit_rows_, output_.rows,
                                                        top_logits_max());
      PENG_RETURN_IF_ERROR(Scratch(DrawnDoublesAt(top_logits_max()) + 4 * logit_rows_, &top_));
      PENG_RETURN_IF_ERROR(Scratch((bytes + 3) / 4, &top_scratch_));  // (aligned as allocated)
      if (!wide_) {  // (CopyBestOfLogitRows' k: up to kTopLogitsWide, its scratch's largest)
        const int k = backend::Device::kTopLogitsWide;
        PENG_RETURN_IF_ERROR(Scratch(kWideRows * (2 * k + 2), &wide_));
        PENG_RETURN_IF_ERROR(Scratch(kWideRows * output_.rows, &wide_rows_));
        const int64_t most =
            std::max(dev_->TopLogitsScratchBytes(kWideRows, output_.rows, k),
                     dev_->TopLogitsScratchBytes(kWideRows, output_.rows, top_logits_max()));
        PENG_RETURN_IF_ERROR(Scratch((most + 3) / 4, &wide_scratch_));
      }
    }
    logit_capacity_ = logit_rows_;
  }
  if (T <= scratch_tokens_) return OkStatus();
  PENG_RETURN_IF_ERROR(Scratch(T * c.hidden_size, &x_));
  PENG_RETURN_IF_ERROR(Scratch(T * c.hidden_size, &h_));
  PENG_RETURN_IF_ERROR(EnsureLayerScratch(T));
  scratch_tokens_ = T;
  return OkStatus();
}

Status DeviceModel::PrepareStep(const ForwardBatch& batch) {
  const int64_t T = static_cast<int64_t>(batch.tokens.size());
  const int64_t S = static_cast<int64_t>(batch.seqs.size());
  pos_.resize(T);
  seq_of_token_.resize(T);
  PENG_RETURN_IF_ERROR(PrepareBatch(batch, num_blocks_, block_size_, host_.config().vocab_size,
                                    pos_.data(), seq_of_token_.data()));
  int64_t n_tables = 0;
  for (const SeqBatchEntry& s : batch.seqs) n_tables += s.n_blocks;
  logit_rows_ = batch.NumLogitRows();
  // A Device::TokenDraw a logit row first (16 bytes, 4 values: the arena's start is aligned)
  const int64_t draw_ints = 4 * logit_rows_;
  meta_host_.assign(draw_ints + 4 * T + 2 * S + 1 + n_tables + logit_rows_, 0);
  int32_t* tokens = meta_host_.data() + draw_ints;
  int32_t* p32 = tokens + T;
  int32_t* slot = p32 + T;
  int32_t* sot = slot + T;
  int32_t* offs = sot + T;
  int32_t* firsts = offs + S;  // [S + 1]
  int32_t* rows = firsts + S + 1;  // (before the tables: their count then places nothing)
  int32_t* tables = rows + logit_rows_;
  seq_n_.resize(S);
  tables_.resize(S);
  int64_t t = 0, off = 0, r = 0;
  for (int64_t si = 0; si < S; ++si) {
    const SeqBatchEntry& s = batch.seqs[si];
    firsts[si] = static_cast<int32_t>(t);
    seq_n_[si] = static_cast<int32_t>(s.n_tokens);
    tables_[si] = s.block_table;
    offs[si] = static_cast<int32_t>(off);
    std::copy(s.block_table, s.block_table + s.n_blocks, tables + off);
    off += s.n_blocks;
    if (s.want_logits) {
      if (!s.all_logits && s.top_logits > 0 && (s.draw_inv_temperature > 0 || s.log_total)) {
        const backend::Device::TokenDraw d{
            s.draw_inv_temperature, s.log_total ? backend::Device::kLogSoftmaxTotal : 0u,
            s.draw_uniform};
        std::memcpy(meta_host_.data() + 4 * r, &d, sizeof(d));
      }
      for (int64_t i = s.all_logits ? 0 : s.n_tokens - 1; i < s.n_tokens; ++i)
        rows[r++] = static_cast<int32_t>(t + i);
    }
    t += s.n_tokens;
  }
  firsts[S] = static_cast<int32_t>(T);
  for (int64_t i = 0; i < T; ++i) {
    tokens[i] = batch.tokens[i];
    p32[i] = static_cast<int32_t>(pos_[i]);
    sot[i] = seq_of_token_[i];
    const int32_t* table = batch.seqs[seq_of_token_[i]].block_table;
    slot[i] = table[pos_[i] / block_size_] * block_size_ +
              static_cast<int32_t>(pos_[i] % block_size_);
  }
  PENG_RETURN_IF_ERROR(EnsureScratch(T, static_cast<int64_t>(meta_host_.size())));
  PENG_RETURN_IF_ERROR(dev_->CopyToDevice(meta_, meta_host_.data(),
                                          static_cast<int64_t>(meta_host_.size() * 4)));
  backend::StepBatch& b = step_;
  b.n_tokens = T;
  b.n_seqs = S;
  b.pos = p32;
  b.seq_of_token = sot;
  b.seq_first_token = firsts;
  b.seq_n_tokens = seq_n_.data();
  b.block_tables = tables_.data();
  d_draws_ = reinterpret_cast<const backend::Device::TokenDraw*>(meta_);
  const int32_t* m = meta_ + draw_ints;
  b.d_tokens = m;
  b.d_pos = m + T;
  b.d_slot = m + 2 * T;
  b.d_seq_of_token = m + 3 * T;
  b.d_table_offset = m + 4 * T;
  b.d_seq_first_token = m + 4 * T + S;
  d_logit_rows_ = m + 4 * T + 2 * S + 1;
  b.d_tables = d_logit_rows_ + logit_rows_;
  return OkStatus();
}

Status DeviceModel::Forward(const ForwardBatch& batch, float* logits) {
  const ModelConfig& c = host_.config();
  const int64_t T = static_cast<int64_t>(batch.tokens.size());
  const int64_t D = c.hidden_size;
  if (kv_.empty()) return Internal("the device KV cache is not allocated");
  if (T == 0) return IdleStep();
  PENG_RETURN_IF_ERROR(PrepareStep(batch));
  PENG_RETURN_IF_ERROR(BeginLayers(T));
  std::vector<float>* cap = batch.capture_hidden;
  // A small step (decode) without captures -- and without collectives, but where the device's
  // communicators record them (NCCL inside CUDA graphs: tensor parallelism, and expert
  // parallelism across replicas of at most kGraphMaxTokens rows in all) -- is recorded once
  // per shape and then replayed (Device::LaunchGraph: CUDA graphs); the shape is everything a
  // kernel launch of the step depends on -- token, sequence and logit-row counts (they size
  // the launches and place the metadata arrays; the block tables come last, so that a sequence
  // growing by a block does not make a new shape), the layers' rows -- and the scratch
  // buffers stay where they are until they grow, which drops the recordings.
  const std::vector<float>* replace = batch.replace_hidden;
  if (replace && static_cast<int64_t>(replace->size()) < (c.n_layers + 1) * T * D)
    return InvalidArgument("replace_hidden: fewer than (layers + 1) x tokens x hidden values");
  // The step's TopLogits k: the most any of its rows asks for (0: whole rows only); whether a
  // row asks for DrawTokens' sums or draw, and whether one is changed first (EditLogits).
  int top_k = 0;
  bool draws = false, edited = false, masked = false;
  for (const SeqBatchEntry& s : batch.seqs) {
    if (!batch.top || !s.want_logits || s.top_logits <= 0) continue;
    if (s.all_logits || s.top_logits > top_logits_max())
      return InvalidArgument("top_logits " + std::to_string(s.top_logits) +
                             " for a row (this device model: up to " +
                             std::to_string(top_logits_max()) + ", no prompt logits)");
    top_k = std::max(top_k, s.top_logits);
    draws = draws || s.draw_inv_temperature > 0 || s.log_total;
    edited = edited || (s.edits && !s.edits->empty());
    masked = masked || (s.edits && !s.edits->allow.empty());
  }
  if (edited) PENG_RETURN_IF_ERROR(UploadEdits(batch, masked));
  const bool graph = dev_->SupportsGraphs() && (!comm_ || comm_->InDeviceGraphs()) &&
                     (!layer_comm_ || (layer_comm_->InDeviceGraphs() &&
                                       layer_rows_ <= kGraphMaxTokens && !layer_host_sync_)) &&
                     !cap && !replace && T <= kGraphMaxTokens;
  // The shape's fields, 8 bits each (T, its sequences and logit rows are at most 64 here, the
  // layers' rows too; top_k at most 256: 9 bits), then the three flags.
  const uint64_t key = static_cast<uint64_t>(T) | static_cast<uint64_t>(step_.n_seqs) << 8 |
                       static_cast<uint64_t>(logit_rows_) << 16 |
                       static_cast<uint64_t>(layer_rows_) << 24 |
                       static_cast<uint64_t>(top_k) << 32 | static_cast<uint64_t>(masked) << 41 |
                       static_cast<uint64_t>(edited) << 42 | static_cast<uint64_t>(draws) << 43;
  if (!graph || !dev_->LaunchGraph(key)) {
    if (graph) dev_->BeginGraph();
    dev_->EmbedRows(tok_embd_, step_, c.embed_scale, x_, host_tp_ ? vocab_.begin() : 0);
    if (comm_) comm_->AllReduceSum(x_, T * D);  // each token's row came from one rank
    auto capture = [&]() -> Status {
      if (!cap) return OkStatus();
      const size_t n = cap->size();
      cap->resize(n + T * D);
      return dev_->CopyToHost(cap->data() + n, x_, T * D * 4);
    };
    if (cap) cap->clear();
    PENG_RETURN_IF_ERROR(capture());
    for (int il = 0; il < c.n_layers; ++il) {
      if (replace)
        PENG_RETURN_IF_ERROR(dev_->CopyToDevice(x_, replace->data() + il * T * D, T * D * 4));
      RunLayer(il);
      if (!layer_status_.ok()) return std::exchange(layer_status_, OkStatus());
      PENG_RETURN_IF_ERROR(capture());
    }
    if (logit_rows_ > 0) {
      // The rows that need logits, normalised, projected: every row of the step in order (a
      // decode step) straight from x_ into h_, else gathered into h_ and normalised into x_
      // (free now) -- never in place, so that the norm may run inside the head's GEMV.
      const float* rows = x_;
      float* normed = h_;
      if (logit_rows_ < T) {
        dev_->GatherRows(x_, d_logit_rows_, logit_rows_, D, h_);
        rows = h_;
        normed = x_;
      }
      dev_->NormMatMuls(rows, output_norm_, c.norm_weight_offset, c.rms_eps, normed, logit_rows_,
                        D, {{&output_, logits_}});  // [rows, this rank's vocabulary]
      if (c.final_logit_softcap > 0)
        dev_->Softcap(logits_, c.final_logit_softcap, logit_rows_ * output_.rows);
      if (top_k > 0) {  // (every row's; the whole rows' are not read)
        const int64_t R = logit_rows_;
        if (edited) {  // (the sampler's changes to the rows, first)
          dev_->EditLogits(
              logits_, R, output_.rows,
              reinterpret_cast<const backend::Device::LogitEditRow*>(edits_),
              reinterpret_cast<const backend::Device::LogitEdit*>(edits_ + EditsAt(masked)),
              masked ? reinterpret_cast<const uint32_t*>(edits_ + MasksAt()) : nullptr);
        }
        float* best = reinterpret_cast<float*>(top_);
        dev_->TopLogits(logits_, R, output_.rows, top_k, best, top_ + R * top_k,
                        top_ + 2 * R * top_k, top_scratch_);
        if (draws) dev_->DrawTokens(logits_, R, output_.rows, best, top_k, d_draws_, Drawn(top_k));
      }
    }
    if (graph) PENG_RETURN_IF_ERROR(dev_->EndGraph(key));
  }
  if (logit_rows_ > 0) PENG_RETURN_IF_ERROR(CopyLogits(batch, top_k, draws, logits));
  return dev_->Synchronize();
}

// The step's LogitEdits into edits_: a Device::LogitEditRow a logit row; in a step with a
// grammar's mask (masked), a slot of MaskWords() words a logit row (a row's at r * MaskWords(),
// uploaded where the row has one); then the edits. The layout is the step's shape's alone (a
// recorded step's EditLogits finds them where it was recorded).
Status DeviceModel::UploadEdits(const ForwardBatch& batch, bool masked) {
  using Row = backend::Device::LogitEditRow;
  using Edit = backend::Device::LogitEdit;
  static_assert(sizeof(Row) == 32 && sizeof(Edit) == 8);
  const int64_t R = logit_rows_, W = masked ? MaskWords() : 0;
  edit_rows_.assign(R, Row{0, 0, 0, 0, 1.0f, 0.0f, 0.0f, -1});
  edit_list_.clear();
  mask_rows_.clear();
  int64_t r = 0;
  for (const SeqBatchEntry& s : batch.seqs) {
    if (!s.want_logits) continue;
    if (s.all_logits) {
      r += s.n_tokens;
      continue;
    }
    Row& row = edit_rows_[r++];  // (none: an empty range)
    const LogitEdits* e = s.top_logits > 0 ? s.edits : nullptr;
    if (!e) continue;
    const auto at = [&] { return static_cast<int32_t>(edit_list_.size()); };
    row.bias = at();
    for (const auto& [id, v] : e->bias) edit_list_.push_back({id, v});
    row.ban = at();
    for (int32_t id : e->ban) edit_list_.push_back({id, 0.0f});
    row.history = at();
    for (const auto& [id, count] : e->history) edit_list_.push_back({id, count});
    row.end = at();
    row.repetition = e->repetition_penalty;
    row.presence = e->presence_penalty;
    row.frequency = e->frequency_penalty;
    if (e->allow.empty()) continue;
    if (static_cast<int64_t>(e->allow.size()) != W)
      return InvalidArgument("a grammar's mask of " + std::to_string(e->allow.size()) +
                             " words for a vocabulary of " + std::to_string(output_.rows));
    row.mask = static_cast<int32_t>((r - 1) * W);
    mask_rows_.push_back({r - 1, &e->allow});
  }
  const int64_t ints = EditsAt(masked) + 2 * static_cast<int64_t>(edit_list_.size());
  if (ints > edits_capacity_) {
    const int64_t n = std::max(ints, 2 * edits_capacity_);
    PENG_RETURN_IF_ERROR(Scratch(n, &edits_));
    edits_capacity_ = n;
  }
  PENG_RETURN_IF_ERROR(dev_->CopyToDevice(edits_, edit_rows_.data(), R * sizeof(Row)));
  if (!mask_rows_.empty()) {  // (the slots from the first masked row's to the last's, one copy)
    const int64_t first = mask_rows_.front().first;
    mask_host_.resize((mask_rows_.back().first - first + 1) * W);
    for (const auto& [row, allow] : mask_rows_)
      std::copy(allow->begin(), allow->end(), mask_host_.begin() + (row - first) * W);
    PENG_RETURN_IF_ERROR(dev_->CopyToDevice(edits_ + MasksAt() + first * W, mask_host_.data(),
                                            mask_host_.size() * sizeof(uint32_t)));
  }
  if (edit_list_.empty()) return OkStatus();
  return dev_->CopyToDevice(edits_ + EditsAt(masked), edit_list_.data(),
                            edit_list_.size() * sizeof(Edit));
}

Status DeviceModel::CopyLogitRow(int64_t row, float* dst) {
  if (row < 0 || row >= logit_rows_)
    return InvalidArgument("logit row " + std::to_string(row) + " of " +
                           std::to_string(logit_rows_));
  return dev_->CopyToHost(dst, logits_ + row * output_.rows, output_.rows * 4);
}

Status DeviceModel::CopyBestOfLogitRows(std::span<const int64_t> rows, int k, float* val,
                                        int32_t* idx) {
  const int64_t V = output_.rows;
  if (!wide_) return Unimplemented("the device model returns no best logits");
  if (k < 1 || k > backend::Device::kTopLogitsWide || k > V)
    return InvalidArgument("the best " + std::to_string(k) + " of a logit row");
  // wide_: [val | idx] of n rows at k, first_bad, the rows' ids; the rows gathered.
  int32_t* d_ids = wide_ + kWideRows * (2 * backend::Device::kTopLogitsWide + 1);
  for (size_t r0 = 0; r0 < rows.size(); r0 += kWideRows) {
    const int64_t n = std::min<int64_t>(kWideRows, static_cast<int64_t>(rows.size() - r0));
    int32_t ids[kWideRows];
    for (int64_t i = 0; i < n; ++i) {
      if (rows[r0 + i] < 0 || rows[r0 + i] >= logit_rows_)
        return InvalidArgument("logit row " + std::to_string(rows[r0 + i]) + " of " +
                               std::to_string(logit_rows_));
      ids[i] = static_cast<int32_t>(rows[r0 + i]);
    }
    PENG_RETURN_IF_ERROR(dev_->CopyToDevice(d_ids, ids, n * sizeof(int32_t)));
    dev_->GatherRows(logits_, d_ids, n, V, wide_rows_);
    dev_->TopLogits(wide_rows_, n, V, k, reinterpret_cast<float*>(wide_), wide_ + n * k,
                    wide_ + 2 * n * k, wide_scratch_);
    wide_host_.resize(2 * n * k);
    PENG_RETURN_IF_ERROR(dev_->CopyToHost(wide_host_.data(), wide_, wide_host_.size() * 4));
    std::memcpy(val + r0 * k, wide_host_.data(), n * k * 4);
    std::memcpy(idx + r0 * k, wide_host_.data() + n * k, n * k * 4);
  }
  return OkStatus();
}

// DrawTokens' results in top_ after TopLogits' [val | idx | first_bad] at k = top_k: drawn,
// drawn_logit, then (at an even offset: 8-byte aligned) total and log_total.
int64_t DeviceModel::DrawnDoublesAt(int top_k) const {
  const int64_t at = (2 * top_k + 3) * logit_rows_;
  return at + at % 2;
}
backend::Device::DrawResults DeviceModel::Drawn(int top_k) {
  const int64_t R = logit_rows_;
  int32_t* d = top_ + (2 * top_k + 1) * R;
  auto* totals = reinterpret_cast<double*>(top_ + DrawnDoublesAt(top_k));
  return {d, reinterpret_cast<float*>(d + R), totals, totals + R};
}

Status DeviceModel::CopyLogits(const ForwardBatch& batch, int top_k, bool draws,
                               float* logits) {
  const int64_t R = logit_rows_, V = output_.rows;
  if (top_k > 0) {  // [val | idx | first_bad | DrawTokens' results] in one copy
    top_host_.resize(draws ? DrawnDoublesAt(top_k) + 4 * R : (2 * top_k + 1) * R);
    PENG_RETURN_IF_ERROR(dev_->CopyToHost(top_host_.data(), top_, top_host_.size() * 4));
    TopLogits& t = *batch.top;
    t.k = top_k;
    t.val.resize(R * top_k);
    std::memcpy(t.val.data(), top_host_.data(), R * top_k * 4);
    t.idx.assign(top_host_.begin() + R * top_k, top_host_.begin() + 2 * R * top_k);
    const auto drawn = top_host_.begin() + (2 * top_k + 1) * R;
    t.first_bad.assign(top_host_.begin() + 2 * R * top_k, drawn);
    t.drawn.assign(R, -1);
    t.drawn_logit.assign(R, 0.f);
    t.total.assign(R, 0.0);
    t.log_total.assign(R, 0.0);
    if (draws) {  // (Drawn's layout)
      t.drawn.assign(drawn, drawn + R);
      std::memcpy(t.drawn_logit.data(), top_host_.data() + (2 * top_k + 2) * R, R * 4);
      const int32_t* d = top_host_.data() + DrawnDoublesAt(top_k);
      std::memcpy(t.total.data(), d, R * sizeof(double));
      std::memcpy(t.log_total.data(), d + 2 * R, R * sizeof(double));
    }
  }
  // The whole rows, in runs of consecutive ones: through the device's own host memory where it
  // has some (page-locked: a batch's logits are tens of megabytes), then on over the threads;
  // else straight into the caller's array.
  const bool any_whole = std::any_of(batch.seqs.begin(), batch.seqs.end(), [&](const auto& s) {
    return s.want_logits && (top_k == 0 || s.top_logits == 0);
  });
  if (!any_whole) return OkStatus();
  if (R * V > host_logits_n_) {  // (a device without host memory is asked once per size)
    dev_->FreeHost(host_logits_);
    host_logits_ = static_cast<float*>(dev_->AllocHost(R * V * 4));
    host_logits_n_ = R * V;
  }
  float* staged = host_logits_;
  if (host_tp_) {  // the ranks' columns meet on rank 0's host (every row whole)
    if (!staged) {
      local_logits_.resize(R * V);
      staged = local_logits_.data();
    }
    PENG_RETURN_IF_ERROR(dev_->CopyToHost(staged, logits_, R * V * 4));
    vocab_.GatherLogits(staged, R, logits);
    return OkStatus();
  }
  int64_t row = 0, run = 0;  // [run, row): whole rows not yet copied
  auto flush = [&]() -> Status {
    const int64_t b0 = run * V, n = (row - run) * V;
    run = row;
    if (n == 0) return OkStatus();
    if (!staged) return dev_->CopyToHost(logits + b0, logits_ + b0, n * 4);
    PENG_RETURN_IF_ERROR(dev_->CopyToHost(staged + b0, logits_ + b0, n * 4));
    auto copy = [&](int64_t b, int64_t e) {
      std::memcpy(logits + b0 + b, staged + b0 + b, (e - b) * sizeof(float));
    };
    host_pool_ ? host_pool_->ParallelFor(n, copy) : copy(0, n);
    return OkStatus();
  };
  for (const SeqBatchEntry& s : batch.seqs) {
    if (!s.want_logits) continue;
    if (top_k > 0 && s.top_logits > 0) {
      PENG_RETURN_IF_ERROR(flush());
      run = ++row;
    } else {
      row += s.all_logits ? s.n_tokens : 1;
    }
  }
  return flush();
}

// ---------------------------------------------------------------------------------------------
// The dense decoder families (layers/decoder.h).

class DeviceDecoderModel : public DeviceModel {
 public:
  DeviceDecoderModel(const DecoderModel& m, backend::Device* d) : DeviceModel(m, d), m_(m) {}
  Status Init() { return Upload(m_.tok_embd_, m_.output_, m_.output_norm_, m_.tp_); }

 private:
  struct Layer {
    const float* attn_norm = nullptr;
    DeviceMatrix wq, wk, wv, wo, w_gate, w_up, w_down;
    const float* bq = nullptr;
    const float* bk = nullptr;
    const float* bv = nullptr;
    const float* q_norm = nullptr;
    const float* k_norm = nullptr;
    const float* post_attn_norm = nullptr;
    const float* ffn_norm = nullptr;
    const float* post_ffn_norm = nullptr;
  };

  Status UploadLayers() override {
    const ModelConfig& c = m_.cfg_;
    const int64_t D = c.hidden_size, hd = c.head_dim;
    const int64_t qd = m_.n_heads_ * hd, kvd = m_.n_kv_heads_ * hd;
    layers_.resize(m_.layers_.size());
    for (size_t il = 0; il < m_.layers_.size(); ++il) {
      const DecoderModel::Layer& H = m_.layers_[il];
      Layer& L = layers_[il];
      PENG_ASSIGN_OR_RETURN(L.attn_norm, Floats(H.attn_norm, D));
      PENG_ASSIGN_OR_RETURN(L.wq, Matrix(H.wq));
      PENG_ASSIGN_OR_RETURN(L.wk, Matrix(H.wk));
      PENG_ASSIGN_OR_RETURN(L.wv, Matrix(H.wv));
      PENG_ASSIGN_OR_RETURN(L.wo, Matrix(H.wo));
      PENG_ASSIGN_OR_RETURN(L.bq, Floats(H.bq, qd));
      PENG_ASSIGN_OR_RETURN(L.bk, Floats(H.bk, kvd));
      PENG_ASSIGN_OR_RETURN(L.bv, Floats(H.bv, kvd));
      PENG_ASSIGN_OR_RETURN(L.q_norm, Floats(H.q_norm, hd));
      PENG_ASSIGN_OR_RETURN(L.k_norm, Floats(H.k_norm, hd));
      PENG_ASSIGN_OR_RETURN(L.post_attn_norm, Floats(H.post_attn_norm, D));
      PENG_ASSIGN_OR_RETURN(L.ffn_norm, Floats(H.ffn_norm, D));
      PENG_ASSIGN_OR_RETURN(L.post_ffn_norm, Floats(H.post_ffn_norm, D));
      PENG_ASSIGN_OR_RETURN(L.w_gate, Matrix(H.w_gate));
      PENG_ASSIGN_OR_RETURN(L.w_up, Matrix(H.w_up));
      PENG_ASSIGN_OR_RETURN(L.w_down, Matrix(H.w_down));
    }
    PENG_ASSIGN_OR_RETURN(inv_freq_, Floats(m_.inv_freq_.data(),
                                            static_cast<int64_t>(m_.inv_freq_.size())));
    if (!m_.inv_freq_local_.empty()) {
      PENG_ASSIGN_OR_RETURN(inv_freq_local_,
                            Floats(m_.inv_freq_local_.data(),
                                   static_cast<int64_t>(m_.inv_freq_local_.size())));
    }
    return OkStatus();
  }

  Status EnsureLayerScratch(int64_t T) override {
    const int64_t D = m_.cfg_.hidden_size, hd = m_.cfg_.head_dim;
    const int64_t qd = m_.n_heads_ * hd, kvd = m_.n_kv_heads_ * hd, F = m_.ffn_;
    for (auto [n, p] : {std::pair{D, &o_}, {qd, &q_}, {qd, &attn_}, {kvd, &k_}, {kvd, &v_},
                        {F, &gate_}, {F, &up_}})
      PENG_RETURN_IF_ERROR(Scratch(T * n, p));
    return OkStatus();
  }

  void RunLayer(int il) override {
    const ModelConfig& c = m_.cfg_;
    const Layer& L = layers_[il];
    const backend::StepBatch& b = step_;
    const int64_t T = b.n_tokens, D = c.hidden_size, hd = c.head_dim;
    const int64_t H = m_.n_heads_, KV = m_.n_kv_heads_, F = m_.ffn_;
    const bool sliding = !c.layer_sliding.empty() && c.layer_sliding[il];
    const kernels::RopeConfig& rope = sliding ? c.rope_local : c.rope;
    const float* inv_freq = sliding ? inv_freq_local_ : inv_freq_;
    backend::Device& d = *dev_;

    // --- attention block
    d.NormMatMuls(x_, L.attn_norm, c.norm_weight_offset, c.rms_eps, h_, T, D,
                  {{&L.wq, q_, L.bq}, {&L.wk, k_, L.bk}, {&L.wv, v_, L.bv}});
    backend::HeadNorms qk_norm;  // (Qwen3, Gemma 3: before the rotation)
    if (c.qk_norm) qk_norm = {L.q_norm, L.k_norm, c.norm_weight_offset, c.rms_eps, hd};
    const backend::Device::RopeKv rope_kv{
        {q_, H, hd, H * hd}, {k_, KV, hd, KV * hd}, &rope, inv_freq, k_, v_, {}, qk_norm};
    kernels::AttentionParams ap;
    ap.n_heads = static_cast<int>(H);
    ap.scale = c.AttentionScale();
    ap.sliding_window = sliding ? c.sliding_window : 0;
    Residual(L.wo, nullptr, {L.post_attn_norm, c.norm_weight_offset, c.rms_eps}, o_,
             [&](const backend::Device::MatMulOut& o) {
               d.AttentionMatMuls(q_, kv_[il], b, ap, attn_, {o}, &rope_kv);
             });

    // --- feed-forward block
    d.NormMatMuls(x_, L.ffn_norm, c.norm_weight_offset, c.rms_eps, h_, T, D,
                  {{&L.w_gate, gate_}, {&L.w_up, up_}});
    const auto act = c.activation == Activation::kSilu ? backend::GatedActivation::kSilu
                                                       : backend::GatedActivation::kGeluTanh;
    Residual(L.w_down, nullptr, {L.post_ffn_norm, c.norm_weight_offset, c.rms_eps}, o_,
             [&](const backend::Device::MatMulOut& o) {
               d.GatedMatMuls(act, gate_, up_, gate_, T, F, {o});
             });
  }

  const DecoderModel& m_;
  std::vector<Layer> layers_;
  const float* inv_freq_ = nullptr;
  const float* inv_freq_local_ = nullptr;
  float *q_ = nullptr, *k_ = nullptr, *v_ = nullptr, *attn_ = nullptr, *o_ = nullptr;
  float *gate_ = nullptr, *up_ = nullptr;
};

StatusOr<std::unique_ptr<DeviceModel>> CreateDeviceDecoder(const DecoderModel& model,
                                                           backend::Device* device) {
  auto m = std::make_unique<DeviceDecoderModel>(model, device);
  PENG_RETURN_IF_ERROR(m->Init());
  return std::unique_ptr<DeviceModel>(std::move(m));
}

}  // namespace peng
