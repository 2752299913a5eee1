// MpiWorld's small collectives (point-to-point, polled, bounded): values against what each rank
// computes by hand, across enough calls to wrap the tag sequence. Run under mpirun -np 1 and 3.
// (The timeouts themselves are tested through the tools: tests/apps/test_hardening_mpi.sh.)
#include <doctest/doctest.h>

#include <cstdint>
#include <string>
#include <vector>

#include "dlo/common/error.h"
#include "dlo/mpi/mpi_world.h"

namespace {

// MPI is initialised by main(); this one only reads the facts and duplicates the communicator.
const dlo::MpiWorld& world() {
  static dlo::MpiWorld w(nullptr, nullptr);
  return w;
}

}  // namespace

TEST_CASE("allgather, allreduce and barrier agree with values computed by hand, 20000 times over") {
  const auto& w = world();
  const int n = w.size(), r = w.rank();
  for (int i = 0; i < 20000; ++i) {  // more than the 8000 tag blocks: the sequence wraps
    const auto all = w.allgather(std::int64_t{1000} * r + i, "test allgather");
    REQUIRE(all.size() == static_cast<std::size_t>(n));
    for (int k = 0; k < n; ++k) REQUIRE(all[static_cast<std::size_t>(k)] == std::int64_t{1000} * k + i);
  }
  CHECK(w.allreduce_max(r * 7 - 3) == (n - 1) * 7 - 3);
  CHECK(w.allreduce_min(r * 7 - 3) == -3);
  w.barrier("test barrier");
}

TEST_CASE("gather_strings and broadcast_string carry every byte, empty and large strings included") {
  const auto& w = world();
  const int n = w.size(), r = w.rank();
  auto payload = [](int rank) {
    std::string s(static_cast<std::size_t>(rank) * 100003, '\0');  // rank 0: empty; others > eager limits
    for (std::size_t i = 0; i < s.size(); ++i) s[i] = static_cast<char>((i * 31 + rank) & 0xff);
    return s;
  };
  for (int root = 0; root < n; ++root) {
    const auto got = w.gather_strings(payload(r), root, "test gather");
    if (r == root) {
      REQUIRE(got.size() == static_cast<std::size_t>(n));
      for (int k = 0; k < n; ++k) CHECK(got[static_cast<std::size_t>(k)] == payload(k));
    } else {
      CHECK(got.empty());
    }
    const std::string b = w.broadcast_string(r == root ? payload(root + 1) : std::string("ignored"), root, "test bcast");
    CHECK(b == payload(root + 1));
  }
}

TEST_CASE("check_all: nothing when no rank has an error, the same combined error on every rank otherwise") {
  const auto& w = world();
  CHECK_NOTHROW(w.check_all(""));
  std::string msg;
  try {
    w.check_all(w.rank() == w.size() - 1 ? "bad input on the last rank" : "");
  } catch (const dlo::Error& e) {
    msg = e.what();
  }
  const std::string want = w.size() > 1 ? "rank " + std::to_string(w.size() - 1) + ": bad input on the last rank"
                                        : "bad input on the last rank";
  CHECK(msg == want);
  CHECK_THROWS_AS(const_cast<dlo::MpiWorld&>(w).set_timeout_s(0), dlo::Error);
}
