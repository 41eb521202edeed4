#include "backend/cuda/nccl_communicator.h"

#include "backend/cuda/dispatch.h"

#if defined(PENG_CUDA_EMULATOR)
#include "backend/cuda/nccl_emulator.h"
#else
#include <nccl.h>
#endif

#include <cstdlib>
#include <string>
#include <vector>

namespace peng::backend::cuda {
namespace {

class NcclCommunicator final : public Communicator {
 public:
  NcclCommunicator(Communicator* group, ncclComm_t comm, cudaStream_t stream)
      : group_(group), comm_(comm), stream_(stream) {}
  ~NcclCommunicator() override { ncclCommDestroy(comm_); }

  int rank() const override { return group_->rank(); }
  int size() const override { return group_->size(); }
  void AllReduceSum(float* data, int64_t n) override {
    Check(ncclAllReduce(data, data, n, ncclFloat, ncclSum, comm_, stream_), "ncclAllReduce");
  }
  void ReduceScatterSum(const float* in, float* out, int64_t n) override {
    Check(ncclReduceScatter(in, out, n, ncclFloat, ncclSum, comm_, stream_), "ncclReduceScatter");
  }
  void AllGather(const void* in, int64_t bytes, void* out) override {
    Check(ncclAllGather(in, out, bytes, ncclChar, comm_, stream_), "ncclAllGather");
  }
  void Gather(const void* in, int64_t bytes, void* out, int root) override {
    Check(ncclGroupStart(), "ncclGroupStart");
    if (rank() == root) {
      for (int r = 0; r < size(); ++r) {
        char* dst = static_cast<char*>(out) + r * bytes;
        if (r == root) {
          cudaMemcpyAsync(dst, in, bytes, cudaMemcpyDeviceToDevice, stream_);
        } else {
          Check(ncclRecv(dst, bytes, ncclChar, r, comm_, stream_), "ncclRecv");
        }
      }
    } else {
      Check(ncclSend(in, bytes, ncclChar, root, comm_, stream_), "ncclSend");
    }
    Check(ncclGroupEnd(), "ncclGroupEnd");
  }
  void Broadcast(void* data, int64_t bytes, int root) override {
    Check(ncclBroadcast(data, data, bytes, ncclChar, root, comm_, stream_), "ncclBroadcast");
  }
  void BroadcastPolled(void* data, int64_t bytes, int root) override {
    Broadcast(data, bytes, root);
  }
  void AllToAll(const void* in, int64_t bytes, void* out) override {
    std::vector<int64_t> b(size(), bytes);
    AllToAllV(in, b.data(), out, b.data());
  }
  void AllToAllV(const void* in, const int64_t* send_bytes, void* out,
                 const int64_t* recv_bytes) override {
    int64_t so = 0, ro = 0;
    Check(ncclGroupStart(), "ncclGroupStart");
    for (int r = 0; r < size(); ++r) {
      if (send_bytes[r] > 0)
        Check(ncclSend(static_cast<const char*>(in) + so, send_bytes[r], ncclChar, r, comm_,
                       stream_), "ncclSend");
      if (recv_bytes[r] > 0)
        Check(ncclRecv(static_cast<char*>(out) + ro, recv_bytes[r], ncclChar, r, comm_, stream_),
              "ncclRecv");
      so += send_bytes[r];
      ro += recv_bytes[r];
    }
    Check(ncclGroupEnd(), "ncclGroupEnd");
  }
  void Barrier() override {
    cudaStreamSynchronize(stream_);
    group_->Barrier();
  }
  [[noreturn]] void Abort(const std::string& message) override {
    group_->Abort(message);
    std::abort();  // (not reached)
  }
  // NCCL groups are made from host groups (CreateNcclCommunicator over a Split of the host
  // communicator), not split themselves.
  std::unique_ptr<Communicator> Split(int, int) override {
    Abort("Split of an NCCL communicator: split the host communicator instead");
  }
  // NCCL's collectives are captured by CUDA graphs; PENG_NCCL_IN_GRAPHS=0: steps with
  // collectives run unrecorded.
  bool InDeviceGraphs() const override { return in_graphs_; }
  std::string Describe() const override {
    int v = 0;
    ncclGetVersion(&v);
    return "NCCL " + std::to_string(v) + " over " + group_->Describe();
  }

 private:
  // A failed collective leaves the ranks out of step: the job ends (as with MPI's errors).
  void Check(ncclResult_t r, const char* what) {
    if (r != ncclSuccess)
      group_->Abort(std::string(what) + " failed: " + ncclGetErrorString(r));
  }

  Communicator* group_;
  ncclComm_t comm_;
  cudaStream_t stream_;
  const bool in_graphs_ = EnvOn("PENG_NCCL_IN_GRAPHS");
};

}  // namespace

StatusOr<std::unique_ptr<Communicator>> CreateNcclCommunicator(Communicator* group, int device,
                                                               cudaStream_t stream) {
  // Every connection made by ncclCommInitRank, unless the environment says otherwise: from NCCL
  // 2.22 on a connection is made at the first collective that needs it, which may be inside a
  // graph being recorded (InDeviceGraphs).
  setenv("NCCL_RUNTIME_CONNECT", "0", 0);
  ncclUniqueId id{};
  ncclResult_t r = ncclSuccess;
  if (group->rank() == 0) r = ncclGetUniqueId(&id);
  int ok = r == ncclSuccess;
  group->Broadcast(&ok, sizeof ok, 0);
  if (!ok) return Internal(std::string("ncclGetUniqueId: ") + ncclGetErrorString(r));
  group->Broadcast(&id, sizeof id, 0);
  cudaSetDevice(device);
  ncclComm_t comm = nullptr;
  r = ncclCommInitRank(&comm, group->size(), id, group->rank());
  if (r != ncclSuccess)
    return Internal("ncclCommInitRank (rank " + std::to_string(group->rank()) + " of " +
                    std::to_string(group->size()) + ", GPU " + std::to_string(device) +
                    "): " + ncclGetErrorString(r));
  // One all-reduce now, outside any graph: what NCCL sets up at a communicator's first
  // collective is then set up.
  void* one = nullptr;
  if (cudaMalloc(&one, sizeof(float)) != cudaSuccess)
    return Internal("cudaMalloc of the NCCL communicator's first all-reduce failed");
  cudaMemsetAsync(one, 0, sizeof(float), stream);
  r = ncclAllReduce(one, one, 1, ncclFloat, ncclSum, comm, stream);
  const cudaError_t e = cudaStreamSynchronize(stream);
  cudaFree(one);
  if (r != ncclSuccess || e != cudaSuccess)
    return Internal(std::string("the NCCL communicator's first all-reduce: ") +
                    (r != ncclSuccess ? ncclGetErrorString(r) : cudaGetErrorString(e)));
  return std::unique_ptr<Communicator>(new NcclCommunicator(group, comm, stream));
}

}  // namespace peng::backend::cuda
