// Paths for tests: the source tree ($PENG_SOURCE_DIR at run time, else the PENG_SOURCE_DIR
// compile definition that peng_add_test gives every test target). Header-only; tests only.
#pragma once

#include <cstdlib>
#include <string>

namespace peng::test_util {

inline std::string SourceDir() {
  if (const char* env = std::getenv("PENG_SOURCE_DIR")) return env;
  return PENG_SOURCE_DIR;
}

}  // namespace peng::test_util
