// peng info: what peng sees in a model file and on this machine.
#include <cstdio>
#include <memory>

#include "core/cpu_features.h"
#include "kernels/isa.h"
#include "model/registry.h"
#include "parallel/communicator.h"
#include "tools/commands.h"

namespace peng::tools {

namespace {

// One line per rank of the job, in rank order: its replica, its tensor-parallel index and its
// shard of the model.
void PrintShard(Communicator* world, int tp, const Model& m) {
  const KvCacheSpec kv = m.kv_spec();
  for (int k = 0; k < world->size(); ++k) {
    if (k == world->rank()) {
      std::printf("rank %d of %d (replica %d, tensor-parallel rank %d of %d): weight bytes per "
                  "token %lld, kv cache per token %lld bytes (F16)\n",
                  world->rank(), world->size(), world->rank() / tp, world->rank() % tp, tp,
                  static_cast<long long>(m.WeightBytesPerToken()),
                  static_cast<long long>(kv.BytesPerToken(DType::kF16)));
      std::fflush(stdout);
    }
    world->Barrier();
  }
}

}  // namespace

void RegisterInfo(CLI::App& app, int* exit_code) {
  auto path = std::make_shared<std::string>();
  auto tp = std::make_shared<int>(1);
  auto ep = std::make_shared<bool>(false);
  auto dp = std::make_shared<int>(1);
  CLI::App* c = app.add_subcommand("info", "Show CPU features and a model's configuration");
  c->add_option("-m,--model", *path, "GGUF file or Hugging Face model folder");
  c->add_option("--tensor-parallel-size", *tp,
                "Under mpirun -np N: also show each rank's shard (-tp N)")
      ->check(CLI::Range(1, 4096));
  c->add_option("--data-parallel-size", *dp,
                "Under mpirun -np T*D with -tp T: the layout of D replicas (-dp D)")
      ->check(CLI::Range(1, 4096));
  c->add_flag("--enable-expert-parallel", *ep,
              "With -tp: show the shards of whole routed experts per rank");
  c->callback([path, tp, dp, ep, exit_code] {
    StatusOr<Communicator*> world = WorldComm();
    if (!world.ok()) {
      *exit_code = Fail(world.status().ToString());
      return;
    }
    if ((*world)->size() != *tp * *dp) {
      *exit_code = Fail("--tensor-parallel-size " + std::to_string(*tp) +
                        " x --data-parallel-size " + std::to_string(*dp) + " but the job has " +
                        std::to_string((*world)->size()) + " processes");
      return;
    }
    const bool lead = (*world)->rank() == 0;
    if (lead) {
      std::printf("cpu: %s (%d physical / %d logical cores)\nkernels: %s\n",
                  GetCpuFeatures().ToString().c_str(), GetCpuFeatures().physical_cores,
                  GetCpuFeatures().logical_cores, kernels::IsaName(kernels::ActiveIsa()));
      std::printf("parallel: %s%s\n", (*world)->Describe().c_str(),
                  MpiAvailable() ? " (Open MPI built in: mpirun -np N peng ... -tp N)"
                                 : " (built without MPI)");
    }
    if (path->empty()) return;
    auto m = LoadModel(*path);
    if (!m.ok()) {
      *exit_code = Fail(m.status().ToString());
      return;
    }
    if (lead) {
      const KvCacheSpec kv = (*m)->kv_spec();
      int64_t values = 0;
      for (const KvCacheSpec::Layer& l : kv.layers)
        values += static_cast<int64_t>(l.n_kv_heads) * (l.head_dim + l.v_head_dim);
      std::printf("model: %s\nweights: %s\nweight bytes per token: %lld\n"
                  "kv cache per token: %lld values over %zu layers = %lld bytes (F16)",
                  (*m)->config().Summary().c_str(), (*m)->WeightSummary().c_str(),
                  static_cast<long long>((*m)->WeightBytesPerToken()),
                  static_cast<long long>(values), kv.layers.size(),
                  static_cast<long long>(kv.BytesPerToken(DType::kF16)));
      if (kv.CheckDtype(DType::kQ8_0).ok())  // --kv-cache-dtype q8_0
        std::printf(", %lld (Q8_0)", static_cast<long long>(kv.BytesPerToken(DType::kQ8_0)));
      std::printf("\n");
      std::fflush(stdout);
    }
    if (*tp * *dp == 1) return;
    if (lead)
      std::printf("layout: %d replica(s) x tensor parallel %d, replica d = ranks [d*%d, "
                  "(d+1)*%d)%s\n",
                  *dp, *tp, *tp, *tp,
                  *ep ? "; routed experts partitioned over all ranks" : "");
    m->reset();
    // The same communicators the engine makes (tensor-parallel groups, and the ranks of one
    // tensor-parallel index across the replicas).
    const int rank = (*world)->rank();
    std::unique_ptr<Communicator> group = (*world)->Split(rank / *tp, rank % *tp);
    std::unique_ptr<Communicator> peers = (*world)->Split(rank % *tp, rank / *tp);
    auto shard = LoadModel(*path, {.tp = group.get(), .expert_parallel = *ep,
                                   .ep_replicas = *dp > 1 ? peers.get() : nullptr});
    if (!shard.ok()) (*world)->Abort(shard.status().ToString());
    PrintShard(*world, *tp, **shard);
  });
}

}  // namespace peng::tools
