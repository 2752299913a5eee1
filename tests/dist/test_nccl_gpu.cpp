// The NCCL collective on a real GPU (label gpu), run at 2 ranks by tests/offload/nccl_one_gpu.sh,
// which can put both ranks on ONE GPU: each rank gets its own NCCL_HOSTID, so NCCL treats them as
// two hosts talking over loopback sockets (gpu-notes B4).
//
// What must hold (reference: the bytes each rank put in, computed on the host):
//   - gathers of many sizes (0, 1, odd, MB-sized), made back to back with no host sync between
//     them, each followed at once by an event the reading stream waits on, as the offload engine
//     does, deliver every byte (gpu-notes A1: a call left ncclInProgress is refused by the next
//     call, or the event lands before the kernel);
//   - the collective is destroyed without a word on stderr (finalize completed, then destroy;
//     A5), and a new one works afterwards;
//   - abort() while a gather waits on a peer that never comes stops it (the stream drains), and
//     every later call throws;
//   - sequence and CFG parallelism's exchanges over the NCCL activation network (grouped
//     send/recv on the compute stream, uneven tokens and heads) give, byte for byte, what the
//     MPI network gives on the CPU (itself checked against one rank in the CPU tests), many times
//     back to back with no host sync, and the round trip tokens -> heads -> tokens is the identity.
//
//   test_nccl_gpu --probe   exit 0 if a CUDA device is usable, 77 if the machine has no GPU (and
//                           DLO_REQUIRE_GPU is not 1), 1 otherwise; no MPI.
//   mpirun -np 2 test_nccl_gpu   the cases (exit 77 on every rank where there is no GPU).
#define DOCTEST_CONFIG_IMPLEMENT
#include "common/doctest_torch.h"  // ATen, then doctest (c10's CHECK macros removed)

#include <mpi.h>
#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "dlo/common/error.h"
#include "dlo/common/partition.h"
#include "dlo/dist/collective.h"
#include "dlo/dist/exchange_group.h"
#include "dlo/dist/sequence_exchange.h"
#include "dlo/mpi/mpi_world.h"

#include "common/gpu_probe.h"

#ifdef DLO_HAVE_CUDA
#include <cuda_runtime_api.h>
#endif

namespace {

using dlo::test::why_no_device;

// 0 usable, 77 skip, 1 fail.
int probe(const char* who) {
  bool absent = false;
  const std::string why = why_no_device(absent);
  if (why.empty()) return 0;
  const char* req = std::getenv("DLO_REQUIRE_GPU");
  const bool required = req != nullptr && std::string(req) == "1";
  if (absent && !required) {
    std::fprintf(stderr, "%s: no GPU on this machine (%s): skipped\n", who, why.c_str());
    return 77;
  }
  std::fprintf(stderr, "%s: FAILED: no usable CUDA device: %s%s\n", who, why.c_str(),
               required ? " (DLO_REQUIRE_GPU=1: a GPU is required)" : "");
  return 1;
}

dlo::MpiWorld* g_world = nullptr;
const dlo::MpiWorld& world() { return *g_world; }

bool contains(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

}  // namespace

#ifdef DLO_HAVE_CUDA
namespace {

#define CUDA_OK(call) REQUIRE_MESSAGE((call) == cudaSuccess, #call)

// The byte rank `j` puts at offset `i` of its shard in gather `k` of round `t`: differs between
// ranks, offsets, gathers and rounds, so a stale, shifted or missing shard shows.
std::uint8_t pattern(int j, std::size_t i, int t, int k) {
  return static_cast<std::uint8_t>((j * 97 + i * 13 + (i >> 8) * 5 + t * 31 + k * 7 + 1) & 0xff);
}

// Captures what this process writes to stderr (fd 2) while alive.
class StderrCapture {
 public:
  StderrCapture() {
    std::fflush(stderr);
    path_ = (std::filesystem::temp_directory_path() / ("dlo-nccl-stderr-" + std::to_string(::getpid()))).string();
    saved_ = ::dup(2);
    std::FILE* f = std::fopen(path_.c_str(), "w");
    REQUIRE(f != nullptr);
    ::dup2(::fileno(f), 2);
    std::fclose(f);
  }
  std::string finish() {
    std::fflush(stderr);
    ::dup2(saved_, 2);
    ::close(saved_);
    std::ifstream in(path_);
    std::stringstream ss;
    ss << in.rdbuf();
    std::filesystem::remove(path_);
    return ss.str();
  }

 private:
  std::string path_;
  int saved_ = -1;
};

struct Streams {
  cudaStream_t gather = nullptr, reader = nullptr;
  Streams() {
    CUDA_OK(cudaStreamCreateWithFlags(&gather, cudaStreamNonBlocking));
    CUDA_OK(cudaStreamCreateWithFlags(&reader, cudaStreamNonBlocking));
  }
  ~Streams() {
    cudaStreamSynchronize(gather);
    cudaStreamSynchronize(reader);
    cudaStreamDestroy(gather);
    cudaStreamDestroy(reader);
  }
};

// Gathers `sizes` back to back, `rounds` times, reading each result on another stream behind an
// event recorded right after the call; checks every byte. Returns the number of bytes checked.
std::size_t gather_and_check(dlo::Collective& coll, const std::vector<std::size_t>& sizes, int rounds) {
  const int r = world().rank(), n = world().size();
  Streams st;
  std::vector<void*> dev(sizes.size(), nullptr);
  std::vector<std::uint8_t*> host_out(sizes.size(), nullptr);
  std::vector<std::vector<std::uint8_t>> mine(sizes.size());
  std::vector<cudaEvent_t> ready(sizes.size(), nullptr);
  for (std::size_t k = 0; k < sizes.size(); ++k) {
    const std::size_t total = sizes[k] * static_cast<std::size_t>(n) + 1;
    CUDA_OK(cudaMalloc(&dev[k], total));
    CUDA_OK(cudaMallocHost(reinterpret_cast<void**>(&host_out[k]), total));
    CUDA_OK(cudaEventCreateWithFlags(&ready[k], cudaEventDisableTiming));
  }
  std::size_t checked = 0;
  for (int t = 0; t < rounds; ++t) {
    for (std::size_t k = 0; k < sizes.size(); ++k) {
      const std::size_t s = sizes[k];
      auto* buf = static_cast<std::uint8_t*>(dev[k]);
      mine[k].resize(s);
      for (std::size_t i = 0; i < s; ++i) mine[k][i] = pattern(r, i, t, static_cast<int>(k));
      // Everything else is garbage before the gather, including a guard byte past the end.
      CUDA_OK(cudaMemsetAsync(buf, 0xEE, s * static_cast<std::size_t>(n) + 1, st.gather));
      if (s > 0)
        CUDA_OK(cudaMemcpyAsync(buf + static_cast<std::size_t>(r) * s, mine[k].data(), s, cudaMemcpyHostToDevice,
                                st.gather));
      coll.allgather_inplace(buf, s, st.gather);
      // As the engine does: the event right after the call, the consumer on another stream.
      CUDA_OK(cudaEventRecord(ready[k], st.gather));
      CUDA_OK(cudaStreamWaitEvent(st.reader, ready[k], 0));
      CUDA_OK(cudaMemcpyAsync(host_out[k], buf, s * static_cast<std::size_t>(n) + 1, cudaMemcpyDeviceToHost,
                              st.reader));
    }
    CUDA_OK(cudaStreamSynchronize(st.reader));
    for (std::size_t k = 0; k < sizes.size(); ++k) {
      const std::size_t s = sizes[k];
      std::size_t bad = 0, first_bad = 0;
      for (int j = 0; j < n; ++j)
        for (std::size_t i = 0; i < s; ++i)
          if (host_out[k][static_cast<std::size_t>(j) * s + i] != pattern(j, i, t, static_cast<int>(k))) {
            if (bad++ == 0) first_bad = static_cast<std::size_t>(j) * s + i;
          }
      CAPTURE(t);
      CAPTURE(s);
      CAPTURE(first_bad);
      CHECK(bad == 0);
      CHECK(host_out[k][s * static_cast<std::size_t>(n)] == 0xEE);  // nothing written past the end
      checked += s * static_cast<std::size_t>(n);
    }
  }
  for (std::size_t k = 0; k < sizes.size(); ++k) {
    cudaEventDestroy(ready[k]);
    cudaFreeHost(host_out[k]);
    cudaFree(dev[k]);
  }
  return checked;
}

}  // namespace

TEST_CASE("NCCL gathers of many sizes, back to back, each read behind an event on another stream: every byte right") {
  auto coll = dlo::make_nccl_collective(world(), 0);
  CHECK(coll->name() == "nccl");
  CHECK(coll->rank() == world().rank());
  CHECK(coll->size() == world().size());
  CHECK(contains(coll->describe(), "nccl 2."));
  CHECK(coll->timeout_s() == world().timeout_s());
  if (world().rank() == 0) MESSAGE(coll->describe());
  const std::vector<std::size_t> sizes = {0, 1, 3, 255, 4097, 65537, (std::size_t{1} << 20) + 13, (std::size_t{4} << 20) + 7};
  const std::size_t checked = gather_and_check(*coll, sizes, 12);
  CHECK(checked > 0);
  coll->check_async_error();  // nothing pending, no error
}

TEST_CASE("the NCCL collective is finalized and destroyed without a word, and a new one works afterwards") {
  for (int round = 0; round < 2; ++round) {
    CAPTURE(round);
    auto coll = dlo::make_nccl_collective(world(), 0);
    gather_and_check(*coll, {1000, 333333}, 3);
    StderrCapture cap;
    coll.reset();  // ncclCommFinalize, wait, ncclCommDestroy
    const std::string said = cap.finish();
    CAPTURE(said);
    CHECK_FALSE(contains(said, "NCCL ("));  // NcclComm's lines: a failed finalize or destroy
    CHECK(cudaDeviceSynchronize() == cudaSuccess);
    world().barrier("after destroying the NCCL collective");
  }
}

TEST_CASE("abort() while a gather waits for a peer that never comes: the stream drains, later calls throw") {
  auto coll = dlo::make_nccl_collective(world(), 0);
  const std::size_t s = 65536 + 3;
  gather_and_check(*coll, {s}, 2);  // connections up, so the lone gather below can be enqueued
  world().barrier("before the lone gather");
  Streams st;
  void* buf = nullptr;
  CUDA_OK(cudaMalloc(&buf, s * static_cast<std::size_t>(world().size())));
  if (world().rank() == 0) {
    // Rank 1 never joins this gather. A second thread stands in for the engine's watchdog.
    std::thread watchdog([&] {
      std::this_thread::sleep_for(std::chrono::seconds(2));
      coll->abort();
    });
    std::string what;
    try {
      coll->allgather_inplace(buf, s, st.gather);  // returns (kernel waits on the device) or is stopped
    } catch (const dlo::Error& e) {
      what = e.what();
    }
    watchdog.join();
    MESSAGE("the lone gather: " << (what.empty() ? std::string("enqueued") : what));
    if (!what.empty()) CHECK(contains(what, "abort"));
    // ncclCommAbort tells kernels still on the device to quit: the stream drains (a hang here
    // ends in the script's timeout).
    const cudaError_t e = cudaStreamSynchronize(st.gather);
    MESSAGE("cudaStreamSynchronize after the abort: " << cudaGetErrorString(e));
  } else {
    coll->abort();  // rank 1 leaves too
  }
  const std::string again = [&] {
    try {
      coll->allgather_inplace(buf, s, st.gather);
    } catch (const dlo::Error& e) {
      return std::string(e.what());
    }
    return std::string();
  }();
  CHECK(contains(again, "aborted"));
  CHECK_THROWS_AS(coll->allgather_inplace(buf, 0, st.gather), dlo::Error);
  CHECK_THROWS_AS(coll->check_async_error(), dlo::Error);
  coll.reset();  // nothing more to do on an aborted communicator
  cudaFree(buf);
  world().barrier("after the abort");
}
#endif

#ifdef DLO_HAVE_CUDA
TEST_CASE("activation exchanges over NCCL equal the MPI network's byte for byte: uneven tokens and heads, back to back") {
  const int n = world().size(), me = world().rank();
  const auto mpi = dlo::make_exchange_network(world(), at::kCPU);
  const auto nccl = dlo::make_exchange_network(world(), at::Device(at::kCUDA, 0));
  CHECK(nccl->describe().rfind("nccl", 0) == 0);
  const auto gm = mpi->split(0, "test: one group on MPI");
  const auto gn = nccl->split(0, "test: one group on NCCL");
  REQUIRE(gn->size() == n);
  CHECK(gn->rank() == me);
  CHECK(gn->device() == at::Device(at::kCUDA, 0));
  for (const auto dtype : {at::kBFloat16, at::kFloat}) {
    CAPTURE(c10::toString(dtype));
    // 27 tokens and 5 heads (of dim 8): uneven shares at every rank count.
    const dlo::Partition tokens = dlo::Partition::even(27, n, "tokens"), heads = dlo::Partition::even(5, n, "heads");
    std::vector<at::Tensor> on_device, on_host;
    const std::uint64_t sent0 = gn->bytes_sent();
    for (int round = 0; round < 20; ++round) {  // no host sync between the rounds on the device
      at::manual_seed(static_cast<std::uint64_t>(100 * round + me));
      const at::Tensor x = at::randn({1, tokens.size[me], 5, 8}).to(dtype);
      const at::Tensor xd = x.to(at::Device(at::kCUDA, 0));
      const at::Tensor hd = dlo::seq_to_heads(*gn, xd, tokens, heads);
      const at::Tensor h = dlo::seq_to_heads(*gm, x, tokens, heads);
      on_device.push_back(hd);
      on_host.push_back(h);
      on_device.push_back(dlo::heads_to_seq(*gn, hd, tokens, heads));
      on_host.push_back(x);  // the round trip is the identity
      on_device.push_back(dlo::gather_tokens(*gn, xd, tokens));
      on_host.push_back(dlo::gather_tokens(*gm, x, tokens));
      // CFG's exchange: every rank's prediction has the same shape.
      const at::Tensor pred = at::randn({1, 7, 8}).to(dtype);
      const auto all = dlo::gather_all(*gn, pred.to(at::Device(at::kCUDA, 0)));
      const auto all_host = dlo::gather_all(*gm, pred);
      for (int r = 0; r < n; ++r) {
        on_device.push_back(all[static_cast<std::size_t>(r)]);
        on_host.push_back(all_host[static_cast<std::size_t>(r)]);
      }
    }
    for (std::size_t i = 0; i < on_device.size(); ++i) {
      CAPTURE(i);
      CHECK(at::equal(on_device[i].to(at::kCPU), on_host[i]));
    }
    // Bytes to the other ranks, by hand: tokens to heads sends my tokens' other heads, back to
    // tokens their tokens' of my heads; gathering the tokens sends all mine ([1, s, 5, 8]) and the
    // predictions' exchange my [1, 7, 8] to every other rank.
    std::uint64_t want = 0;
    const std::uint64_t e = dtype == at::kFloat ? 4 : 2;
    for (int j = 0; j < n; ++j) {
      if (j == me) continue;
      want += static_cast<std::uint64_t>(tokens.size[me] * heads.size[j] * 8) * e;  // to heads
      want += static_cast<std::uint64_t>(tokens.size[j] * heads.size[me] * 8) * e;  // back to tokens
      want += static_cast<std::uint64_t>(tokens.size[me] * 5 * 8) * e;               // gather_tokens
      want += static_cast<std::uint64_t>(7 * 8) * e;                                  // gather_all
    }
    CHECK(gn->bytes_sent() - sent0 == 20 * want);
  }
}
#endif

int main(int argc, char** argv) {
  if (argc > 1 && std::string(argv[1]) == "--probe") return probe("test_nccl_gpu --probe");
  const int pre = probe("test_nccl_gpu");  // the same answer on every rank of one machine
  if (pre != 0) return pre;
  dlo::MpiWorld world(&argc, &argv);
  world.set_timeout_s(60);  // gathers and set-up fail within a minute instead of hanging
  g_world = &world;
  doctest::Context ctx(argc, argv);
  int failed = ctx.run();
  MPI_Allreduce(MPI_IN_PLACE, &failed, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
  return failed;
}
