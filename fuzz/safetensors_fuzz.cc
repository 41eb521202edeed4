// libFuzzer target: SafetensorsFile::FromBytes on arbitrary bytes must return a Status or a
// file whose every tensor lies inside the input (ASan checks the reads below), never crash or
// throw.
#include <cstddef>
#include <cstdint>

#include "core/check.h"
#include "formats/safetensors.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  auto f = peng::SafetensorsFile::FromBytes(data, size, "fuzz.safetensors");
  if (!f.ok()) {
    PENG_CHECK(f.status().message().rfind("fuzz.safetensors: ", 0) == 0);
    return 0;
  }
  volatile uint8_t sink = 0;
  for (const peng::TensorView& t : (*f)->tensors()) {
    PENG_CHECK((*f)->FindTensor(t.name) == &t);
    const auto* p = static_cast<const uint8_t*>(t.data);
    PENG_CHECK(p >= data && p + t.size_bytes <= data + size);
    if (t.size_bytes > 0) sink = sink + p[0] + p[t.size_bytes - 1];
  }
  return 0;
}
