// Executor: runs the engine core's scheduled batches on the model -- the boundary between
// deciding what to compute (EngineCore: scheduler, KV block manager, sampling) and computing it
// (the model's weights, the paged KV cache's memory, the threads). The core hands it one
// ForwardBatch per step plus the copy-on-write block copies the scheduler asked for, and gets
// the batch's logit rows back. LocalExecutor does it in this process; a multi-process executor
// (tensor / expert parallel ranks) puts the same call behind a broadcast to its workers.
#pragma once

#include <cstdint>
#include <exception>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "core/status.h"
#include "core/thread_pool.h"
#include "kv/kv_cache_manager.h"
#include "model/kv_cache.h"
#include "model/model.h"
#include "model/registry.h"
#include "parallel/communicator.h"

namespace peng {

struct EngineOptions;

class Executor {
 public:
  virtual ~Executor() = default;
  virtual const ModelConfig& config() const = 0;
  // The paged KV cache's geometry (the core's block manager mirrors it).
  virtual int64_t num_kv_blocks() const = 0;
  virtual int block_size() const = 0;
  // Performs `copies` (copy-on-write of shared blocks), then runs the batch and writes its
  // NumLogitRows() rows of vocab_size logits into `logits`.
  virtual Status Execute(const ForwardBatch& batch, std::span<const BlockCopy> copies,
                         float* logits) = 0;
  // Data parallelism: the replicas of the model it runs side by side, each with its own KV
  // cache (of num_kv_blocks() blocks); the engine core keeps a scheduler per replica.
  virtual int data_parallel_size() const { return 1; }
  // One step of every replica (work.size() == data_parallel_size(); a replica with nothing
  // scheduled gets an empty batch). Without data parallelism: Execute() of the one batch.
  struct ReplicaWork {
    const ForwardBatch* batch;
    std::span<const BlockCopy> copies;
    float* logits;
  };
  // Data parallelism: each replica's forward-pass seconds so far (empty without).
  virtual const std::vector<double>& ReplicaForwardSeconds() const {
    static const std::vector<double> none;
    return none;
  }
  virtual Status ExecuteReplicas(std::span<const ReplicaWork> work) {
    if (work.size() != 1) return Internal("one replica expected");
    return Execute(*work[0].batch, work[0].copies, work[0].logits);
  }
  // The most best logits a row may ask for instead of the whole row (SeqBatchEntry::top_logits:
  // a device returns them from its logits, DeviceModel::top_logits_max); 0: whole rows only
  // (the CPU, where the row is at hand anyway, and the multi-process executors).
  virtual int top_logits_max() const { return 0; }
  // Logit row `row` of the last Execute whole into `dst` (vocab_size values), for a row that
  // came back as its best logits alone; valid until the next Execute (where top_logits_max()).
  virtual Status CopyLogitRow(int64_t row, float* dst) {
    return Unimplemented("this executor returns whole logit rows only");
  }
  // The most best logits CopyBestOfLogitRows returns a row (0: none), and those: the best k
  // (k <= top_logits_wide(), k <= vocab_size) of each of the last Execute's logit rows `rows`,
  // best first (kernels::TopK's order), into val / idx [rows.size(), k], for rows whose nucleus
  // reaches past their best top_logits_max(); valid until the next Execute.
  virtual int top_logits_wide() const { return 0; }
  virtual Status CopyBestOfLogitRows(std::span<const int64_t> rows, int k, float* val,
                                     int32_t* idx) {
    return Unimplemented("this executor returns whole logit rows only");
  }
  // This process's part: its model (shard), its thread pool (probes, diagnostics).
  // Kernels the executor's device has launched (backend::Device::KernelLaunches); 0 on the
  // CPU.
  virtual int64_t DeviceKernelLaunches() const { return 0; }
  // Not ok once the executor cannot run another step -- its device lost its context (a
  // kernel's fault, uncorrectable ECC: backend::Device::Health) -- and so for good.
  virtual Status Health() const { return OkStatus(); }
  virtual Model& model() = 0;
  virtual ThreadPool& pool() = 0;
};

// Runs one forward pass `f` (returning Status); an exception it throws becomes an Internal error
// naming it, so a failing step fails its requests instead of the process.
template <typename F>
Status GuardForwardPass(F&& f) {
  try {
    return f();
  } catch (const std::exception& e) {
    return Internal(std::string("exception in the forward pass: ") + e.what());
  }
}

// The longest sequence (prompt + output) the engine allows: options.max_model_len capped by
// the model's context length.
int64_t EffectiveMaxModelLen(const EngineOptions& options, const ModelConfig& config);

// Runs `model` in this process on options.threads threads, with a KV cache of
// options.num_kv_blocks blocks, else sized by options.kv_cache_bytes (0 = enough for
// max_num_seqs full-length sequences, capped at 25% of physical memory).
StatusOr<std::unique_ptr<Executor>> CreateLocalExecutor(const EngineOptions& options,
                                                        std::unique_ptr<Model> model);

// The KV cache's block count for `model` under the options (see CreateLocalExecutor);
// memory_cap: the most bytes it may take when the options do not size it (-1: a quarter of
// physical memory; a device's executor passes what EngineOptions::gpu_memory_utilization leaves
// free after the weights and the largest step's scratch, and no block fitting it is
// ResourceExhausted).
StatusOr<int64_t> KvBlocks(const EngineOptions& options, const Model& model,
                           int64_t memory_cap = -1);
// Whether KvBlocks sizes the cache by the memory (neither a fixed block count nor a byte
// budget: the default, or a multi-rank device job's, EngineOptions::kv_fit_devices).
bool KvSizedByMemory(const EngineOptions& options);

// Runs `model` (loaded on the host: a DecoderModel or DeepseekV2Model, this rank's shard under
// tensor parallelism) on options.device ("cuda", "cuda:N", "host"; backend/device.h) through a
// DeviceModel (model/device_model.h): weights uploaded once, the KV cache in device memory
// (options.num_kv_blocks, else options.kv_cache_bytes, else enough for max_num_seqs full-length
// sequences capped at 90% of the device's free memory). CreateLocalExecutor calls
// it for any device but "cpu".
StatusOr<std::unique_ptr<Executor>> CreateDeviceExecutor(const EngineOptions& options,
                                                         std::unique_ptr<Model> model);

// Tensor (and pipeline) parallel over `tp` (size > 1; the replica's ranks: its tensor-parallel
// groups, one a pipeline stage), on its rank 0: `model` is this rank's shard (loaded with
// ModelLoadOptions::tp and ::pp). Each Execute() broadcasts the batch (tokens, sequences, block
// tables, block copies) to the other ranks, which run RunTensorParallelWorker(), and then
// runs its own shard; the model's collectives (and its stages' sends) join the ranks inside
// the forward pass. The KV cache has the same number of blocks on every rank (rank 0's,
// broadcast at start). A failure that may leave the ranks out of step (an exception in the
// forward pass) aborts the job. Destroying it ends the workers' loops.
StatusOr<std::unique_ptr<Executor>> CreateTensorParallelExecutor(const EngineOptions& options,
                                                                 Communicator* tp,
                                                                 std::unique_ptr<Model> model);
// Ranks 1.. of `tp`: for every engine core rank 0 creates (CreateTensorParallelExecutor), load
// this rank's shard of the model rank 0 names (its options.model_path; exact mode as on rank
// 0) and run rank 0's batches on it until that core's
// executor is destroyed; return when rank 0 calls EndTensorParallelJob(). Setting up a shard
// that fails aborts the job.
// `shard`: how this rank's part is loaded (ModelLoadOptions: its tensor-parallel group and
// pipeline stages, with data parallelism its peers in the other replicas; expert_parallel comes
// from rank 0).
Status RunTensorParallelWorker(const EngineOptions& options, Communicator* tp,
                               const ModelLoadOptions& shard);
// On rank 0, after its last engine core: the workers' RunTensorParallelWorker() returns (also
// ends RunDataParallelLeader() when given the leaders' communicator).
void EndTensorParallelJob(Communicator* tp);

// Data parallelism, on rank 0 of `dp` (the communicator of the replicas' leaders: rank d leads
// replica d): `model` is this rank's part of replica 0 (its shard of `tp`, this rank's
// tensor-parallel group, which may have size 1). The executor has data_parallel_size() =
// dp->size(); each ExecuteReplicas() broadcasts every replica's batch to the leaders, runs
// replica 0's here (tensor parallel over `tp` when it has several ranks) while the other
// leaders run theirs, and gathers their logit rows (a replica with nothing scheduled skips its
// forward pass unless the model steps with all replicas). A replica whose forward pass fails
// aborts the job. Destroying it ends the leaders' loops for this core.
StatusOr<std::unique_ptr<Executor>> CreateDataParallelExecutor(const EngineOptions& options,
                                                               Communicator* dp, Communicator* tp,
                                                               std::unique_ptr<Model> model);
// Leaders of replicas 1.. (rank d of `dp`): for every engine core rank 0 creates, load this
// rank's part of the model (its shard of `tp`) and run replica d's batches on it (tensor parallel
// over `tp`, whose other ranks run RunTensorParallelWorker()); return when rank 0 calls
// EndTensorParallelJob(dp), after ending the group's workers. When the model steps with all
// replicas (Model::StepsWithAllReplicas) an empty batch still runs its forward pass.
Status RunDataParallelLeader(const EngineOptions& options, Communicator* dp, Communicator* tp,
                             const ModelLoadOptions& shard);

}  // namespace peng
