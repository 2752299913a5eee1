// NCCL weight gathers. Compiled when libtorch has CUDA; exercised only where a GPU exists.
//
// The communicator is non-blocking (config.blocking = 0), so that set-up is bounded and a rank
// that never arrives cannot hang the others. Every call on it is made complete before it returns,
// failures abort it, and it is finalized before it is destroyed: NcclComm (nccl_comm.h) holds
// those rules; this file only plugs the NCCL calls in. Checked against NCCL 2.28.9 (the torch
// 2.11 wheel's nvidia-nccl-cu13), whose nccl.h dlo compiles with.
#include "dlo/common/error.h"
#include "dlo/dist/collective.h"
#include "dlo/mpi/mpi_world.h"

#ifdef DLO_HAVE_CUDA
#include <cuda_runtime_api.h>
#include <nccl.h>

#include <cstdio>
#include <cstring>
#include <memory>
#include <string>

#include "dlo/dist/nccl_comm.h"

namespace dlo {
namespace {

// NcclResult mirrors ncclResult_t (nccl.h:42-50).
static_assert(static_cast<int>(NcclResult::kSuccess) == ncclSuccess);
static_assert(static_cast<int>(NcclResult::kUnhandledCudaError) == ncclUnhandledCudaError);
static_assert(static_cast<int>(NcclResult::kSystemError) == ncclSystemError);
static_assert(static_cast<int>(NcclResult::kInternalError) == ncclInternalError);
static_assert(static_cast<int>(NcclResult::kInvalidArgument) == ncclInvalidArgument);
static_assert(static_cast<int>(NcclResult::kInvalidUsage) == ncclInvalidUsage);
static_assert(static_cast<int>(NcclResult::kRemoteError) == ncclRemoteError);
static_assert(static_cast<int>(NcclResult::kInProgress) == ncclInProgress);

NcclResult to_result(ncclResult_t r) { return static_cast<NcclResult>(static_cast<int>(r)); }

std::string last_warning(ncclComm_t comm) {
  const char* s = ncclGetLastError(comm);  // process-wide in 2.28.9 (src/init.cc:2700-2703)
  return s != nullptr ? std::string(s) : std::string();
}

std::string with_last_warning(ncclResult_t r, ncclComm_t comm) {
  const std::string last = last_warning(comm);
  return str(ncclGetErrorString(r), last.empty() ? "" : " (NCCL's last warning: " + last + ")");
}

// NCCL's version code: MAJOR*10000 + MINOR*100 + PATCH since 2.9, MAJOR*1000 + MINOR*100 +
// PATCH before (the NCCL_VERSION macro, nccl.h:25).
struct NcclVersion {
  int major, minor, patch;
  explicit NcclVersion(int code) {
    if (code >= 10000) {
      major = code / 10000, minor = code / 100 % 100, patch = code % 100;
    } else {
      major = code / 1000, minor = code / 100 % 10, patch = code % 100;
    }
  }
  std::string str() const { return dlo::str(major, ".", minor, ".", patch); }
};

// The real calls behind NcclComm. `comm` is only touched under NcclComm's lock.
class RealOps final : public NcclCommOps {
 public:
  explicit RealOps(ncclComm_t comm) : comm_(comm) {}
  NcclResult get_async_error(NcclResult* state) override {
    ncclResult_t s = ncclInProgress;
    const ncclResult_t r = ncclCommGetAsyncError(comm_, &s);
    *state = to_result(s);
    return to_result(r);
  }
  NcclResult finalize() override { return to_result(ncclCommFinalize(comm_)); }
  NcclResult destroy() override { return to_result(ncclCommDestroy(comm_)); }
  NcclResult abort() override { return to_result(ncclCommAbort(comm_)); }
  std::string error_string(NcclResult r) override {
    return ncclGetErrorString(static_cast<ncclResult_t>(static_cast<int>(r)));
  }
  std::string last_error() override { return last_warning(comm_); }

 private:
  ncclComm_t comm_;
};

// Checks made before the communicator exists; "" when all is well.
std::string local_setup_error(int device, int rank, ncclUniqueId* id, int* version) {
  try {
    const ncclResult_t v = ncclGetVersion(version);
    DLO_CHECK(v == ncclSuccess, "ncclGetVersion failed: ", ncclGetErrorString(v));
    // Same major.minor, any patch. The communicator's configuration struct is versioned per
    // minor (ncclConfig_v22800, nccl.h:77; the library reads it by its size and version field,
    // src/init.cc:1814-1844), patch releases keep the ABI, and the non-blocking semantics that
    // NcclComm relies on were read in 2.28's sources. A different minor is a second NCCL on the
    // library path, not the torch wheel's.
    const NcclVersion lib(*version), hdr(NCCL_VERSION_CODE);
    DLO_CHECK(lib.major == hdr.major && lib.minor == hdr.minor, "the NCCL library loaded is version ", lib.str(),
              " but dlo was compiled against ", hdr.str(),
              " (major.minor must match); a second NCCL is on the library path (dlo must use the torch wheel's)");
    const cudaError_t e = cudaSetDevice(device);
    DLO_CHECK(e == cudaSuccess, "cudaSetDevice(", device, ") failed: ", cudaGetErrorString(e));
    if (rank == 0) {
      const ncclResult_t r = ncclGetUniqueId(id);
      DLO_CHECK(r == ncclSuccess, "ncclGetUniqueId failed: ", with_last_warning(r, nullptr));
    }
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

class NcclCollective final : public Collective {
 public:
  NcclCollective(const MpiWorld& world, int device)
      : rank_(world.rank()), size_(world.size()), device_(device), timeout_s_(world.timeout_s()) {
    const std::string context = str("rank ", rank_, " of ", size_, ", cuda:", device_);
    ncclUniqueId id;
    std::memset(&id, 0, sizeof id);
    // Every rank learns of a rank that cannot start (wrong NCCL, bad device), not only that one.
    world.check_all(local_setup_error(device_, rank_, &id, &version_), "NCCL set-up");
    std::string bytes;
    if (rank_ == 0) bytes.assign(reinterpret_cast<const char*>(&id), sizeof id);
    // A bounded wait, as every collective outside the wave (MpiWorld).
    bytes = world.broadcast_string(bytes, 0, "NCCL set-up (unique id)");
    DLO_CHECK(bytes.size() == sizeof id, "NCCL set-up: rank 0 sent a ", bytes.size(), "-byte unique id");
    std::memcpy(&id, bytes.data(), sizeof id);

    // Non-blocking init, completed (or aborted) by NcclComm within timeout_s_.
    std::string error;
    try {
      ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
      config.blocking = 0;
      ncclComm_t comm = nullptr;
      const ncclResult_t r = ncclCommInitRankConfig(&comm, size_, id, rank_, &config);
      // On a synchronous failure NCCL frees the communicator and sets it to NULL (src/init.cc,
      // ncclCommInitRankDev's fail path): nothing to abort.
      DLO_CHECK(comm != nullptr, "NCCL communicator set-up (ncclCommInitRankConfig, ", context,
                ") failed: ", with_last_warning(r, nullptr));
      handle_ = comm;
      const std::string tag = world.tag();
      comm_ = std::make_unique<NcclComm>(std::make_unique<RealOps>(comm), timeout_s_, context,
                                         [tag](const std::string& line) {
                                           std::fprintf(stderr, "%s %s\n", tag.c_str(), line.c_str());
                                         });
      comm_->complete_init(to_result(r));
    } catch (const Error& e) {
      error = e.what();
    }
    // All ranks agree: a rank whose set-up failed (aborted already) ends the others, whose own
    // communicators are aborted, as their peers are gone.
    try {
      world.check_all(error, "NCCL communicator set-up");
    } catch (...) {
      if (comm_ != nullptr) comm_->abort("another rank's NCCL set-up failed");
      throw;
    }
  }
  // ~NcclComm closes: finalize, wait, destroy (or abort); never throws.
  ~NcclCollective() override = default;

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  std::string name() const override { return "nccl"; }
  std::string describe() const override {
    return str("nccl ", NcclVersion(version_).str(), " (non-blocking communicator, ", size_, " ranks, cuda:", device_,
               ")");
  }
  double timeout_s() const override { return timeout_s_; }

  void allgather_inplace(void* buffer, std::size_t shard_bytes, void* stream) override {
    const std::string what = str("AllGather of ", shard_bytes, "-byte shards");
    if (shard_bytes == 0) {  // nothing to move, but a dead communicator still says so
      comm_->call(what, [] { return NcclResult::kSuccess; });
      return;
    }
    auto* recv = static_cast<char*>(buffer);
    const void* send = recv + static_cast<std::size_t>(rank_) * shard_bytes;  // in place (nccl.h:438-445)
    comm_->call(what, [&] {
      return to_result(
          ncclAllGather(send, recv, shard_bytes, ncclUint8, handle_, static_cast<cudaStream_t>(stream)));
    });
  }

  void check_async_error() override { comm_->check_async_error(); }
  void abort() override { comm_->abort("Collective::abort() was called"); }

 private:
  int rank_, size_, device_;
  double timeout_s_;
  int version_ = 0;
  ncclComm_t handle_ = nullptr;     // set once in the constructor; used only inside comm_->call()
  std::unique_ptr<NcclComm> comm_;  // owns the communicator
};

}  // namespace

std::unique_ptr<Collective> make_nccl_collective(const MpiWorld& world, int device) {
  return std::make_unique<NcclCollective>(world, device);
}

}  // namespace dlo

#else

namespace dlo {
std::unique_ptr<Collective> make_nccl_collective(const MpiWorld&, int) {
  DLO_CHECK(false, "this dlo was built without CUDA/NCCL");
}
}  // namespace dlo

#endif
