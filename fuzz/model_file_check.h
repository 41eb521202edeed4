// What the model-file fuzz targets (gguf_fuzz, safetensors_fuzz) require of a reader's answer
// to arbitrary bytes: an error whose message starts with the name given, or a file whose every
// tensor is found by its name and lies inside the input (ASan checks the reads).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "core/check.h"
#include "core/tensor.h"

namespace peng::fuzz {

template <typename FileOr>
bool CheckModelFile(const FileOr& f, const std::string& name, const uint8_t* data, size_t size) {
  if (!f.ok()) {
    PENG_CHECK(f.status().message().rfind(name + ": ", 0) == 0);
    return false;
  }
  volatile uint8_t sink = 0;
  for (const TensorView& t : (*f)->tensors()) {
    PENG_CHECK((*f)->FindTensor(t.name) == &t);
    const auto* p = static_cast<const uint8_t*>(t.data);
    PENG_CHECK(p >= data && p + t.size_bytes <= data + size);
    if (t.size_bytes > 0) sink = sink + p[0] + p[t.size_bytes - 1];
  }
  return true;
}

}  // namespace peng::fuzz
