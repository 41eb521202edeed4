// peng info: what peng sees in a model file and on this machine.
#include <cstdio>
#include <memory>

#include "core/cpu_features.h"
#include "engine/engine_core.h"
#include "kernels/isa.h"
#include "model/layers/pipeline.h"
#include "model/registry.h"
#include "parallel/communicator.h"
#include "tools/commands.h"

namespace peng::tools {

namespace {

// One line per rank of the job, in rank order: its replica, its place in the replica (pipeline
// stage and layers, tensor-parallel index) and its shard of the model.
void PrintShard(const JobLayout& L, const Model& m, const PipelineStage& stage, int n_layers) {
  const KvCacheSpec kv = m.kv_spec();
  Communicator* world = L.world;
  for (int k = 0; k < world->size(); ++k) {
    if (k == world->rank()) {
      std::printf("rank %d of %d (replica %d, pipeline stage %d of %d: layers %d-%d of %d, "
                  "tensor-parallel rank %d of %d): weight bytes per token %lld, kv cache per "
                  "token %lld bytes (F16)\n",
                  world->rank(), world->size(), L.dp_rank, L.stage, L.pp_size, stage.begin(),
                  stage.end() - 1, n_layers, L.tp_rank, L.tp_size,
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
  auto pp = std::make_shared<int>(1);
  auto ep = std::make_shared<bool>(false);
  auto dp = std::make_shared<int>(1);
  CLI::App* c = app.add_subcommand("info", "Show CPU features and a model's configuration");
  c->add_option("-m,--model", *path, "GGUF file or Hugging Face model folder");
  c->add_option("--tensor-parallel-size", *tp,
                "Under mpirun -np N: also show each rank's shard (-tp N)")
      ->check(CLI::Range(1, 4096));
  c->add_option("--pipeline-parallel-size", *pp,
                "Under mpirun: the layers split over this many stages (-pp P)")
      ->check(CLI::Range(1, 4096));
  c->add_option("--data-parallel-size", *dp,
                "Under mpirun -np T*P*D with -tp T -pp P: the layout of D replicas (-dp D)")
      ->check(CLI::Range(1, 4096));
  c->add_flag("--enable-expert-parallel", *ep,
              "With -tp: show the shards of whole routed experts per rank");
  c->callback([path, tp, pp, dp, ep, exit_code] {
    StatusOr<Communicator*> world = WorldComm();
    if (!world.ok()) {
      *exit_code = Fail(world.status().ToString());
      return;
    }
    if ((*world)->size() != *tp * *pp * *dp) {
      *exit_code = Fail(JobShape(*tp, *pp, *dp) + " but the job has " +
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
    if (*tp * *pp * *dp == 1) return;
    const int n = *tp * *pp;
    if (lead)
      std::printf("layout: %d replica(s) x pipeline parallel %d x tensor parallel %d, replica d "
                  "= ranks [d*%d, (d+1)*%d), its stage s = ranks [s*%d, (s+1)*%d) of those%s\n",
                  *dp, *pp, *tp, n, n, *tp, *tp,
                  *ep ? "; routed experts partitioned over all ranks" : "");
    const int n_layers = static_cast<int>((*m)->config().n_layers);
    m->reset();
    // The engine's communicators (SplitJob).
    StatusOr<std::unique_ptr<JobLayout>> L = SplitJob(*world, *tp, *pp, *dp);
    if (!L.ok()) (*world)->Abort(L.status().ToString());
    auto shard = LoadModel(*path, (*L)->Shard(*ep));
    if (!shard.ok()) (*world)->Abort(shard.status().ToString());
    PipelineStage stage;  // (the split the shard made)
    if (const Status st = stage.Plan(n_layers, (*L)->pp, *path); !st.ok())
      (*world)->Abort(st.ToString());
    PrintShard(**L, **shard, stage, n_layers);
  });
}

}  // namespace peng::tools
