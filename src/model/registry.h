// The architecture registry: maps an architecture name (GGUF general.architecture or HF
// model_type) to the function that builds the Model from opened files. Adding a model is one
// folder with its loader and one line in registry.cc. LoadModel() is the entry point the
// engine and tools use.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "core/status.h"
#include "model/model.h"
#include "model/model_files.h"

namespace peng {

class Communicator;

// How this process takes part in a multi-process model (parallel/communicator.h).
struct ModelLoadOptions {
  // Tensor parallelism: this rank computes its share of the heads, the FFN and the vocabulary
  // and loads only those weights; null or size 1 = the whole model.
  Communicator* tp = nullptr;
  // Pipeline parallelism: the stages of this rank's tensor-parallel index, in order; this rank
  // binds and runs its stage's layers only (layers/pipeline.h). Null or size 1: every layer.
  Communicator* pp = nullptr;
  // MoE models under tensor parallelism: each rank runs whole routed experts (its E / tp) instead
  // of a slice of every expert (--enable-expert-parallel; no effect on dense models).
  bool expert_parallel = false;
  // With expert_parallel and data parallelism: the ranks of this rank's tensor-parallel index
  // in every replica; MoE models then partition the experts over all of them.
  Communicator* ep_replicas = nullptr;
  // Read the weight files into private transparent-huge-page memory instead of mapping them in
  // place (MappedFile::Open; faster decoding, no page cache shared with other processes).
  bool huge_pages = false;
};

using ModelLoaderFn = StatusOr<std::unique_ptr<Model>> (*)(std::unique_ptr<ModelFiles> files,
                                                           const ModelLoadOptions& options);

struct ArchEntry {
  const char* name;       // "llama"
  ModelLoaderFn load;
};

const std::vector<ArchEntry>& Architectures();

// Opens `path` (GGUF file or HF folder) and builds the model of its architecture. Unknown
// architectures give an Unimplemented status listing the supported ones.
StatusOr<std::unique_ptr<Model>> LoadModel(const std::string& path,
                                           const ModelLoadOptions& options = {});

// Per-architecture loaders (defined in their folders).
StatusOr<std::unique_ptr<Model>> LoadLlama(std::unique_ptr<ModelFiles> files,
                                             const ModelLoadOptions& options);
StatusOr<std::unique_ptr<Model>> LoadQwen2(std::unique_ptr<ModelFiles> files,
                                             const ModelLoadOptions& options);
StatusOr<std::unique_ptr<Model>> LoadGemma3(std::unique_ptr<ModelFiles> files,
                                             const ModelLoadOptions& options);
StatusOr<std::unique_ptr<Model>> LoadDeepseek2(std::unique_ptr<ModelFiles> files,
                                             const ModelLoadOptions& options);

}  // namespace peng
