// libFuzzer target: SafetensorsFile::FromBytes on arbitrary bytes must return a Status or a
// file whose every tensor lies inside the input (model_file_check.h); never crash or throw.
#include <cstddef>
#include <cstdint>

#include "formats/safetensors.h"
#include "model_file_check.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  auto f = peng::SafetensorsFile::FromBytes(data, size, "fuzz.safetensors");
  peng::fuzz::CheckModelFile(f, "fuzz.safetensors", data, size);
  return 0;
}
