// The job's communicator for the MPI test programs (tests/parallel): WorldComm(), or an abort
// with the reason when it cannot be had.
#pragma once

#include <cstdio>
#include <cstdlib>

#include "parallel/communicator.h"

namespace peng::test_util {

inline Communicator* World() {
  static Communicator* w = [] {
    StatusOr<Communicator*> c = WorldComm();
    if (!c.ok()) {
      std::fprintf(stderr, "%s\n", c.status().ToString().c_str());
      std::abort();
    }
    return *c;
  }();
  return w;
}

}  // namespace peng::test_util
