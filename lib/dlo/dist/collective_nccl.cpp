// NCCL weight gathers. Compiled when libtorch has CUDA; exercised only where a GPU exists.
#include "dlo/common/error.h"
#include "dlo/dist/collective.h"
#include "dlo/dist/mpi_world.h"

#ifdef DLO_HAVE_CUDA
#include <cuda_runtime_api.h>
#include <mpi.h>
#include <nccl.h>

#include <chrono>
#include <cstring>
#include <string>
#include <thread>

namespace dlo {
namespace {

void nccl_check(ncclResult_t r, const char* what) {
  DLO_CHECK(r == ncclSuccess || r == ncclInProgress, "NCCL ", what, " failed: ", ncclGetErrorString(r));
}

class NcclCollective final : public Collective {
 public:
  NcclCollective(const MpiWorld& world, int device) : rank_(world.rank()), size_(world.size()), device_(device) {
    int version = 0;
    nccl_check(ncclGetVersion(&version), "ncclGetVersion");
    DLO_CHECK(version == NCCL_VERSION_CODE, "the NCCL library loaded is version ", version,
              " but dlo was compiled against ", NCCL_VERSION_CODE,
              "; a second NCCL is on the library path (dlo must use the torch wheel's)");
    DLO_CHECK(cudaSetDevice(device) == cudaSuccess, "cudaSetDevice(", device, ") failed");
    ncclUniqueId id;
    std::string bytes;
    if (rank_ == 0) {
      nccl_check(ncclGetUniqueId(&id), "ncclGetUniqueId");
      bytes.assign(reinterpret_cast<const char*>(&id), sizeof id);
    }
    // A bounded wait, as every collective outside the wave (MpiWorld).
    bytes = world.broadcast_string(bytes, 0, "NCCL set-up (unique id)");
    DLO_CHECK(bytes.size() == sizeof id, "NCCL set-up: rank 0 sent a ", bytes.size(), "-byte unique id");
    std::memcpy(&id, bytes.data(), sizeof id);
    timeout_s_ = world.timeout_s();
    // Non-blocking init, polled, so a rank that never arrives cannot hang the others forever.
    ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
    config.blocking = 0;
    nccl_check(ncclCommInitRankConfig(&comm_, size_, id, rank_, &config), "ncclCommInitRankConfig");
    wait_ready("communicator set-up");
  }
  ~NcclCollective() override {
    if (comm_ != nullptr) {
      ncclCommFinalize(comm_);
      ncclCommDestroy(comm_);
    }
  }
  int rank() const override { return rank_; }
  int size() const override { return size_; }
  std::string name() const override { return "nccl"; }

  void allgather_inplace(void* buffer, std::size_t shard_bytes, void* stream) override {
    if (shard_bytes == 0) return;
    auto* recv = static_cast<char*>(buffer);
    const void* send = recv + static_cast<std::size_t>(rank_) * shard_bytes;  // in place
    nccl_check(ncclAllGather(send, recv, shard_bytes, ncclUint8, comm_, static_cast<cudaStream_t>(stream)),
               "ncclAllGather");
  }

  void check_async_error() override {
    ncclResult_t async = ncclSuccess;
    nccl_check(ncclCommGetAsyncError(comm_, &async), "ncclCommGetAsyncError");
    DLO_CHECK(async == ncclSuccess || async == ncclInProgress, "NCCL communicator error: ", ncclGetErrorString(async));
  }

  void abort() override {
    if (comm_ != nullptr) {
      ncclCommAbort(comm_);
      comm_ = nullptr;
    }
  }

 private:
  void wait_ready(const char* what) {
    const auto deadline = std::chrono::steady_clock::now() +
                          std::chrono::duration_cast<std::chrono::steady_clock::duration>(
                              std::chrono::duration<double>(timeout_s_));
    for (;;) {
      ncclResult_t state = ncclInProgress;
      nccl_check(ncclCommGetAsyncError(comm_, &state), "ncclCommGetAsyncError");
      if (state == ncclSuccess) return;
      DLO_CHECK(state == ncclInProgress, "NCCL ", what, " failed: ", ncclGetErrorString(state));
      DLO_CHECK(std::chrono::steady_clock::now() < deadline, "NCCL ", what, " did not finish in ", timeout_s_,
                " s (DLO_GATHER_TIMEOUT_S): a rank is gone or stuck");
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
  }

  int rank_, size_, device_;
  double timeout_s_ = 600;
  ncclComm_t comm_ = nullptr;
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
