// The device checks are per host (label mpi; also run on two simulated nodes by
// tests/dlo-generate/two_nodes_cli.sh): ranks on one host that name the same CUDA device share it and
// are refused, naming each other; ranks on different hosts never share, whatever the index. No GPU
// is needed: the checks compare "<host>/<device>" ids (a PCI bus id where a driver answers,
// "cuda:N" where none does) and only refuse.
#include "common/doctest_torch.h"

#include <map>
#include <string>
#include <vector>

#include "common/mpi_test_util.h"
#include "dlo/common/error.h"
#include "dlo/dist/device.h"
#include "dlo/mpi/mpi_world.h"

using dlo::test::world;

TEST_CASE("ranks sharing a CUDA device are counted per host and refused, one per host is not") {
  const auto& hosts = world().hosts();
  REQUIRE(static_cast<int>(hosts.size()) == world().size());
  CHECK(hosts[static_cast<std::size_t>(world().rank())] == world().host());
  // By hand: the ranks on this rank's host, in order.
  std::string peers;
  int here = 0;
  std::map<std::string, int> per_host;
  for (int r = 0; r < world().size(); ++r) {
    ++per_host[hosts[static_cast<std::size_t>(r)]];
    if (hosts[static_cast<std::size_t>(r)] != world().host()) continue;
    peers += (peers.empty() ? "" : ",") + std::to_string(r);
    ++here;
  }
  bool any_shared = false;
  for (const auto& [h, n] : per_host) any_shared = any_shared || n > 1;
  const c10::Device dev(c10::kCUDA, 0);
  const dlo::DeviceSharing s = dlo::device_sharing(world(), dev, "");
  CHECK(s.id.rfind(world().host() + "/", 0) == 0);
  CHECK(s.ranks_on_device == here);
  CHECK(s.peers == peers);
  if (any_shared) {
    // The same refusal on every rank, naming the ranks of a shared device.
    std::string what;
    try {
      dlo::check_exclusive_devices(world(), dev, s);
    } catch (const dlo::Error& e) {
      what = e.what();
    }
    CHECK(what.find("one GPU per rank") != std::string::npos);
    if (here > 1) CHECK(what.find("ranks " + peers + " all use cuda:0") != std::string::npos);
  } else {
    CHECK_NOTHROW(dlo::check_exclusive_devices(world(), dev, s));
  }
  // Every rank its own host id (NCCL_HOSTID, the one-GPU test set-up): nobody shares.
  const dlo::DeviceSharing own = dlo::device_sharing(world(), dev, "id-" + std::to_string(world().rank()));
  CHECK(own.ranks_on_device == 1);
  CHECK_NOTHROW(dlo::check_exclusive_devices(world(), dev, own));
  // The CPU is shared by design.
  CHECK_NOTHROW(dlo::check_exclusive_devices(world(), c10::kCPU, dlo::device_sharing(world(), c10::kCPU, "")));
}
