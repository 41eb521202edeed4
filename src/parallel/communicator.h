// Communicator: the collectives that tensor, expert and data parallelism need between the
// processes ("ranks") of one job -- rank, size, all-reduce (sum), all-gather, broadcast,
// all-to-all, send / receive, barrier and abort. Two implementations: a single-process one (size 1: every
// collective is the identity) and Open MPI (communicator_mpi.cc, compiled in when CMake finds
// MPI; jobs start with `mpirun`). A GPU backend can put NCCL behind the same interface.
//
// Collectives are blocking and must be called by every rank of the communicator in the same
// order with the same sizes (a mismatch is a bug that hangs or aborts the job). Not
// thread-safe: one thread of each rank (the engine thread) issues them.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "core/status.h"

namespace peng {

class Communicator {
 public:
  virtual ~Communicator() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  // data[0, n) = the element-wise sum over all ranks, on every rank.
  virtual void AllReduceSum(float* data, int64_t n) = 0;
  // out[0, n) = the element-wise sum over all ranks of in[rank() * n, (rank() + 1) * n): each
  // rank gets its block of the summed in[0, size() * n).
  virtual void ReduceScatterSum(const float* in, float* out, int64_t n) = 0;
  // out[r * bytes, (r + 1) * bytes) = rank r's `in`, on every rank (out: size() * bytes).
  virtual void AllGather(const void* in, int64_t bytes, void* out) = 0;
  // out[r * bytes, (r + 1) * bytes) = rank r's `in`, on rank `root` only (out is ignored
  // elsewhere and may be null).
  virtual void Gather(const void* in, int64_t bytes, void* out, int root) = 0;
  // Rank `root`'s data[0, bytes) on every rank.
  virtual void Broadcast(void* data, int64_t bytes, int root) = 0;
  // The same for a broadcast the receivers may wait long for (workers between requests): they
  // poll, and sleep between polls once ~2 ms have passed, so an idle job does not keep its
  // cores spinning. Matches only BroadcastPolled on the other ranks (MPI: a non-blocking
  // broadcast never matches a blocking one).
  virtual void BroadcastPolled(void* data, int64_t bytes, int root) = 0;
  // Sends in[r * bytes, (r + 1) * bytes) to rank r; out[r * bytes, ...) is what rank r sent
  // here.
  virtual void AllToAll(const void* in, int64_t bytes, void* out) = 0;
  // The same with a size per pair: sends send_bytes[r] bytes to rank r (the blocks lie
  // back-to-back in `in`, in rank order) and receives recv_bytes[r] from rank r into `out`
  // (back-to-back); recv_bytes[r] must equal what rank r sends here.
  virtual void AllToAllV(const void* in, const int64_t* send_bytes, void* out,
                         const int64_t* recv_bytes) = 0;
  // Point to point (pipeline parallelism: a stage's output to the next): in[0, bytes) to rank
  // `to`, which receives it into out[0, bytes) with Recv from this rank. Blocking; where a
  // communicator has none (the single process, the device's), ends the job.
  virtual void Send(const void* in, int64_t bytes, int to) {
    Abort("point-to-point sends are not offered by " + Describe());
  }
  virtual void Recv(void* out, int64_t bytes, int from) {
    Abort("point-to-point receives are not offered by " + Describe());
  }
  virtual void Barrier() = 0;
  // Ends the whole job at once with `message` on stderr (a rank that cannot go on: the others
  // would wait forever in their next collective). Never returns.
  [[noreturn]] virtual void Abort(const std::string& message) = 0;
  // Splits this communicator into groups of the ranks with the same `color`, ordered by `key`
  // (tensor-parallel groups inside a data-parallel job). Collective.
  virtual std::unique_ptr<Communicator> Split(int color, int key) = 0;
  virtual std::string Describe() const = 0;  // "single process", "Open MPI 4.1.4, rank 1 of 2"
  // Whether AllReduceSum, ReduceScatterSum, AllGather and Broadcast (over device memory, in the
  // device's stream) may be recorded into the device's graphs (Device::BeginGraph) and run when
  // they replay: NCCL's are. The host's collectives run when called: never.
  virtual bool InDeviceGraphs() const { return false; }
};

// The communicator of a process that runs alone (size 1).
std::unique_ptr<Communicator> MakeSingleProcessCommunicator();

// True when this binary has the MPI communicator compiled in.
bool MpiAvailable();
// True when this process was started by mpirun (Open MPI / PMIx environment), i.e. WorldComm()
// will be an MPI communicator even for a job of one process.
bool LaunchedByMpirun();
// The communicator of all processes of the job: MPI_COMM_WORLD when launched by mpirun (MPI is
// initialized on the first call, with MPI_THREAD_SERIALIZED), else a single process. Lives until
// FinalizeWorld(). Not thread-safe on the first call.
StatusOr<Communicator*> WorldComm();
// Shuts MPI down (after every rank's last collective); a no-op without MPI.
void FinalizeWorld();

}  // namespace peng
