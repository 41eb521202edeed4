#include "engine/executor.h"

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <exception>
#include <limits>
#include <string>
#include <vector>

#include "engine/engine.h"
#include "kernels/ops.h"
#include "model/registry.h"

namespace peng {
namespace {

int64_t PhysicalMemoryBytes() {
  return static_cast<int64_t>(::sysconf(_SC_PHYS_PAGES)) * ::sysconf(_SC_PAGE_SIZE);
}

class LocalExecutor : public Executor {
 public:
  LocalExecutor(int threads, std::unique_ptr<Model> model, std::unique_ptr<KvCache> kv)
      : pool_(threads), model_(std::move(model)), kv_(std::move(kv)) {}

  const ModelConfig& config() const override { return model_->config(); }
  int64_t num_kv_blocks() const override { return kv_->num_blocks(); }
  int block_size() const override { return static_cast<int>(kv_->block_size()); }
  Status Execute(const ForwardBatch& batch, std::span<const BlockCopy> copies,
                 float* logits) override {
    return GuardForwardPass([&] {
      for (const BlockCopy& cp : copies) kv_->CopyBlock(cp.src, cp.dst);
      return model_->Forward(batch, kv_.get(), logits, &pool_);
    });
  }
  Model& model() override { return *model_; }
  ThreadPool& pool() override { return pool_; }

 private:
  ThreadPool pool_;
  std::unique_ptr<Model> model_;
  std::unique_ptr<KvCache> kv_;
};

// The batch as rank 0 broadcasts it: a header of int64 counts, then the payload.
struct BatchHeader {
  int64_t n_tokens = 0;
  int64_t n_seqs = 0;    // -1: this engine core is done (its executor was destroyed)
  int64_t n_blocks = 0;  // block-table entries of all sequences
  int64_t n_copies = 0;
  int64_t capture_hidden = 0;
};

// What rank 0 broadcasts when it creates (or fails to create) an engine core, and at the end.
struct CoreStart {
  int64_t num_kv_blocks = 0;  // < 1: no core (rank 0 failed to set it up)
  int64_t block_size = 0;
  int64_t kv_dtype = 0;
  int64_t job_over = 0;       // 1: no more cores; the workers return
  int64_t exact = 0;          // kernels::ExactActivations() of rank 0
  int64_t expert_parallel = 0;  // rank 0's options.enable_expert_parallel
  int64_t fit_devices = 0;    // the default KV size on devices: num_kv_blocks at most, each
                              // rank's device may hold fewer (EngineOptions::kv_fit_devices)
  int64_t max_num_batched_tokens = 0;  // rank 0's: the largest step's shape (its scratch,
  int64_t max_num_seqs = 0;            // DeviceModel::ReserveStepScratch, on every rank)
  int64_t path_bytes = 0;     // then the model path (rank 0's options.model_path)
};

struct SeqWire {
  int64_t n_tokens, pos0, n_blocks, all_logits, want_logits;
};

std::vector<uint8_t> Pack(const ForwardBatch& b, std::span<const BlockCopy> copies,
                          BatchHeader* h) {
  h->n_tokens = static_cast<int64_t>(b.tokens.size());
  h->n_seqs = static_cast<int64_t>(b.seqs.size());
  h->n_blocks = 0;
  for (const SeqBatchEntry& e : b.seqs) h->n_blocks += e.n_blocks;
  h->n_copies = static_cast<int64_t>(copies.size());
  h->capture_hidden = b.capture_hidden != nullptr;
  std::vector<uint8_t> out(h->n_tokens * 4 + h->n_seqs * sizeof(SeqWire) + h->n_blocks * 4 +
                           h->n_copies * sizeof(BlockCopy));
  uint8_t* p = out.data();
  auto put = [&](const void* src, size_t n) {
    if (n) std::memcpy(p, src, n);
    p += n;
  };
  put(b.tokens.data(), b.tokens.size() * 4);
  for (const SeqBatchEntry& e : b.seqs) {
    const SeqWire w{e.n_tokens, e.pos0, e.n_blocks, e.all_logits, e.want_logits};
    put(&w, sizeof w);
  }
  for (const SeqBatchEntry& e : b.seqs) put(e.block_table, e.n_blocks * 4);
  put(copies.data(), copies.size() * sizeof(BlockCopy));
  return out;
}

void Unpack(const BatchHeader& h, const uint8_t* in, ForwardBatch* b,
            std::vector<int32_t>* tables, std::vector<BlockCopy>* copies) {
  const uint8_t* p = in;
  auto get = [&](void* dst, size_t n) {
    if (n) std::memcpy(dst, p, n);
    p += n;
  };
  b->tokens.resize(h.n_tokens);
  get(b->tokens.data(), h.n_tokens * 4);
  std::vector<SeqWire> wire(h.n_seqs);
  get(wire.data(), wire.size() * sizeof(SeqWire));
  tables->resize(h.n_blocks);
  get(tables->data(), h.n_blocks * 4);
  copies->resize(h.n_copies);
  get(copies->data(), h.n_copies * sizeof(BlockCopy));
  b->seqs.clear();
  int64_t at = 0;
  for (const SeqWire& w : wire) {
    SeqBatchEntry e;
    e.n_tokens = w.n_tokens;
    e.pos0 = w.pos0;
    e.n_blocks = w.n_blocks;
    e.block_table = tables->data() + at;
    e.all_logits = w.all_logits;
    e.want_logits = w.want_logits;
    at += w.n_blocks;
    b->seqs.push_back(e);
  }
}

// An executor around this rank's own one (`local_`), whose geometry, model and threads it has.
class WrappingExecutor : public Executor {
 public:
  explicit WrappingExecutor(std::unique_ptr<Executor> local) : local_(std::move(local)) {}
  const ModelConfig& config() const override { return local_->config(); }
  int64_t num_kv_blocks() const override { return local_->num_kv_blocks(); }
  int block_size() const override { return local_->block_size(); }
  Model& model() override { return local_->model(); }
  ThreadPool& pool() override { return local_->pool(); }
  Status Health() const override { return local_->Health(); }  // (the other ranks abort)

 protected:
  std::unique_ptr<Executor> local_;
};

class TensorParallelExecutor : public WrappingExecutor {
 public:
  TensorParallelExecutor(Communicator* tp, std::unique_ptr<Executor> local)
      : WrappingExecutor(std::move(local)), tp_(tp) {}
  ~TensorParallelExecutor() override {
    BatchHeader stop;
    stop.n_seqs = -1;
    tp_->BroadcastPolled(&stop, sizeof stop, 0);
  }
  Status Execute(const ForwardBatch& batch, std::span<const BlockCopy> copies,
                 float* logits) override {
    BatchHeader h;
    std::vector<uint8_t> payload = Pack(batch, copies, &h);
    tp_->BroadcastPolled(&h, sizeof h, 0);
    tp_->Broadcast(payload.data(), static_cast<int64_t>(payload.size()), 0);
    Status st = local_->Execute(batch, copies, logits);
    if (st.code() == StatusCode::kInternal)  // the other ranks may be inside a collective
      tp_->Abort("tensor-parallel rank 0: " + st.message());
    return st;
  }

 private:
  Communicator* tp_;
};

// Data parallelism: what rank 0 broadcasts to the replicas' leaders each step (then the
// batches of all replicas, each a BatchHeader and its payload, in replica order), and the end of
// an engine core (bytes = -1).
struct ReplicaStep {
  int64_t bytes = 0;
  int64_t max_rows = 0;  // the most logit rows of any replica: each one's slot in the gather
};

// Replica d's batch out of a step's payload.
void UnpackReplica(const std::vector<uint8_t>& all, int d, ForwardBatch* b,
                   std::vector<int32_t>* tables, std::vector<BlockCopy>* copies) {
  size_t at = 0;
  for (int k = 0;; ++k) {
    BatchHeader h;
    std::memcpy(&h, all.data() + at, sizeof h);
    at += sizeof h;
    const size_t n = h.n_tokens * 4 + h.n_seqs * sizeof(SeqWire) + h.n_blocks * 4 +
                     h.n_copies * sizeof(BlockCopy);
    if (k == d) {
      Unpack(h, all.data() + at, b, tables, copies);
      return;
    }
    at += n;
  }
}

// Rank 0 of the replicas' leaders: replica 0 is `local_` (this rank's executor, tensor parallel
// within its group or not); every step the batches of all replicas go to the leaders, each runs
// its own, and the logit rows are gathered back.
class DataParallelExecutor : public WrappingExecutor {
 public:
  DataParallelExecutor(Communicator* dp, std::unique_ptr<Executor> local)
      : WrappingExecutor(std::move(local)), dp_(dp) {}
  ~DataParallelExecutor() override {
    ReplicaStep stop;
    stop.bytes = -1;
    dp_->BroadcastPolled(&stop, sizeof stop, 0);
  }
  int data_parallel_size() const override { return dp_->size(); }
  Status Execute(const ForwardBatch&, std::span<const BlockCopy>, float*) override {
    return Internal("a data-parallel executor runs all replicas' batches together");
  }
  Status ExecuteReplicas(std::span<const ReplicaWork> work) override {
    const int n = dp_->size();
    if (static_cast<int>(work.size()) != n) return Internal("one batch per replica expected");
    ReplicaStep step;
    bytes_.clear();
    for (const ReplicaWork& w : work) {
      BatchHeader h;
      const std::vector<uint8_t> payload = Pack(*w.batch, w.copies, &h);
      const auto* hp = reinterpret_cast<const uint8_t*>(&h);
      bytes_.insert(bytes_.end(), hp, hp + sizeof h);
      bytes_.insert(bytes_.end(), payload.begin(), payload.end());
      step.max_rows = std::max(step.max_rows, w.batch->NumLogitRows());
    }
    step.bytes = static_cast<int64_t>(bytes_.size());
    dp_->BroadcastPolled(&step, sizeof step, 0);
    dp_->Broadcast(bytes_.data(), step.bytes, 0);
    Status st;
    const auto t0 = std::chrono::steady_clock::now();
    if (!work[0].batch->tokens.empty() || local_->model().StepsWithAllReplicas())
      st = local_->Execute(*work[0].batch, work[0].copies, work[0].logits);
    const float seconds =
        std::chrono::duration<float>(std::chrono::steady_clock::now() - t0).count();
    // Each leader's slot: its logit rows (padded to the step's most), then its forward seconds.
    const int64_t vocab = config().vocab_size, slot = step.max_rows * vocab + 1;
    mine_.assign(slot, 0.f);
    std::copy_n(work[0].logits, work[0].batch->NumLogitRows() * vocab, mine_.data());
    mine_[slot - 1] = seconds;
    all_.resize(slot * n);
    dp_->Gather(mine_.data(), slot * static_cast<int64_t>(sizeof(float)), all_.data(), 0);
    forward_seconds_.resize(n);
    for (int d = 0; d < n; ++d) {
      if (d > 0)
        std::copy_n(all_.data() + d * slot, work[d].batch->NumLogitRows() * vocab,
                    work[d].logits);
      forward_seconds_[d] += all_[d * slot + slot - 1];
    }
    return st;
  }
  const std::vector<double>& ReplicaForwardSeconds() const override { return forward_seconds_; }

 private:
  Communicator* dp_;
  std::vector<uint8_t> bytes_;
  std::vector<float> mine_, all_;
  std::vector<double> forward_seconds_;
};

// Loads this rank's part of the model `start` names (its tensor-parallel shard) and the executor
// of its group: tensor parallel over `tp` (this rank leads it) or alone.
StatusOr<std::unique_ptr<Executor>> GroupExecutor(const EngineOptions& options, Communicator* tp,
                                                  std::unique_ptr<Model> model) {
  if (tp && tp->size() > 1) return CreateTensorParallelExecutor(options, tp, std::move(model));
  return CreateLocalExecutor(options, std::move(model));
}

CoreStart StartOf(const EngineOptions& o, const StatusOr<int64_t>& blocks) {
  CoreStart start;
  start.num_kv_blocks = blocks.ok() ? *blocks : -1;  // -1: no core this time
  start.block_size = o.block_size;
  start.kv_dtype = static_cast<int64_t>(o.kv_dtype);
  start.exact = kernels::ExactActivations();
  start.expert_parallel = o.enable_expert_parallel;
  start.max_num_batched_tokens = o.max_num_batched_tokens;
  start.max_num_seqs = o.max_num_seqs;
  start.path_bytes = static_cast<int64_t>(o.model_path.size());
  return start;
}

// Rank 0's side of an engine core's start over `comm`: the KV cache's block count for `model`
// (or -1 when the options give none: the receivers skip this core) with the rest of the
// CoreStart and the model path; returns the options with that block count.
StatusOr<EngineOptions> SendStart(const EngineOptions& options, const Model& model,
                                  Communicator* comm) {
  // On devices the default size is not capped by the host's memory: each rank's device caps
  // it when its executor starts, and the ranks agree on the smallest.
  const bool fit = options.kv_fit_devices ||
                   (options.device != "cpu" && KvSizedByMemory(options));
  StatusOr<int64_t> blocks =
      KvBlocks(options, model, fit ? std::numeric_limits<int64_t>::max() / 2 : -1);
  CoreStart start = StartOf(options, blocks);
  start.fit_devices = fit;
  comm->BroadcastPolled(&start, sizeof start, 0);
  comm->Broadcast(const_cast<char*>(options.model_path.data()), start.path_bytes, 0);
  if (!blocks.ok()) return blocks.status();
  EngineOptions o = options;
  o.num_kv_blocks = *blocks;
  o.kv_fit_devices = fit;
  return o;
}

// The receiving side of a CoreStart (and its model path) over `comm`.
CoreStart ReceiveStart(Communicator* comm, std::string* path) {
  CoreStart start;
  comm->BroadcastPolled(&start, sizeof start, 0);
  if (start.job_over) return start;
  path->assign(start.path_bytes, '\0');
  comm->Broadcast(path->data(), start.path_bytes, 0);
  return start;
}

EngineOptions OptionsOf(const EngineOptions& options, const CoreStart& start,
                        const std::string& path) {
  EngineOptions o = options;
  o.model_path = path;
  o.num_kv_blocks = start.num_kv_blocks;
  o.block_size = static_cast<int>(start.block_size);
  o.kv_dtype = static_cast<DType>(start.kv_dtype);
  o.enable_expert_parallel = start.expert_parallel != 0;
  o.kv_fit_devices = start.fit_devices != 0;
  o.max_num_batched_tokens = start.max_num_batched_tokens;
  o.max_num_seqs = static_cast<int>(start.max_num_seqs);
  return o;
}

}  // namespace

int64_t EffectiveMaxModelLen(const EngineOptions& o, const ModelConfig& cfg) {
  return cfg.max_position > 0 ? std::min<int64_t>(o.max_model_len, cfg.max_position)
                              : o.max_model_len;
}

bool KvSizedByMemory(const EngineOptions& o) {
  return o.kv_cache_bytes == 0 && (o.num_kv_blocks == 0 || o.kv_fit_devices);
}

StatusOr<int64_t> KvBlocks(const EngineOptions& o, const Model& model, int64_t memory_cap) {
  PENG_RETURN_IF_ERROR(model.kv_spec().CheckDtype(o.kv_dtype));
  const int64_t max_len = EffectiveMaxModelLen(o, model.config());
  int64_t blocks;
  if (o.num_kv_blocks > 0 && !o.kv_fit_devices) {
    blocks = o.num_kv_blocks;
  } else if (KvSizedByMemory(o)) {  // (kv_fit_devices: rank 0's count, capped here)
    blocks = o.kv_fit_devices
                 ? o.num_kv_blocks
                 : int64_t{o.max_num_seqs} * ((max_len + o.block_size - 1) / o.block_size);
    const int64_t cap = memory_cap >= 0 ? memory_cap : PhysicalMemoryBytes() / 4;
    blocks = std::min(blocks,
                      KvCache::BlocksForBudget(model.kv_spec(), o.block_size, o.kv_dtype, cap));
  } else {
    blocks = KvCache::BlocksForBudget(model.kv_spec(), o.block_size, o.kv_dtype,
                                      o.kv_cache_bytes);
  }
  if (blocks < 1 && o.kv_cache_bytes == 0 && memory_cap >= 0) {  // (a device's, after weights)
    char share[32];
    std::snprintf(share, sizeof share, "%g", o.gpu_memory_utilization);
    return ResourceExhausted("no KV cache block of " + std::to_string(o.block_size) +
                             " tokens fits the " + std::to_string(memory_cap) +
                             " bytes left of the device's memory (--gpu-memory-utilization " +
                             share + " of it, less the weights and its other users)");
  }
  if (blocks < 1)
    return InvalidArgument("the KV cache budget of " + std::to_string(o.kv_cache_bytes) +
                           " bytes holds no block of " + std::to_string(o.block_size) + " tokens");
  return blocks;
}

StatusOr<std::unique_ptr<Executor>> CreateLocalExecutor(const EngineOptions& o,
                                                        std::unique_ptr<Model> model) {
  if (!model) return InvalidArgument("no model");
  if (o.threads < 0) return InvalidArgument("threads must be >= 0");
  if (o.device != "cpu") return CreateDeviceExecutor(o, std::move(model));
  PENG_ASSIGN_OR_RETURN(const int64_t blocks, KvBlocks(o, *model));
  PENG_ASSIGN_OR_RETURN(std::unique_ptr<KvCache> kv,
                        KvCache::Create(model->kv_spec(), blocks, o.block_size, o.kv_dtype));
  return std::unique_ptr<Executor>(new LocalExecutor(o.threads, std::move(model), std::move(kv)));
}

StatusOr<std::unique_ptr<Executor>> CreateTensorParallelExecutor(const EngineOptions& options,
                                                                 Communicator* tp,
                                                                 std::unique_ptr<Model> model) {
  if (!tp || tp->rank() != 0) return Internal("the tensor-parallel executor runs on rank 0");
  if (!model) return InvalidArgument("no model");
  PENG_ASSIGN_OR_RETURN(const EngineOptions o, SendStart(options, *model, tp));
  StatusOr<std::unique_ptr<Executor>> local = CreateLocalExecutor(o, std::move(model));
  if (!local.ok()) tp->Abort("tensor-parallel rank 0: " + local.status().ToString());
  return std::unique_ptr<Executor>(new TensorParallelExecutor(tp, std::move(*local)));
}

void EndTensorParallelJob(Communicator* tp) {
  CoreStart over;
  over.job_over = 1;
  tp->BroadcastPolled(&over, sizeof over, 0);
}

Status RunTensorParallelWorker(const EngineOptions& options, Communicator* tp,
                               const ModelLoadOptions& shard) {
  const std::string who = "tensor-parallel rank " + std::to_string(tp->rank());
  ForwardBatch batch;
  std::vector<int32_t> tables;
  std::vector<BlockCopy> copies;
  std::vector<uint8_t> payload;
  std::vector<float> logits, hidden;
  for (;;) {  // one engine core of rank 0 after the other
    std::string path;
    const CoreStart start = ReceiveStart(tp, &path);
    if (start.job_over) return OkStatus();
    if (start.num_kv_blocks < 1) continue;  // rank 0 could not start this one; it reports why
    kernels::SetExactActivations(start.exact != 0);
    ModelLoadOptions load = shard;
    load.expert_parallel = start.expert_parallel != 0;
    StatusOr<std::unique_ptr<Model>> model = LoadModel(path, load);
    if (!model.ok()) tp->Abort(who + ": " + model.status().ToString());
    const EngineOptions o = OptionsOf(options, start, path);
    StatusOr<std::unique_ptr<Executor>> local = CreateLocalExecutor(o, std::move(*model));
    if (!local.ok()) tp->Abort(who + ": " + local.status().ToString());
    const int64_t vocab = (*local)->config().vocab_size;
    for (;;) {
      BatchHeader h;
      tp->BroadcastPolled(&h, sizeof h, 0);
      if (h.n_seqs < 0) break;  // this core is done
      payload.resize(h.n_tokens * 4 + h.n_seqs * sizeof(SeqWire) + h.n_blocks * 4 +
                     h.n_copies * sizeof(BlockCopy));
      tp->Broadcast(payload.data(), static_cast<int64_t>(payload.size()), 0);
      Unpack(h, payload.data(), &batch, &tables, &copies);
      batch.capture_hidden = h.capture_hidden ? &hidden : nullptr;
      logits.resize(std::max<int64_t>(1, batch.NumLogitRows()) * vocab);
      const Status st = (*local)->Execute(batch, copies, logits.data());
      if (st.code() == StatusCode::kInternal) tp->Abort(who + ": " + st.message());
    }
  }
}

StatusOr<std::unique_ptr<Executor>> CreateDataParallelExecutor(const EngineOptions& options,
                                                               Communicator* dp, Communicator* tp,
                                                               std::unique_ptr<Model> model) {
  if (!dp || dp->rank() != 0) return Internal("the data-parallel executor runs on rank 0");
  if (!model) return InvalidArgument("no model");
  PENG_ASSIGN_OR_RETURN(const EngineOptions o, SendStart(options, *model, dp));
  StatusOr<std::unique_ptr<Executor>> local = GroupExecutor(o, tp, std::move(model));
  if (!local.ok()) dp->Abort("data-parallel rank 0: " + local.status().ToString());
  return std::unique_ptr<Executor>(new DataParallelExecutor(dp, std::move(*local)));
}

Status RunDataParallelLeader(const EngineOptions& options, Communicator* dp, Communicator* tp,
                             const ModelLoadOptions& shard) {
  const std::string who = "data-parallel replica " + std::to_string(dp->rank());
  ForwardBatch batch;
  std::vector<int32_t> tables;
  std::vector<BlockCopy> copies;
  std::vector<uint8_t> bytes;
  std::vector<float> logits;
  for (;;) {  // one engine core of rank 0 after the other
    std::string path;
    const CoreStart start = ReceiveStart(dp, &path);
    if (start.job_over) {
      if (tp && tp->size() > 1) EndTensorParallelJob(tp);
      return OkStatus();
    }
    if (start.num_kv_blocks < 1) continue;  // rank 0 could not start this one; it reports why
    kernels::SetExactActivations(start.exact != 0);
    ModelLoadOptions load = shard;
    load.expert_parallel = start.expert_parallel != 0;
    StatusOr<std::unique_ptr<Model>> model = LoadModel(path, load);
    if (!model.ok()) dp->Abort(who + ": " + model.status().ToString());
    StatusOr<std::unique_ptr<Executor>> ex =
        GroupExecutor(OptionsOf(options, start, path), tp, std::move(*model));
    if (!ex.ok()) dp->Abort(who + ": " + ex.status().ToString());
    const int64_t vocab = (*ex)->config().vocab_size;
    for (;;) {
      ReplicaStep step;
      dp->BroadcastPolled(&step, sizeof step, 0);
      if (step.bytes < 0) break;  // this core is done; destroying the executor ends the group's
      bytes.resize(step.bytes);
      dp->Broadcast(bytes.data(), step.bytes, 0);
      UnpackReplica(bytes, dp->rank(), &batch, &tables, &copies);
      batch.capture_hidden = nullptr;  // (rank 0 refuses hidden-state requests with replicas)
      const int64_t slot = step.max_rows * vocab + 1;  // the rows, then the forward seconds
      logits.assign(slot, 0.f);
      const auto t0 = std::chrono::steady_clock::now();
      if (!batch.tokens.empty() || (*ex)->model().StepsWithAllReplicas()) {
        const Status st = (*ex)->Execute(batch, copies, logits.data());
        if (!st.ok()) dp->Abort(who + ": " + st.message());
      }
      logits[slot - 1] =
          std::chrono::duration<float>(std::chrono::steady_clock::now() - t0).count();
      dp->Gather(logits.data(), slot * static_cast<int64_t>(sizeof(float)), nullptr, 0);
    }
  }
}

}  // namespace peng
