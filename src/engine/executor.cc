#include "engine/executor.h"

#include <unistd.h>

#include <algorithm>
#include <exception>
#include <string>

#include "engine/engine.h"

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
    try {
      for (const BlockCopy& cp : copies) kv_->CopyBlock(cp.src, cp.dst);
      return model_->Forward(batch, kv_.get(), logits, &pool_);
    } catch (const std::exception& e) {
      return Internal(std::string("exception in the forward pass: ") + e.what());
    }
  }
  Model& model() override { return *model_; }
  ThreadPool& pool() override { return pool_; }

 private:
  ThreadPool pool_;
  std::unique_ptr<Model> model_;
  std::unique_ptr<KvCache> kv_;
};

}  // namespace

int64_t EffectiveMaxModelLen(const EngineOptions& o, const ModelConfig& cfg) {
  return cfg.max_position > 0 ? std::min<int64_t>(o.max_model_len, cfg.max_position)
                              : o.max_model_len;
}

StatusOr<std::unique_ptr<Executor>> CreateLocalExecutor(const EngineOptions& o,
                                                        std::unique_ptr<Model> model) {
  if (!model) return InvalidArgument("no model");
  if (o.threads < 0) return InvalidArgument("threads must be >= 0");
  const int64_t max_len = EffectiveMaxModelLen(o, model->config());
  int64_t blocks;
  if (o.num_kv_blocks > 0) {
    blocks = o.num_kv_blocks;
  } else if (o.kv_cache_bytes == 0) {
    blocks = int64_t{o.max_num_seqs} * ((max_len + o.block_size - 1) / o.block_size);
    blocks = std::min(blocks, KvCache::BlocksForBudget(model->kv_spec(), o.block_size,
                                                       o.kv_dtype, PhysicalMemoryBytes() / 4));
  } else {
    blocks = KvCache::BlocksForBudget(model->kv_spec(), o.block_size, o.kv_dtype,
                                      o.kv_cache_bytes);
  }
  if (blocks < 1)
    return InvalidArgument("the KV cache budget of " + std::to_string(o.kv_cache_bytes) +
                           " bytes holds no block of " + std::to_string(o.block_size) + " tokens");
  PENG_ASSIGN_OR_RETURN(std::unique_ptr<KvCache> kv,
                        KvCache::Create(model->kv_spec(), blocks, o.block_size, o.kv_dtype));
  return std::unique_ptr<Executor>(new LocalExecutor(o.threads, std::move(model), std::move(kv)));
}

}  // namespace peng
