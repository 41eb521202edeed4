// libFuzzer target: GgufFile::FromBytes on arbitrary bytes must return a Status or a file whose
// every tensor lies inside the input (model_file_check.h), and whose metadata reads as any type
// without harm; never crash or throw.
#include <cstddef>
#include <cstdint>

#include "formats/gguf.h"
#include "model_file_check.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  auto f = peng::GgufFile::FromBytes(data, size, "fuzz.gguf");
  if (!peng::fuzz::CheckModelFile(f, "fuzz.gguf", data, size)) return 0;
  volatile uint8_t sink = 0;
  for (const auto& [key, value] : (*f)->metadata()) {
    sink = sink + static_cast<uint8_t>(key.size());
    (void)(*f)->GetInt(key);
    (void)(*f)->GetFloat(key);
    (void)(*f)->GetString(key);
  }
  return 0;
}
