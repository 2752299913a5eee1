// The CPU's activation exchanges: a group is an MPI communicator split from the world's
// (MpiWorld::split), its all-to-all-v MpiGroup's bounded one.
#include <climits>
#include <memory>

#include <ATen/ATen.h>

#include "dlo/common/error.h"
#include "dlo/dist/exchange_group.h"
#include "dlo/mpi/mpi_world.h"

namespace dlo {
namespace {

class MpiExchangeGroup final : public ExchangeGroup {
 public:
  explicit MpiExchangeGroup(std::unique_ptr<MpiGroup> g) : ExchangeGroup(g->rank(), g->world_ranks()), g_(std::move(g)) {}
  c10::Device device() const override { return at::kCPU; }
  std::uint64_t max_exchange_bytes() const override { return static_cast<std::uint64_t>(INT_MAX); }
  void alltoallv(const at::Tensor& send, const std::vector<std::size_t>& send_bytes,
                 const std::vector<std::size_t>& send_offset, const at::Tensor& recv,
                 const std::vector<std::size_t>& recv_bytes, const std::vector<std::size_t>& recv_offset,
                 const char* phase) const override {
    DLO_ASSERT(send.is_cpu() && recv.is_cpu(), phase, ": the MPI exchange takes CPU tensors, got ", send.device().str(),
               " and ", recv.device().str());
    DLO_ASSERT(send.is_contiguous() && recv.is_contiguous(), phase, ": exchange buffers must be contiguous");
    g_->alltoallv(send.data_ptr(), send_bytes, send_offset, recv.data_ptr(), recv_bytes, recv_offset, phase);
    count_sent(send_bytes);
  }

 private:
  std::unique_ptr<MpiGroup> g_;
};

class MpiExchangeNetwork final : public ExchangeNetwork {
 public:
  explicit MpiExchangeNetwork(const MpiWorld& world) : world_(world) {}
  std::string describe() const override { return "mpi"; }
  std::unique_ptr<ExchangeGroup> split(int color, const char* phase) override {
    return std::make_unique<MpiExchangeGroup>(world_.split(color, phase));
  }

 private:
  const MpiWorld& world_;
};

}  // namespace

std::unique_ptr<ExchangeNetwork> make_exchange_network(const MpiWorld& world, c10::Device device) {
  if (device.is_cuda()) return make_nccl_exchange_network(world, device.has_index() ? device.index() : 0);
  DLO_ASSERT(device.is_cpu(), "activation exchanges on ", device.str());
  return std::make_unique<MpiExchangeNetwork>(world);
}

}  // namespace dlo
