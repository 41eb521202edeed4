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

namespace {

bool workers_listening = false;  // rank 0 of a job whose other ranks serve its engine cores

// The job's shape: tensor_parallel_size x pipeline_parallel_size x data_parallel_size
// processes, the tensor-parallel groups innermost, then the pipeline stages (replica d = ranks
// [d * tp * pp, (d + 1) * tp * pp), its stage s the ranks [s * tp, (s + 1) * tp) of those), so
// that a group stays on one host when the hosts are filled in order.
struct JobLayout {
  Communicator* world = nullptr;
  Communicator* group = nullptr;  // this rank's replica: its tp x pp ranks (the world at dp 1)
  Communicator* tp = nullptr;  // the model's tensor-parallel group (null alone)
  Communicator* pp = nullptr;  // its pipeline stages, this tensor-parallel index (null alone)
  Communicator* dp = nullptr;  // the replicas' leaders (null when dp = 1; unused off leaders)
  Communicator* peers = nullptr;  // this rank of the replica in every replica (dp > 1)
  int group_rank = 0, dp_rank = 0;
  ModelLoadOptions Shard(const EngineOptions& o) const {
    return {.tp = tp, .pp = pp, .expert_parallel = o.enable_expert_parallel, .ep_replicas = peers};
  }
};
JobLayout listening_layout;  // rank 0's, when workers_listening

StatusOr<JobLayout> Layout(const EngineOptions& o) {
  static std::unique_ptr<Communicator> group_comm, tp_comm, pp_comm, dp_comm, peers_comm;
  static std::vector<int> made;  // (the layout the splits were made for)
  PENG_ASSIGN_OR_RETURN(Communicator* world, WorldComm());
  const int tp = o.tensor_parallel_size, pp = o.pipeline_parallel_size;
  const int64_t want = int64_t{tp} * pp * o.data_parallel_size;
  const std::string shape = "--tensor-parallel-size " + std::to_string(tp) +
                            " x --pipeline-parallel-size " + std::to_string(pp) +
                            " x --data-parallel-size " + std::to_string(o.data_parallel_size);
  if (world->size() != want) {
    if (world->size() == 1)
      return InvalidArgument(shape + " needs a job of " + std::to_string(want) +
                             " processes: start it with mpirun -np " + std::to_string(want));
    return InvalidArgument("this MPI job has " + std::to_string(world->size()) +
                           " processes but " + shape + " = " + std::to_string(want) +
                           "; they must be equal");
  }
  JobLayout L;
  L.world = world;
  const int in_group = world->rank() % (tp * pp), tp_rank = in_group % tp, stage = in_group / tp;
  L.group_rank = in_group;
  L.dp_rank = world->rank() / (tp * pp);
  const std::vector<int> layout = {tp, pp, o.data_parallel_size};
  if (made.empty() && world->size() > 1) {  // collective: every rank splits once, in one order
    if (o.data_parallel_size > 1) {
      group_comm = world->Split(L.dp_rank, in_group);
      dp_comm = world->Split(in_group == 0 ? 0 : 1, L.dp_rank);
      peers_comm = world->Split(in_group, L.dp_rank);
    }
    if (pp > 1) {
      tp_comm = world->Split(L.dp_rank * pp + stage, tp_rank);
      pp_comm = world->Split(L.dp_rank * tp + tp_rank, stage);
    }
    made = layout;
  } else if (!made.empty() && made != layout) {
    return InvalidArgument("the job's layout is fixed at its start: " + shape +
                           " differs from the first");
  }
  L.group = o.data_parallel_size > 1 ? group_comm.get() : world;
  L.dp = dp_comm.get();
  L.peers = peers_comm.get();
  L.tp = pp > 1 ? tp_comm.get() : L.group;
  L.pp = pp > 1 ? pp_comm.get() : nullptr;
  if (L.tp->size() == 1) L.tp = nullptr;
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
  StatusOr<std::unique_ptr<Model>> model = LoadModel(o.model_path, L.Shard(o));
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
    PENG_RETURN_IF_ERROR(RunTensorParallelWorker(o, L.group, L.Shard(o)));
  } else {
    PENG_RETURN_IF_ERROR(RunDataParallelLeader(o, L.dp, L.group, L.Shard(o)));
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
