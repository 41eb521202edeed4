// Paths for tests: the downloaded models, and the source tree ($PENG_SOURCE_DIR at run time, else the PENG_SOURCE_DIR
// compile definition that peng_add_test gives every test target). Header-only; tests only.
#pragma once

#include <sys/stat.h>

#include <cstdlib>
#include <string>

namespace peng::test_util {

inline std::string SourceDir() {
  if (const char* env = std::getenv("PENG_SOURCE_DIR")) return env;
  return PENG_SOURCE_DIR;
}

// The downloaded models (scripts/fetch_models.sh): $PENG_MODELS_DIR, else <source>/models.
inline std::string ModelsDir() {
  if (const char* env = std::getenv("PENG_MODELS_DIR")) return env;
  return SourceDir() + "/models";
}

// Path of model file `name` in ModelsDir(), or "" when it is not there (the test then skips).
inline std::string ModelFile(const std::string& name) {
  const std::string path = ModelsDir() + "/" + name;
  struct stat st;
  return ::stat(path.c_str(), &st) == 0 ? path : "";
}

}  // namespace peng::test_util
