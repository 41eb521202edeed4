// peng info: what peng sees in a model file and on this machine.
#include <cstdio>

#include "core/cpu_features.h"
#include "kernels/isa.h"
#include "model/registry.h"
#include "tools/commands.h"

namespace peng::tools {

void RegisterInfo(CLI::App& app, int* exit_code) {
  auto path = std::make_shared<std::string>();
  CLI::App* c = app.add_subcommand("info", "Show CPU features and a model's configuration");
  c->add_option("-m,--model", *path, "GGUF file or Hugging Face model folder");
  c->callback([path, exit_code] {
    std::printf("cpu: %s (%d physical / %d logical cores)\nkernels: %s\n",
                GetCpuFeatures().ToString().c_str(), GetCpuFeatures().physical_cores,
                GetCpuFeatures().logical_cores, kernels::IsaName(kernels::ActiveIsa()));
    if (path->empty()) return;
    auto m = LoadModel(*path);
    if (!m.ok()) {
      *exit_code = Fail(m.status().ToString());
      return;
    }
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
  });
}

}  // namespace peng::tools
