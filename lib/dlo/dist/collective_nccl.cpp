// NCCL weight gathers (collective.h) and activation exchanges (exchange_group.h), each on a
// communicator of its own over every rank. Compiled when libtorch has CUDA; exercised only where
// a GPU exists.
//
// A communicator is non-blocking (config.blocking = 0), so that set-up is bounded and a rank
// that never arrives cannot hang the others. Every call on it is made complete before it returns,
// failures abort it, and it is finalized before it is destroyed: NcclComm (nccl_comm.h) holds
// those rules; this file only plugs the NCCL calls in. Checked against NCCL 2.28.9 (the torch
// 2.11 wheel's nvidia-nccl-cu13), whose nccl.h dlo compiles with.
#include "dlo/common/error.h"
#include "dlo/dist/collective.h"
#include "dlo/dist/exchange_group.h"
#include "dlo/mpi/mpi_world.h"

#ifdef DLO_HAVE_CUDA
#include <cuda_runtime_api.h>
#include <nccl.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <limits>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include <ATen/ATen.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>

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

// An NCCL communicator over every rank (rank = world rank) on one CUDA device, owned by NcclComm.
struct NcclWorldComm {
  ncclComm_t handle = nullptr;    // used only inside comm->call()
  std::unique_ptr<NcclComm> comm;  // owns the communicator: finalize + destroy (or abort) at the end
  int version = 0;
};

// Collective: rank 0 makes the unique id and broadcasts it over MPI (bounded); the non-blocking
// init is completed (or aborted) by NcclComm within the world's timeout; every rank learns of a
// rank whose set-up failed. `purpose` names the communicator in messages ("weight gathers").
NcclWorldComm open_world_comm(const MpiWorld& world, int device, const std::string& purpose) {
  const int rank = world.rank(), size = world.size();
  const std::string context = str(purpose, ", rank ", rank, " of ", size, ", cuda:", device);
  NcclWorldComm c;
  ncclUniqueId id;
  std::memset(&id, 0, sizeof id);
  // Every rank learns of a rank that cannot start (wrong NCCL, bad device), not only that one.
  world.check_all(local_setup_error(device, rank, &id, &c.version), "NCCL set-up");
  std::string bytes;
  if (rank == 0) bytes.assign(reinterpret_cast<const char*>(&id), sizeof id);
  // A bounded wait, as every collective outside the wave (MpiWorld).
  bytes = world.broadcast_string(bytes, 0, "NCCL set-up (unique id)");
  DLO_CHECK(bytes.size() == sizeof id, "NCCL set-up: rank 0 sent a ", bytes.size(), "-byte unique id");
  std::memcpy(&id, bytes.data(), sizeof id);

  // Non-blocking init, completed (or aborted) by NcclComm within the timeout.
  std::string error;
  try {
    ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
    config.blocking = 0;
    ncclComm_t comm = nullptr;
    const ncclResult_t r = ncclCommInitRankConfig(&comm, size, id, rank, &config);
    // On a synchronous failure NCCL frees the communicator and sets it to NULL (src/init.cc,
    // ncclCommInitRankDev's fail path): nothing to abort.
    DLO_CHECK(comm != nullptr, "NCCL communicator set-up (ncclCommInitRankConfig, ", context,
              ") failed: ", with_last_warning(r, nullptr));
    c.handle = comm;
    const std::string tag = world.tag();
    c.comm = std::make_unique<NcclComm>(std::make_unique<RealOps>(comm), world.timeout_s(), context,
                                        [tag](const std::string& line) {
                                          std::fprintf(stderr, "%s %s\n", tag.c_str(), line.c_str());
                                        });
    c.comm->complete_init(to_result(r));
  } catch (const Error& e) {
    error = e.what();
  }
  // All ranks agree: a rank whose set-up failed (aborted already) ends the others, whose own
  // communicators are aborted, as their peers are gone.
  try {
    world.check_all(error, "NCCL communicator set-up");
  } catch (...) {
    if (c.comm != nullptr) c.comm->abort("another rank's NCCL set-up failed");
    throw;
  }
  return c;
}

class NcclCollective final : public Collective {
 public:
  NcclCollective(const MpiWorld& world, int device)
      : rank_(world.rank()), size_(world.size()), device_(device), timeout_s_(world.timeout_s()),
        c_(open_world_comm(world, device, "weight gathers")) {}
  // ~NcclComm closes: finalize, wait, destroy (or abort); never throws.
  ~NcclCollective() override = default;

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  std::string name() const override { return "nccl"; }
  std::string describe() const override {
    return str("nccl ", NcclVersion(c_.version).str(), " (non-blocking communicator, ", size_, " ranks, cuda:", device_,
               ")");
  }
  double timeout_s() const override { return timeout_s_; }

  void allgather_inplace(void* buffer, std::size_t shard_bytes, void* stream) override {
    const std::string what = str("AllGather of ", shard_bytes, "-byte shards");
    if (shard_bytes == 0) {  // nothing to move, but a dead communicator still says so
      c_.comm->call(what, [] { return NcclResult::kSuccess; });
      return;
    }
    auto* recv = static_cast<char*>(buffer);
    const void* send = recv + static_cast<std::size_t>(rank_) * shard_bytes;  // in place (nccl.h:438-445)
    c_.comm->call(what, [&] {
      return to_result(
          ncclAllGather(send, recv, shard_bytes, ncclUint8, c_.handle, static_cast<cudaStream_t>(stream)));
    });
  }

  void check_async_error() override { c_.comm->check_async_error(); }
  void abort() override { c_.comm->abort("Collective::abort() was called"); }

 private:
  int rank_, size_, device_;
  double timeout_s_;
  NcclWorldComm c_;
};

class NcclExchangeNetwork;

// A group's members on the activation communicator (group-free: no communicator of its own).
class NcclExchangeGroup final : public ExchangeGroup {
 public:
  NcclExchangeGroup(NcclExchangeNetwork& net, int rank, std::vector<int> world_ranks)
      : ExchangeGroup(rank, std::move(world_ranks)), net_(net) {}
  c10::Device device() const override;
  std::uint64_t max_exchange_bytes() const override { return std::numeric_limits<std::uint64_t>::max(); }
  void alltoallv(const at::Tensor& send, const std::vector<std::size_t>& send_bytes,
                 const std::vector<std::size_t>& send_offset, const at::Tensor& recv,
                 const std::vector<std::size_t>& recv_bytes, const std::vector<std::size_t>& recv_offset,
                 const char* phase) const override;

 private:
  NcclExchangeNetwork& net_;
};

// One NCCL communicator over the world for activations. A group's all-to-all-v is one NCCL group
// of ncclSend/ncclRecv to its peers only, on the compute stream; the piece a rank keeps is a
// device-to-device copy on that stream. A watchdog thread polls the communicator's asynchronous
// errors and times the newest exchange on the device (an event recorded after it): an error, or
// an exchange not finished within the timeout, aborts the communicator and ends every rank.
class NcclExchangeNetwork final : public ExchangeNetwork {
 public:
  NcclExchangeNetwork(const MpiWorld& world, int device)
      : world_(world), device_(device), c_(open_world_comm(world, device, "activation exchanges")) {
    c10::cuda::CUDAGuard guard(static_cast<c10::DeviceIndex>(device_));
    const cudaError_t e = cudaEventCreateWithFlags(&done_, cudaEventDisableTiming);
    DLO_CHECK_KIND(ErrorKind::kTransfer, e == cudaSuccess, "CUDA cudaEventCreateWithFlags failed: ", cudaGetErrorString(e));
  }
  ~NcclExchangeNetwork() override {
    stop_ = true;
    if (watchdog_.joinable()) watchdog_.join();
    c10::cuda::CUDAGuard guard(static_cast<c10::DeviceIndex>(device_));
    cudaEventSynchronize(done_);  // the last exchange finished before the communicator is finalized
    cudaEventDestroy(done_);
    // c_.comm closes: finalize, wait, destroy (or abort); never throws.
  }

  std::string describe() const override {
    return str("nccl ", NcclVersion(c_.version).str(), " (activations, ", world_.size(), " ranks, cuda:", device_, ")");
  }

  std::unique_ptr<ExchangeGroup> split(int color, const char* phase) override {
    DLO_ASSERT(color >= 0, "group color ", color);
    const std::vector<std::int64_t> colors = world_.allgather(color, phase);  // bounded: every rank is here
    std::vector<int> members;
    int me = -1;
    for (int r = 0; r < world_.size(); ++r) {
      if (colors[static_cast<std::size_t>(r)] != color) continue;
      if (r == world_.rank()) me = static_cast<int>(members.size());
      members.push_back(r);
    }
    return std::make_unique<NcclExchangeGroup>(*this, me, std::move(members));
  }

  int device() const { return device_; }

  void alltoallv(const NcclExchangeGroup& g, const at::Tensor& send, const std::vector<std::size_t>& send_bytes,
                 const std::vector<std::size_t>& send_offset, const at::Tensor& recv,
                 const std::vector<std::size_t>& recv_bytes, const std::vector<std::size_t>& recv_offset,
                 const char* phase) {
    const auto n = static_cast<std::size_t>(g.size());
    const auto me = static_cast<std::size_t>(g.rank());
    const at::Device dev(at::kCUDA, static_cast<c10::DeviceIndex>(device_));
    DLO_ASSERT(send_bytes.size() == n && send_offset.size() == n && recv_bytes.size() == n && recv_offset.size() == n,
               phase, ": counts for ", n, " ranks");
    DLO_ASSERT(send.device() == dev && recv.device() == dev, phase, ": the NCCL exchange on ", dev.str(), " got ",
               send.device().str(), " and ", recv.device().str());
    DLO_ASSERT(send.is_contiguous() && recv.is_contiguous() && send.scalar_type() == at::kByte &&
                   recv.scalar_type() == at::kByte,
               phase, ": exchange buffers must be contiguous bytes");
    for (std::size_t j = 0; j < n; ++j)
      DLO_ASSERT(send_offset[j] + send_bytes[j] <= static_cast<std::size_t>(send.numel()) &&
                     recv_offset[j] + recv_bytes[j] <= static_cast<std::size_t>(recv.numel()),
                 phase, ": piece ", j, " outside its buffer");
    DLO_ASSERT(send_bytes[me] == recv_bytes[me], phase, ": this rank's own piece is ", send_bytes[me], " bytes out and ",
               recv_bytes[me], " in");
    c10::cuda::CUDAGuard guard(dev.index());
    const cudaStream_t stream = c10::cuda::getCurrentCUDAStream(dev.index()).stream();
    const auto* s = static_cast<const std::uint8_t*>(send.data_ptr());
    auto* r = static_cast<std::uint8_t*>(recv.data_ptr());
    if (send_bytes[me] > 0) {
      const cudaError_t e = cudaMemcpyAsync(r + recv_offset[me], s + send_offset[me], send_bytes[me],
                                            cudaMemcpyDeviceToDevice, stream);
      DLO_CHECK_KIND(ErrorKind::kTransfer, e == cudaSuccess, phase, ": CUDA cudaMemcpyAsync failed: ", cudaGetErrorString(e));
    }
    const std::vector<int>& peers = g.world_ranks();
    c_.comm->call(str(phase, " (send/recv among ranks ", join_ranks(peers), ")"), [&] {
      ncclResult_t first = ncclGroupStart();
      if (first != ncclSuccess) return to_result(first);
      const auto keep = [&first](ncclResult_t x) {
        if (first == ncclSuccess && x != ncclSuccess && x != ncclInProgress) first = x;
      };
      for (std::size_t j = 0; j < n; ++j) {
        if (j == me) continue;
        if (send_bytes[j] > 0)
          keep(ncclSend(s + send_offset[j], send_bytes[j], ncclUint8, peers[j], c_.handle, stream));
        if (recv_bytes[j] > 0)
          keep(ncclRecv(r + recv_offset[j], recv_bytes[j], ncclUint8, peers[j], c_.handle, stream));
      }
      const ncclResult_t end = ncclGroupEnd();  // always: the group must be closed
      return to_result(first != ncclSuccess ? first : end);
    });
    {
      std::lock_guard<std::mutex> lock(watch_mu_);
      const cudaError_t e = cudaEventRecord(done_, stream);
      DLO_CHECK_KIND(ErrorKind::kTransfer, e == cudaSuccess, phase, ": CUDA cudaEventRecord failed: ", cudaGetErrorString(e));
      watch_since_ = std::chrono::steady_clock::now();
      watch_phase_ = phase;
      watching_ = true;
    }
    start_watchdog();
  }

 private:
  static std::string join_ranks(const std::vector<int>& ranks) {
    std::string out;
    for (std::size_t i = 0; i < ranks.size(); ++i) out += str(i ? "," : "", ranks[i]);
    return out;
  }

  void start_watchdog() {
    if (watchdog_.joinable()) return;
    watchdog_ = std::thread([this] {
      cudaSetDevice(device_);
      const double timeout_s = c_.comm->timeout_s();
      while (!stop_.load()) {
        try {
          c_.comm->check_async_error();
          std::lock_guard<std::mutex> lock(watch_mu_);
          if (watching_) {
            const cudaError_t e = cudaEventQuery(done_);
            if (e == cudaSuccess) {
              watching_ = false;
            } else if (e == cudaErrorNotReady) {
              const double waited = std::chrono::duration<double>(std::chrono::steady_clock::now() - watch_since_).count();
              if (waited > timeout_s)
                throw Error(str(watch_phase_, " has not finished on the device in ", timeout_s,
                                " s (DLO_GATHER_TIMEOUT_S): a rank of the group is gone or stuck"),
                            ErrorKind::kTransfer);
            } else {
              throw Error(str(watch_phase_, " failed on the device: ", cudaGetErrorString(e)), ErrorKind::kTransfer);
            }
          }
        } catch (const std::exception& e) {
          c_.comm->abort(e.what());
          MpiWorld::abort(std::string("activation exchange: ") + e.what());
        }
        std::this_thread::sleep_for(std::chrono::milliseconds(100));
      }
    });
  }

  const MpiWorld& world_;
  int device_;
  NcclWorldComm c_;
  cudaEvent_t done_ = nullptr;  // recorded after the newest exchange
  std::mutex watch_mu_;         // done_'s record and query, and what the watchdog times
  bool watching_ = false;
  std::chrono::steady_clock::time_point watch_since_;
  std::string watch_phase_;
  std::atomic<bool> stop_{false};
  std::thread watchdog_;
};

c10::Device NcclExchangeGroup::device() const {
  return c10::Device(c10::kCUDA, static_cast<c10::DeviceIndex>(net_.device()));
}

void NcclExchangeGroup::alltoallv(const at::Tensor& send, const std::vector<std::size_t>& send_bytes,
                                  const std::vector<std::size_t>& send_offset, const at::Tensor& recv,
                                  const std::vector<std::size_t>& recv_bytes,
                                  const std::vector<std::size_t>& recv_offset, const char* phase) const {
  net_.alltoallv(*this, send, send_bytes, send_offset, recv, recv_bytes, recv_offset, phase);
  count_sent(send_bytes);
}

}  // namespace

std::unique_ptr<Collective> make_nccl_collective(const MpiWorld& world, int device) {
  return std::make_unique<NcclCollective>(world, device);
}

std::unique_ptr<ExchangeNetwork> make_nccl_exchange_network(const MpiWorld& world, int device) {
  return std::make_unique<NcclExchangeNetwork>(world, device);
}

}  // namespace dlo

#else

namespace dlo {
std::unique_ptr<Collective> make_nccl_collective(const MpiWorld&, int) {
  DLO_CHECK(false, "this dlo was built without CUDA/NCCL");
}
std::unique_ptr<ExchangeNetwork> make_nccl_exchange_network(const MpiWorld&, int) {
  DLO_CHECK(false, "this dlo was built without CUDA/NCCL");
}
}  // namespace dlo

#endif
