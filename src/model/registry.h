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

using ModelLoaderFn = StatusOr<std::unique_ptr<Model>> (*)(std::unique_ptr<ModelFiles> files);

struct ArchEntry {
  const char* name;       // "llama"
  ModelLoaderFn load;
};

const std::vector<ArchEntry>& Architectures();

// Opens `path` (GGUF file or HF folder) and builds the model of its architecture. Unknown
// architectures give an Unimplemented status listing the supported ones.
StatusOr<std::unique_ptr<Model>> LoadModel(const std::string& path);

// Per-architecture loaders (defined in their folders).
StatusOr<std::unique_ptr<Model>> LoadLlama(std::unique_ptr<ModelFiles> files);
StatusOr<std::unique_ptr<Model>> LoadQwen2(std::unique_ptr<ModelFiles> files);
StatusOr<std::unique_ptr<Model>> LoadGemma3(std::unique_ptr<ModelFiles> files);
StatusOr<std::unique_ptr<Model>> LoadDeepseek2(std::unique_ptr<ModelFiles> files);

}  // namespace peng
