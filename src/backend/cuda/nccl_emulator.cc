// NCCL over MPI for the CUDA emulator (nccl_emulator.h).
#include "backend/cuda/nccl_emulator.h"

#include <mpi.h>

#include <cstdint>
#include <cstring>
#include <functional>
#include <vector>

namespace peng::backend::cuda {

struct EmuNcclComm {
  MPI_Comm comm = MPI_COMM_NULL;
  int rank = 0, size = 0;
};

namespace {

struct Id {  // what an ncclUniqueId holds here
  uint64_t magic;
  int world_rank;  // of the rank that made it: the communicator's rank 0
  int serial;      // its count of ids made, the tag of the ranks' messages
};
constexpr uint64_t kMagic = 0x6e63636c656d75ull;  // "ncclemu"
constexpr int kTagBase = 0x4e00;

// Sends and receives between ncclGroupStart and ncclGroupEnd, posted at the end.
struct Pending {
  bool send;
  void* buf;
  int bytes, peer;
  MPI_Comm comm;
};
int group_depth = 0;
std::vector<Pending> pending;

size_t Bytes(ncclDataType_t t) { return t == ncclFloat ? 4 : 1; }
MPI_Datatype MpiType(ncclDataType_t t) { return t == ncclFloat ? MPI_FLOAT : MPI_BYTE; }
bool Valid(ncclDataType_t t) { return t == ncclFloat || t == ncclChar; }

// A call's checks: a communicator, a known type and sum, a count MPI takes.
ncclResult_t Check(ncclComm_t comm, ncclDataType_t t, size_t count) {
  if (!comm || comm->comm == MPI_COMM_NULL || !Valid(t) || count > INT32_MAX)
    return ncclInvalidArgument;
  return ncclSuccess;
}
ncclResult_t FromMpi(int rc) { return rc == MPI_SUCCESS ? ncclSuccess : ncclSystemError; }
// A collective (`mpi`: its MPI calls) run now -- or, while the stream is being captured,
// recorded into the graph and run each time it replays, as CUDA graphs capture NCCL's
// collectives (a replay's failure: the stream's error).
ncclResult_t Collective(cudaStream_t stream, std::function<int()> mpi) {
  if (!emu::IsCapturing(stream)) return FromMpi(mpi());
  emu::Submit(stream, [mpi = std::move(mpi)] {
    if (mpi() != MPI_SUCCESS) emu::ReportFailure("an NCCL collective of a graph: MPI failed");
  });
  return ncclSuccess;
}

}  // namespace

const char* ncclGetErrorString(ncclResult_t r) {
  switch (r) {
    case ncclSuccess: return "no error";
    case ncclSystemError: return "unhandled system error (emulated NCCL: an MPI call failed)";
    case ncclInvalidArgument: return "invalid argument";
    case ncclInvalidUsage: return "invalid usage";
  }
  return "unknown result";
}

ncclResult_t ncclGetVersion(int* version) {
  *version = 0;  // (the emulator's)
  return ncclSuccess;
}

ncclResult_t ncclGetUniqueId(ncclUniqueId* id) {
  static int serial = 0;
  Id v{kMagic, 0, serial++};
  MPI_Comm_rank(MPI_COMM_WORLD, &v.world_rank);
  std::memset(id, 0, sizeof *id);
  std::memcpy(id->internal, &v, sizeof v);
  return ncclSuccess;
}

ncclResult_t ncclCommInitRank(ncclComm_t* comm, int nranks, ncclUniqueId id, int rank) {
  Id v;
  std::memcpy(&v, id.internal, sizeof v);
  if (v.magic != kMagic || nranks < 1 || rank < 0 || rank >= nranks) return ncclInvalidArgument;
  int me = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &me);
  const int tag = kTagBase + v.serial % 256;
  // members[r]: the world rank of rank r, gathered by rank 0 and sent back to every rank.
  std::vector<int> members(nranks, -1);
  if (rank == 0) {
    if (me != v.world_rank) return ncclInvalidUsage;  // (rank 0 made the id)
    members[0] = me;
    for (int i = 1; i < nranks; ++i) {
      int msg[2];
      MPI_Status st;
      if (MPI_Recv(msg, 2, MPI_INT, MPI_ANY_SOURCE, tag, MPI_COMM_WORLD, &st) != MPI_SUCCESS)
        return ncclSystemError;
      if (msg[0] < 1 || msg[0] >= nranks || members[msg[0]] >= 0) return ncclInvalidUsage;
      members[msg[0]] = msg[1];
    }
    for (int i = 1; i < nranks; ++i)
      if (MPI_Send(members.data(), nranks, MPI_INT, members[i], tag, MPI_COMM_WORLD) !=
          MPI_SUCCESS)
        return ncclSystemError;
  } else {
    const int msg[2] = {rank, me};
    if (MPI_Send(msg, 2, MPI_INT, v.world_rank, tag, MPI_COMM_WORLD) != MPI_SUCCESS ||
        MPI_Recv(members.data(), nranks, MPI_INT, v.world_rank, tag, MPI_COMM_WORLD,
                 MPI_STATUS_IGNORE) != MPI_SUCCESS)
      return ncclSystemError;
  }
  MPI_Group world, group;
  MPI_Comm_group(MPI_COMM_WORLD, &world);
  MPI_Group_incl(world, nranks, members.data(), &group);
  auto* c = new EmuNcclComm;
  const int rc = MPI_Comm_create_group(MPI_COMM_WORLD, group, tag, &c->comm);
  MPI_Group_free(&group);
  MPI_Group_free(&world);
  if (rc != MPI_SUCCESS) {
    delete c;
    return ncclSystemError;
  }
  c->rank = rank;
  c->size = nranks;
  *comm = c;
  return ncclSuccess;
}

ncclResult_t ncclCommDestroy(ncclComm_t comm) {
  if (!comm) return ncclInvalidArgument;
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (!finalized && comm->comm != MPI_COMM_NULL) MPI_Comm_free(&comm->comm);
  delete comm;
  return ncclSuccess;
}

ncclResult_t ncclAllReduce(const void* send, void* recv, size_t count, ncclDataType_t type,
                           ncclRedOp_t op, ncclComm_t comm, cudaStream_t stream) {
  if (const ncclResult_t r = Check(comm, type, count); r != ncclSuccess) return r;
  if (op != ncclSum || type != ncclFloat) return ncclInvalidArgument;  // (what peng sums)
  return Collective(stream, [=] {
    return MPI_Allreduce(send == recv ? MPI_IN_PLACE : send, recv, static_cast<int>(count),
                         MPI_FLOAT, MPI_SUM, comm->comm);
  });
}

ncclResult_t ncclReduceScatter(const void* send, void* recv, size_t recv_count,
                               ncclDataType_t type, ncclRedOp_t op, ncclComm_t comm,
                               cudaStream_t stream) {
  if (const ncclResult_t r = Check(comm, type, recv_count * comm->size); r != ncclSuccess)
    return r;
  if (op != ncclSum || type != ncclFloat) return ncclInvalidArgument;
  return Collective(stream, [=] {
    return MPI_Reduce_scatter_block(send, recv, static_cast<int>(recv_count), MPI_FLOAT, MPI_SUM,
                                    comm->comm);
  });
}

ncclResult_t ncclAllGather(const void* send, void* recv, size_t send_count, ncclDataType_t type,
                           ncclComm_t comm, cudaStream_t stream) {
  if (const ncclResult_t r = Check(comm, type, send_count * comm->size); r != ncclSuccess)
    return r;
  const size_t bytes = send_count * Bytes(type);
  const bool in_place = send == static_cast<const char*>(recv) + comm->rank * bytes;
  return Collective(stream, [=] {
    return MPI_Allgather(in_place ? MPI_IN_PLACE : send, static_cast<int>(send_count),
                         MpiType(type), recv, static_cast<int>(send_count), MpiType(type),
                         comm->comm);
  });
}

ncclResult_t ncclBroadcast(const void* send, void* recv, size_t count, ncclDataType_t type,
                           int root, ncclComm_t comm, cudaStream_t stream) {
  if (const ncclResult_t r = Check(comm, type, count); r != ncclSuccess) return r;
  if (root < 0 || root >= comm->size) return ncclInvalidArgument;
  return Collective(stream, [=] {
    if (comm->rank == root && send != recv) std::memmove(recv, send, count * Bytes(type));
    return MPI_Bcast(recv, static_cast<int>(count), MpiType(type), root, comm->comm);
  });
}

namespace {
ncclResult_t PointToPoint(bool send, void* buf, size_t count, ncclDataType_t type, int peer,
                          ncclComm_t comm, cudaStream_t stream) {
  if (const ncclResult_t r = Check(comm, type, count); r != ncclSuccess) return r;
  if (emu::IsCapturing(stream)) return ncclInvalidUsage;  // (the graphs record none)
  if (peer < 0 || peer >= comm->size || count * Bytes(type) > INT32_MAX)
    return ncclInvalidArgument;
  Pending p{send, buf, static_cast<int>(count * Bytes(type)), peer, comm->comm};
  if (group_depth > 0) {
    pending.push_back(p);
    return ncclSuccess;
  }
  return FromMpi(send ? MPI_Send(buf, p.bytes, MPI_BYTE, peer, 0, p.comm)
                  : MPI_Recv(buf, p.bytes, MPI_BYTE, peer, 0, p.comm, MPI_STATUS_IGNORE));
}
}  // namespace

ncclResult_t ncclSend(const void* send, size_t count, ncclDataType_t type, int peer,
                      ncclComm_t comm, cudaStream_t stream) {
  return PointToPoint(true, const_cast<void*>(send), count, type, peer, comm, stream);
}

ncclResult_t ncclRecv(void* recv, size_t count, ncclDataType_t type, int peer, ncclComm_t comm,
                      cudaStream_t stream) {
  return PointToPoint(false, recv, count, type, peer, comm, stream);
}

ncclResult_t ncclGroupStart() {
  ++group_depth;
  return ncclSuccess;
}

ncclResult_t ncclGroupEnd() {
  if (group_depth == 0) return ncclInvalidUsage;
  if (--group_depth > 0) return ncclSuccess;
  std::vector<MPI_Request> reqs(pending.size(), MPI_REQUEST_NULL);
  int rc = MPI_SUCCESS;
  for (size_t i = 0; i < pending.size() && rc == MPI_SUCCESS; ++i) {
    const Pending& p = pending[i];
    rc = p.send ? MPI_Isend(p.buf, p.bytes, MPI_BYTE, p.peer, 0, p.comm, &reqs[i])
                : MPI_Irecv(p.buf, p.bytes, MPI_BYTE, p.peer, 0, p.comm, &reqs[i]);
  }
  if (rc == MPI_SUCCESS)
    rc = MPI_Waitall(static_cast<int>(reqs.size()), reqs.data(), MPI_STATUSES_IGNORE);
  pending.clear();
  return FromMpi(rc);
}

}  // namespace peng::backend::cuda
