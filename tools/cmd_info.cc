// peng info: what peng sees in a model file and on this machine.
#include <cstdio>

#include "core/cpu_features.h"
#include "kernels/isa.h"
#include "model/registry.h"
#include "parallel/communicator.h"
#include "tools/commands.h"

namespace peng::tools {

namespace {

// One line per rank, in rank order: this rank's shard of the model.
void PrintShard(Communicator* comm, const Model& m) {
  const KvCacheSpec kv = m.kv_spec();
  for (int k = 0; k < comm->size(); ++k) {
    if (k == comm->rank()) {
      std::printf("rank %d of %d: weight bytes per token %lld, kv cache per token %lld bytes "
                  "(F16)\n",
                  comm->rank(), comm->size(), static_cast<long long>(m.WeightBytesPerToken()),
                  static_cast<long long>(kv.BytesPerToken(DType::kF16)));
      std::fflush(stdout);
    }
    comm->Barrier();
  }
}

}  // namespace

void RegisterInfo(CLI::App& app, int* exit_code) {
  auto path = std::make_shared<std::string>();
  auto tp = std::make_shared<int>(1);
  auto ep = std::make_shared<bool>(false);
  CLI::App* c = app.add_subcommand("info", "Show CPU features and a model's configuration");
  c->add_option("-m,--model", *path, "GGUF file or Hugging Face model folder");
  c->add_option("--tensor-parallel-size", *tp,
                "Under mpirun -np N: also show each rank's shard (-tp N)")
      ->check(CLI::Range(1, 4096));
  c->add_flag("--enable-expert-parallel", *ep,
              "With -tp: show the shards of whole routed experts per rank");
  c->callback([path, tp, ep, exit_code] {
    StatusOr<Communicator*> world = WorldComm();
    if (!world.ok()) {
      *exit_code = Fail(world.status().ToString());
      return;
    }
    if ((*world)->size() != *tp) {
      *exit_code = Fail("--tensor-parallel-size " + std::to_string(*tp) + " but the job has " +
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
                  "kv cache per token: %lld values over %zu layers = %lld bytes (F16)\n",
                  (*m)->config().Summary().c_str(), (*m)->WeightSummary().c_str(),
                  static_cast<long long>((*m)->WeightBytesPerToken()),
                  static_cast<long long>(values), kv.layers.size(),
                  static_cast<long long>(kv.BytesPerToken(DType::kF16)));
      std::fflush(stdout);
    }
    if (*tp == 1) return;
    m->reset();
    auto shard = LoadModel(*path, {.tp = *world, .expert_parallel = *ep});
    if (!shard.ok()) (*world)->Abort(shard.status().ToString());
    PrintShard(*world, **shard);
  });
}

}  // namespace peng::tools
