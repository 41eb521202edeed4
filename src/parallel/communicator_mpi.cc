// The Open MPI communicator (compiled only when CMake found MPI: PENG_HAVE_MPI).
#if PENG_HAVE_MPI
#include <mpi.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <thread>
#include <cstdlib>
#include <vector>

#include "parallel/communicator.h"

namespace peng {
namespace {

class MpiCommunicator : public Communicator {
 public:
  MpiCommunicator(MPI_Comm comm, bool owned) : comm_(comm), owned_(owned) {
    MPI_Comm_rank(comm_, &rank_);
    MPI_Comm_size(comm_, &size_);
  }
  ~MpiCommunicator() override {
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (owned_ && !finalized) MPI_Comm_free(&comm_);
  }
  int rank() const override { return rank_; }
  int size() const override { return size_; }

  void AllReduceSum(float* data, int64_t n) override {
    for (int64_t done = 0; done < n;) {  // MPI counts are int
      const int c = static_cast<int>(std::min<int64_t>(n - done, kMaxCount));
      Check(MPI_Allreduce(MPI_IN_PLACE, data + done, c, MPI_FLOAT, MPI_SUM, comm_), "all-reduce");
      done += c;
    }
  }
  void ReduceScatterSum(const float* in, float* out, int64_t n) override {
    CheckCount(n, "reduce-scatter");
    Check(MPI_Reduce_scatter_block(in, out, static_cast<int>(n), MPI_FLOAT, MPI_SUM, comm_),
          "reduce-scatter");
  }
  void AllGather(const void* in, int64_t bytes, void* out) override {
    CheckCount(bytes, "all-gather");
    Check(MPI_Allgather(in, static_cast<int>(bytes), MPI_BYTE, out, static_cast<int>(bytes),
                        MPI_BYTE, comm_),
          "all-gather");
  }
  void Gather(const void* in, int64_t bytes, void* out, int root) override {
    CheckCount(bytes, "gather");
    Check(MPI_Gather(in, static_cast<int>(bytes), MPI_BYTE, out, static_cast<int>(bytes),
                     MPI_BYTE, root, comm_),
          "gather");
  }
  void Broadcast(void* data, int64_t bytes, int root) override {
    CheckCount(bytes, "broadcast");
    Check(MPI_Bcast(data, static_cast<int>(bytes), MPI_BYTE, root, comm_), "broadcast");
  }
  void BroadcastPolled(void* data, int64_t bytes, int root) override {
    CheckCount(bytes, "broadcast");
    MPI_Request req;
    Check(MPI_Ibcast(data, static_cast<int>(bytes), MPI_BYTE, root, comm_, &req), "broadcast");
    if (rank_ == root) {
      Check(MPI_Wait(&req, MPI_STATUS_IGNORE), "broadcast");
      return;
    }
    const auto start = std::chrono::steady_clock::now();
    for (int done = 0;;) {
      Check(MPI_Test(&req, &done, MPI_STATUS_IGNORE), "broadcast");
      if (done) return;
      if (std::chrono::steady_clock::now() - start > std::chrono::milliseconds(2))
        std::this_thread::sleep_for(std::chrono::microseconds(100));
    }
  }
  void AllToAll(const void* in, int64_t bytes, void* out) override {
    CheckCount(bytes, "all-to-all");
    Check(MPI_Alltoall(in, static_cast<int>(bytes), MPI_BYTE, out, static_cast<int>(bytes),
                       MPI_BYTE, comm_),
          "all-to-all");
  }
  void AllToAllV(const void* in, const int64_t* send_bytes, void* out,
                 const int64_t* recv_bytes) override {
    std::vector<int> sc(size_), sd(size_), rc(size_), rd(size_);
    int64_t s_at = 0, r_at = 0;
    for (int r = 0; r < size_; ++r) {
      CheckCount(s_at + send_bytes[r], "all-to-all");
      CheckCount(r_at + recv_bytes[r], "all-to-all");
      sc[r] = static_cast<int>(send_bytes[r]);
      sd[r] = static_cast<int>(s_at);
      rc[r] = static_cast<int>(recv_bytes[r]);
      rd[r] = static_cast<int>(r_at);
      s_at += send_bytes[r];
      r_at += recv_bytes[r];
    }
    Check(MPI_Alltoallv(in, sc.data(), sd.data(), MPI_BYTE, out, rc.data(), rd.data(), MPI_BYTE,
                        comm_),
          "all-to-all");
  }
  void Send(const void* in, int64_t bytes, int to) override {
    for (int64_t done = 0; done < bytes || done == 0;) {  // (in pieces MPI's int counts hold)
      const int c = static_cast<int>(std::min<int64_t>(bytes - done, kMaxCount));
      Check(MPI_Send(static_cast<const char*>(in) + done, c, MPI_BYTE, to, kPointToPoint, comm_),
            "send");
      if ((done += c) == 0) break;
    }
  }
  void Recv(void* out, int64_t bytes, int from) override {
    for (int64_t done = 0; done < bytes || done == 0;) {
      const int c = static_cast<int>(std::min<int64_t>(bytes - done, kMaxCount));
      Check(MPI_Recv(static_cast<char*>(out) + done, c, MPI_BYTE, from, kPointToPoint, comm_,
                     MPI_STATUS_IGNORE),
            "receive");
      if ((done += c) == 0) break;
    }
  }
  void Barrier() override { Check(MPI_Barrier(comm_), "barrier"); }
  [[noreturn]] void Abort(const std::string& message) override {
    std::fprintf(stderr, "peng: rank %d: fatal: %s; aborting the MPI job\n", rank_,
                 message.c_str());
    std::fflush(stderr);
    MPI_Abort(MPI_COMM_WORLD, 1);
    std::_Exit(1);
  }
  std::unique_ptr<Communicator> Split(int color, int key) override {
    MPI_Comm sub;
    Check(MPI_Comm_split(comm_, color, key, &sub), "split");
    return std::make_unique<MpiCommunicator>(sub, true);
  }
  std::string Describe() const override {
    char version[MPI_MAX_LIBRARY_VERSION_STRING];
    int len = 0;
    MPI_Get_library_version(version, &len);
    std::string v(version, len);
    if (const size_t nl = v.find_first_of(",\n"); nl != std::string::npos) v.resize(nl);
    return v + ", rank " + std::to_string(rank_) + " of " + std::to_string(size_);
  }

 private:
  static constexpr int64_t kMaxCount = int64_t{1} << 30;
  static constexpr int kPointToPoint = 17;  // (the tag of Send / Recv)
  void CheckCount(int64_t n, const char* what) {
    if (n < 0 || n > kMaxCount) Abort(std::string(what) + " of " + std::to_string(n) + " bytes");
  }
  void Check(int rc, const char* what) {
    if (rc == MPI_SUCCESS) return;
    char text[MPI_MAX_ERROR_STRING];
    int len = 0;
    MPI_Error_string(rc, text, &len);
    Abort(std::string("MPI ") + what + " failed: " + std::string(text, len));
  }

  MPI_Comm comm_;
  bool owned_;
  int rank_ = 0, size_ = 1;
};

std::unique_ptr<Communicator>& World() {
  static std::unique_ptr<Communicator> world;
  return world;
}

}  // namespace

bool MpiAvailable() { return true; }

StatusOr<Communicator*> WorldComm() {
  std::unique_ptr<Communicator>& world = World();
  if (world) return world.get();
  if (!LaunchedByMpirun()) {
    world = MakeSingleProcessCommunicator();
    return world.get();
  }
  int provided = 0;
  if (MPI_Init_thread(nullptr, nullptr, MPI_THREAD_SERIALIZED, &provided) != MPI_SUCCESS)
    return Internal("MPI_Init_thread failed");
  if (provided < MPI_THREAD_SERIALIZED) {
    MPI_Finalize();
    return Unimplemented("this MPI library does not support MPI_THREAD_SERIALIZED");
  }
  // A failing collective aborts the job (never a hang on a half-dead job).
  MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_ARE_FATAL);
  world = std::make_unique<MpiCommunicator>(MPI_COMM_WORLD, false);
  return world.get();
}

void FinalizeWorld() {
  std::unique_ptr<Communicator>& world = World();
  const bool mpi = world && world->Describe() != "single process";
  world.reset();
  int initialized = 0, finalized = 0;
  MPI_Initialized(&initialized);
  MPI_Finalized(&finalized);
  if (mpi && initialized && !finalized) MPI_Finalize();
}

}  // namespace peng
#endif  // PENG_HAVE_MPI
