// PENG_CHECK: aborts with file:line and a message when an internal invariant is broken.
// For programmer errors only; bad user input must produce a Status instead.
#pragma once

#include <cstdio>
#include <cstdlib>

namespace peng::internal {
[[noreturn]] inline void CheckFail(const char* file, int line, const char* cond, const char* msg) {
  std::fprintf(stderr, "%s:%d: PENG_CHECK failed: %s%s%s\n", file, line, cond, msg[0] ? " -- " : "",
               msg);
  std::abort();
}
}  // namespace peng::internal

#define PENG_CHECK(cond)                                                 \
  do {                                                                   \
    if (!(cond)) ::peng::internal::CheckFail(__FILE__, __LINE__, #cond, ""); \
  } while (0)

#define PENG_CHECK_MSG(cond, msg)                                           \
  do {                                                                      \
    if (!(cond)) ::peng::internal::CheckFail(__FILE__, __LINE__, #cond, msg); \
  } while (0)

#ifdef NDEBUG
#define PENG_DCHECK(cond) \
  do {                    \
  } while (0)
#else
#define PENG_DCHECK(cond) PENG_CHECK(cond)
#endif
