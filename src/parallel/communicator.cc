#include "parallel/communicator.h"

#include <cstdio>
#include <cstdlib>
#include <cstring>

namespace peng {
namespace {

class SingleProcessCommunicator : public Communicator {
 public:
  int rank() const override { return 0; }
  int size() const override { return 1; }
  void AllReduceSum(float*, int64_t) override {}
  void ReduceScatterSum(const float* in, float* out, int64_t n) override {
    if (in != out && n > 0) std::memmove(out, in, static_cast<size_t>(n) * sizeof(float));
  }
  void AllGather(const void* in, int64_t bytes, void* out) override {
    if (in != out && bytes > 0) std::memmove(out, in, static_cast<size_t>(bytes));
  }
  void Gather(const void* in, int64_t bytes, void* out, int) override {
    if (in != out && bytes > 0) std::memmove(out, in, static_cast<size_t>(bytes));
  }
  void Broadcast(void*, int64_t, int) override {}
  void BroadcastPolled(void*, int64_t, int) override {}
  void AllToAll(const void* in, int64_t bytes, void* out) override {
    if (in != out && bytes > 0) std::memmove(out, in, static_cast<size_t>(bytes));
  }
  void AllToAllV(const void* in, const int64_t* send_bytes, void* out,
                 const int64_t*) override {
    if (in != out && send_bytes[0] > 0) std::memmove(out, in, static_cast<size_t>(send_bytes[0]));
  }
  void Barrier() override {}
  [[noreturn]] void Abort(const std::string& message) override {
    std::fprintf(stderr, "peng: fatal: %s\n", message.c_str());
    std::fflush(stderr);
    std::_Exit(1);
  }
  std::unique_ptr<Communicator> Split(int, int) override {
    return MakeSingleProcessCommunicator();
  }
  std::string Describe() const override { return "single process"; }
};

}  // namespace

std::unique_ptr<Communicator> MakeSingleProcessCommunicator() {
  return std::make_unique<SingleProcessCommunicator>();
}

bool LaunchedByMpirun() {
  return std::getenv("OMPI_COMM_WORLD_SIZE") != nullptr || std::getenv("PMIX_RANK") != nullptr;
}

#if !PENG_HAVE_MPI
bool MpiAvailable() { return false; }

StatusOr<Communicator*> WorldComm() {
  static std::unique_ptr<Communicator> world = MakeSingleProcessCommunicator();
  if (LaunchedByMpirun())
    return Unimplemented("started by mpirun, but this peng was built without MPI "
                         "(install libopenmpi-dev and rebuild)");
  return world.get();
}

void FinalizeWorld() {}
#endif

}  // namespace peng
