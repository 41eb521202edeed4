// Assembling an engine core: the options every engine checks, the executor they call for (one
// process, or rank 0 of an MPI job of tensor x data parallel processes), the job's layout, and
// the other ranks' serving loop.
#include <filesystem>
#include <fstream>
#include <limits>
#include <memory>
#include <string>

#include "backend/device.h"
#include "engine/engine_core.h"
#include "model/registry.h"

namespace peng {
namespace {

// Bytes of the weight files at `path` (a file, or a folder's .safetensors shards).
int64_t WeightFileBytes(const std::string& path) {
  namespace fs = std::filesystem;
  std::error_code ec;
  if (!fs::is_directory(path, ec)) {
    const auto n = fs::file_size(path, ec);
    return ec ? 0 : static_cast<int64_t>(n);
  }
  int64_t total = 0;
  for (const fs::directory_entry& e : fs::directory_iterator(path, ec))
    if (e.path().extension() == ".safetensors") total += static_cast<int64_t>(e.file_size(ec));
  return total;
}

// MemAvailable of /proc/meminfo (free memory plus the page cache the kernel can drop), or 0.
int64_t AvailableMemoryBytes() {
  std::ifstream in("/proc/meminfo");
  std::string key;
  int64_t kib = 0;
  while (in >> key >> kib) {
    if (key == "MemAvailable:") return kib * 1024;
    in.ignore(std::numeric_limits<std::streamsize>::max(), '\n');
  }
  return 0;
}

}  // namespace

bool WeightsInHugePages(const EngineOptions& o) {
  if (!o.huge_pages || o.device != "cpu") return false;
  const int64_t bytes = WeightFileBytes(o.model_path);
  // A quarter: the kernels' packed panels (kernels::PackPanels) may hold a second copy of most
  // of the weights, and the KV cache comes on top.
  return bytes > 0 && bytes <= AvailableMemoryBytes() / 4;
}

Status ValidateOptions(const EngineOptions& o) {
  if (o.threads < 0) return InvalidArgument("threads must be >= 0");
  if (o.tensor_parallel_size < 1) return InvalidArgument("tensor_parallel_size must be >= 1");
  if (o.data_parallel_size < 1) return InvalidArgument("data_parallel_size must be >= 1");
  if (o.pipeline_parallel_size < 1)
    return InvalidArgument("pipeline_parallel_size must be >= 1");
  if (o.pipeline_parallel_size > 1 && o.device != "cpu")
    return InvalidArgument("pipeline parallelism (--pipeline-parallel-size) runs on the CPU; "
                           "with --device " + o.device + " split the model with "
                           "--tensor-parallel-size");
  if (!(o.utilization_window_s > 0)) return InvalidArgument("utilization_window_s must be > 0");
  if (!(o.gpu_memory_utilization > 0 && o.gpu_memory_utilization <= 1))
    return InvalidArgument("gpu_memory_utilization (--gpu-memory-utilization) must be in "
                           "(0, 1]");
  if (o.block_size <= 0 || o.max_num_seqs <= 0 || o.max_num_batched_tokens <= 0 ||
      o.max_model_len <= 0 || o.kv_cache_bytes < 0 || o.max_waiting <= 0 ||
      o.num_kv_blocks < 0)
    return InvalidArgument("engine options must be positive (kv_cache_bytes >= 0)");
  if (o.device != "cpu") PENG_RETURN_IF_ERROR(backend::ParseDeviceSpec(o.device).status());
  return OkStatus();
}

StatusOr<std::unique_ptr<EngineCore>> CreateEngineCore(const EngineOptions& o,
                                                       std::unique_ptr<Model> model,
                                                       std::unique_ptr<Tokenizer> tok) {
  PENG_RETURN_IF_ERROR(ValidateOptions(o));
  if (o.tensor_parallel_size != 1 || o.pipeline_parallel_size != 1 || o.data_parallel_size != 1)
    return InvalidArgument("a loaded model runs in one process (tensor, pipeline and data "
                           "parallel size 1)");
  PENG_ASSIGN_OR_RETURN(std::unique_ptr<Executor> executor,
                        CreateLocalExecutor(o, std::move(model)));
  return EngineCore::Create(o, std::move(executor), std::move(tok));
}

std::string JobShape(int tp, int pp, int dp) {
  return "--tensor-parallel-size " + std::to_string(tp) + " x --pipeline-parallel-size " +
         std::to_string(pp) + " x --data-parallel-size " + std::to_string(dp);
}

StatusOr<std::unique_ptr<JobLayout>> SplitJob(Communicator* world, int tp, int pp, int dp) {
  const int64_t want = int64_t{tp} * pp * dp;
  if (world->size() != want) {
    if (world->size() == 1)
      return InvalidArgument(JobShape(tp, pp, dp) + " needs a job of " + std::to_string(want) +
                             " processes: start it with mpirun -np " + std::to_string(want));
    return InvalidArgument("this MPI job has " + std::to_string(world->size()) +
                           " processes but " + JobShape(tp, pp, dp) + " = " +
                           std::to_string(want) + "; they must be equal");
  }
  auto L = std::make_unique<JobLayout>();
  L->owned = std::make_shared<JobLayout::Owned>();
  JobLayout::Owned& own = *L->owned;
  L->world = world;
  L->tp_size = tp;
  L->pp_size = pp;
  L->dp_size = dp;
  L->group_rank = world->rank() % (tp * pp);
  L->tp_rank = L->group_rank % tp;
  L->stage = L->group_rank / tp;
  L->dp_rank = world->rank() / (tp * pp);
  if (world->size() > 1) {  // collective: every rank splits, in this order
    if (dp > 1) {
      own.group = world->Split(L->dp_rank, L->group_rank);
      own.dp = world->Split(L->group_rank == 0 ? 0 : 1, L->dp_rank);
      own.peers = world->Split(L->group_rank, L->dp_rank);
    }
    if (pp > 1) {
      own.tp = world->Split(L->dp_rank * pp + L->stage, L->tp_rank);
      own.pp = world->Split(L->dp_rank * tp + L->tp_rank, L->stage);
    }
  }
  L->group = dp > 1 ? own.group.get() : world;
  L->dp = own.dp.get();
  L->peers = own.peers.get();
  L->tp = pp > 1 ? own.tp.get() : L->group;
  L->pp = own.pp.get();
  if (L->tp->size() == 1) L->tp = nullptr;
  return L;
}

namespace {

bool workers_listening = false;  // rank 0 of a job whose other ranks serve its engine cores

JobLayout listening_layout;  // rank 0's, when workers_listening

// The engine's layout of the job: split once, at the first engine's options (collective).
StatusOr<JobLayout> Layout(const EngineOptions& o) {
  static std::unique_ptr<JobLayout> made;
  PENG_ASSIGN_OR_RETURN(Communicator* world, WorldComm());
  const int tp = o.tensor_parallel_size, pp = o.pipeline_parallel_size;
  const int dp = o.data_parallel_size;
  if (!made) {
    PENG_ASSIGN_OR_RETURN(made, SplitJob(world, tp, pp, dp));
  } else if (made->tp_size != tp || made->pp_size != pp || made->dp_size != dp) {
    return InvalidArgument("the job's layout is fixed at its start: " + JobShape(tp, pp, dp) +
                           " differs from the first");
  }
  const JobLayout& L = *made;
  if (world->size() > 1 && world->rank() == 0) {
    workers_listening = true;
    listening_layout = L;
  }
  return L;
}

// A job of several ranks on devices: the ranks agree on their KV caches' size over the world
// (DeviceExecutor).
EngineOptions WithKvGroup(const EngineOptions& o, const JobLayout& L) {
  EngineOptions out = o;
  if (o.device != "cpu" && L.world->size() > 1) out.kv_group = L.world;
  return out;
}

}  // namespace

StatusOr<std::unique_ptr<EngineCore>> CreateEngineCore(const EngineOptions& options) {
  PENG_RETURN_IF_ERROR(ValidateOptions(options));  // before the (slow) model load
  PENG_ASSIGN_OR_RETURN(const JobLayout L, Layout(options));
  const EngineOptions o = WithKvGroup(options, L);
  if (L.world->size() == 1) {
    PENG_ASSIGN_OR_RETURN(std::unique_ptr<Model> model,
                          LoadModel(o.model_path, {.huge_pages = WeightsInHugePages(o)}));
    PENG_ASSIGN_OR_RETURN(std::unique_ptr<Tokenizer> tok, Tokenizer::ForModel(o.model_path));
    return CreateEngineCore(o, std::move(model), std::move(tok));
  }
  if (L.world->rank() != 0) return Internal("the engine core runs on rank 0 of the job");
  // A rank that fails to load its shard aborts the job; so does rank 0 (the workers are
  // waiting for its first broadcast).
  StatusOr<std::unique_ptr<Model>> model = LoadModel(o.model_path, L.Shard(o.enable_expert_parallel));
  if (!model.ok()) L.world->Abort("rank 0: " + model.status().ToString());
  PENG_ASSIGN_OR_RETURN(std::unique_ptr<Tokenizer> tok, Tokenizer::ForModel(o.model_path));
  std::unique_ptr<Executor> executor;
  if (L.dp) {
    Communicator* group = L.group->size() > 1 ? L.group : nullptr;
    PENG_ASSIGN_OR_RETURN(executor,
                          CreateDataParallelExecutor(o, L.dp, group, std::move(*model)));
  } else {
    PENG_ASSIGN_OR_RETURN(executor, CreateTensorParallelExecutor(o, L.group, std::move(*model)));
  }
  return EngineCore::Create(o, std::move(executor), std::move(tok));
}

StatusOr<bool> RunParallelWorker(const EngineOptions& options) {
  PENG_RETURN_IF_ERROR(ValidateOptions(options));
  if (options.tensor_parallel_size == 1 && options.pipeline_parallel_size == 1 &&
      options.data_parallel_size == 1 && !LaunchedByMpirun())
    return false;
  PENG_ASSIGN_OR_RETURN(const JobLayout L, Layout(options));
  const EngineOptions o = WithKvGroup(options, L);
  if (L.world->rank() == 0) return false;
  if (L.group_rank != 0) {
    PENG_RETURN_IF_ERROR(RunTensorParallelWorker(o, L.group, L.Shard(o.enable_expert_parallel)));
  } else {
    PENG_RETURN_IF_ERROR(RunDataParallelLeader(o, L.dp, L.group, L.Shard(o.enable_expert_parallel)));
  }
  return true;
}

void EndParallelJob() {
  if (!workers_listening) return;
  workers_listening = false;
  // The replicas' leaders first (each then ends its group's workers), then rank 0's own group.
  const JobLayout& L = listening_layout;
  if (L.dp) EndTensorParallelJob(L.dp);
  if (L.group->size() > 1) EndTensorParallelJob(L.group);
}

}  // namespace peng
