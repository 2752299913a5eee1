// The MPI weight gather across hosts (label mpi; also run on two simulated nodes by
// tests/dlo-generate/two_nodes_cli.sh, node by node and alternating): every rank ends with every
// rank's shard at its place, byte for byte, whatever the shard size; ranks placed node by node
// with as many on each use the two-level gather (across the nodes, then within each), any other
// placement and one host the flat one; messages capped small, every shard goes in chunks. The
// expected choice is worked out here from the hosts.
#include "common/doctest_torch.h"

#include <cstdint>
#include <iostream>
#include <map>
#include <string>
#include <vector>

#include "common/mpi_test_util.h"
#include "dlo/dist/collective.h"
#include "dlo/mpi/mpi_world.h"

using dlo::test::world;

namespace {

// Byte i of rank r's shard.
std::uint8_t pattern(int r, std::size_t i) { return static_cast<std::uint8_t>((r * 131 + i * 7 + i / 251) & 0xff); }

// The node count when the ranks sit node by node with as many on each, else 0.
int node_by_node(const std::vector<std::string>& hosts) {
  std::vector<std::string> order;
  std::map<std::string, int> count;
  for (const auto& h : hosts) {
    if (count[h]++ == 0) order.push_back(h);
  }
  const int n = static_cast<int>(order.size()), size = static_cast<int>(hosts.size());
  if (size % n != 0) return 0;
  for (int r = 0; r < size; ++r)
    if (hosts[static_cast<std::size_t>(r)] != order[static_cast<std::size_t>(r / (size / n))]) return 0;
  return n;
}

}  // namespace

TEST_CASE("the MPI weight gather: every shard at its place on every rank, two levels across nodes placed node by node") {
  const int size = world().size(), rank = world().rank();
  auto coll = dlo::make_mpi_collective(world());
  const int nodes = node_by_node(world().hosts());
  const std::string d = coll->describe();
  if (nodes > 1) {
    CHECK(d.find("two-level gathers over " + std::to_string(nodes) + " nodes") != std::string::npos);
  } else {
    CHECK(d.find("two-level") == std::string::npos);
  }
  if (rank == 0) std::cout << "the weight gather: " << d << std::endl;  // two_nodes_cli.sh reads it
  // The same collective with messages of at most 1000 bytes: shards in several chunks (a 4096-byte
  // shard in 5 of 1000 or, in two levels over 2 nodes, 9 of 500), the last one short.
  auto chunked = dlo::make_mpi_collective(world(), 1000);
  for (dlo::Collective* c : {coll.get(), chunked.get()}) {
    for (const std::size_t shard : {std::size_t{1}, std::size_t{3}, std::size_t{4096}, std::size_t{20011}, std::size_t{1} << 20}) {
      if (c == chunked.get() && shard > 20011) continue;  // thousands of chunks: slow, nothing new
      std::vector<std::uint8_t> buf(shard * static_cast<std::size_t>(size), 0xEE);
      for (std::size_t i = 0; i < shard; ++i) buf[static_cast<std::size_t>(rank) * shard + i] = pattern(rank, i);
      c->allgather_inplace(buf.data(), shard, nullptr);
      std::size_t wrong = 0;
      for (int r = 0; r < size; ++r)
        for (std::size_t i = 0; i < shard; ++i) wrong += buf[static_cast<std::size_t>(r) * shard + i] != pattern(r, i);
      CHECK_MESSAGE(wrong == 0, "shard of ", shard, " bytes", (c == chunked.get() ? ", 1000-byte messages" : ""), ": ",
                    wrong, " bytes wrong on rank ", rank);
    }
  }
}
