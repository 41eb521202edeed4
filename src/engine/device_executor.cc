// The executor of `--device cuda[:N]`: the engine core's batches on a backend::Device.
#include <algorithm>
#include <string>
#include <vector>

#include "backend/device.h"
#include "engine/engine.h"
#include "engine/executor.h"
#include "model/device_model.h"
#include "parallel/communicator.h"

namespace peng {
namespace {

class DeviceExecutor : public Executor {
 public:
  DeviceExecutor(int threads, std::unique_ptr<Model> model)
      : pool_(threads), model_(std::move(model)) {}

  Status Init(const EngineOptions& o) {
    PENG_ASSIGN_OR_RETURN(device_, backend::CreateDevice(o.device, &pool_));
    PENG_ASSIGN_OR_RETURN(dm_, DeviceModel::Create(*model_, device_.get()));
    dm_->set_host_pool(&pool_);
    // A KV cache sized by the device's memory takes what the largest step's scratch leaves.
    if (KvSizedByMemory(o) && device_->CountsMemory())
      PENG_RETURN_IF_ERROR(dm_->ReserveStepScratch(o.max_num_batched_tokens, o.max_num_seqs,
                                                   o.block_size, o.kv_dtype));
    // What of the share of the device's memory is still free after the weights (its other
    // users' memory counts as used; `others`: the rest of the device).
    const int64_t free = device_->FreeMemoryBytes(), total = device_->TotalMemoryBytes();
    const double others = (1 - o.gpu_memory_utilization) * static_cast<double>(total);
    const int64_t cap = std::max<int64_t>(0, free - static_cast<int64_t>(others));
    const StatusOr<int64_t> mine = KvBlocks(o, *model_, cap);
    int64_t blocks = mine.ok() ? *mine : 0;
    if (o.kv_group) {  // every rank the same, the smallest (a collective: every rank gets here)
      std::vector<int64_t> all(o.kv_group->size());
      o.kv_group->AllGather(&blocks, sizeof blocks, all.data());
      blocks = *std::min_element(all.begin(), all.end());
    }
    if (!mine.ok()) return mine.status();
    if (blocks < 1)
      return ResourceExhausted("no KV cache block of " + std::to_string(o.block_size) +
                               " tokens fits some rank's share of its device's memory "
                               "(--gpu-memory-utilization)");
    return dm_->AllocateKvCache(blocks, o.block_size, o.kv_dtype);
  }

  const ModelConfig& config() const override { return model_->config(); }
  int64_t num_kv_blocks() const override { return dm_->num_kv_blocks(); }
  int block_size() const override { return dm_->block_size(); }
  Status Execute(const ForwardBatch& batch, std::span<const BlockCopy> copies,
                 float* logits) override {
    return GuardForwardPass([&] {
      for (const BlockCopy& cp : copies) dm_->CopyBlock(cp.src, cp.dst);
      return dm_->Forward(batch, logits);
    });
  }
  int64_t DeviceKernelLaunches() const override { return device_->KernelLaunches(); }
  Status Health() const override { return device_->Health(); }
  int top_logits_max() const override { return dm_->top_logits_max(); }
  Status CopyLogitRow(int64_t row, float* dst) override { return dm_->CopyLogitRow(row, dst); }
  int top_logits_wide() const override {
    return dm_->top_logits_max() > 0 ? backend::Device::kTopLogitsWide : 0;
  }
  Status CopyBestOfLogitRows(std::span<const int64_t> rows, int k, float* val,
                             int32_t* idx) override {
    return dm_->CopyBestOfLogitRows(rows, k, val, idx);
  }
  Model& model() override { return *model_; }
  ThreadPool& pool() override { return pool_; }

 private:
  // Destroyed in reverse: the device model before the device, both before the host model.
  ThreadPool pool_;
  std::unique_ptr<Model> model_;
  std::unique_ptr<backend::Device> device_;
  std::unique_ptr<DeviceModel> dm_;
};

}  // namespace

StatusOr<std::unique_ptr<Executor>> CreateDeviceExecutor(const EngineOptions& o,
                                                         std::unique_ptr<Model> model) {
  if (!model) return InvalidArgument("no model");
  auto ex = std::make_unique<DeviceExecutor>(o.threads, std::move(model));
  PENG_RETURN_IF_ERROR(ex->Init(o));
  return std::unique_ptr<Executor>(std::move(ex));
}

}  // namespace peng
