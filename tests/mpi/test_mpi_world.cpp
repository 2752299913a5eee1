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
  // The kind is the gravest any rank reported: no room on one rank is an I/O error on all (exit 1,
  // not 2: the probe's FS10); bad input alone stays input.
  auto kind_of = [&](const std::string& error, dlo::ErrorKind kind) {
    try {
      w.check_all(error, "check", kind);
    } catch (const dlo::Error& e) {
      return e.kind();
    }
    return dlo::ErrorKind::kInternal;
  };
  CHECK(kind_of(w.rank() == 0 ? "bad input" : "", dlo::ErrorKind::kInput) == dlo::ErrorKind::kInput);
  const bool last = w.size() > 1 && w.rank() == w.size() - 1;
  CHECK(kind_of(w.rank() == 0 ? "bad input" : last ? "no space left" : "", last ? dlo::ErrorKind::kIo : dlo::ErrorKind::kInput) ==
        (w.size() > 1 ? dlo::ErrorKind::kIo : dlo::ErrorKind::kInput));
}

TEST_CASE("split: groups are the ranks of a color in world order, alltoallv moves uneven byte counts as computed by hand") {
  const auto& w = world();
  for (int colors = 1; colors <= w.size(); ++colors) {
    CAPTURE(colors);
    const int color = w.rank() % colors;
    const auto g = w.split(color);
    std::vector<int> want;
    for (int r = color; r < w.size(); r += colors) want.push_back(r);
    CHECK(g->world_ranks() == want);
    CHECK(g->size() == static_cast<int>(want.size()));
    CHECK(want[static_cast<std::size_t>(g->rank())] == w.rank());
    // Group rank i sends group rank j (i + 1) * (j + 2) bytes (none to itself when i == j == 1),
    // byte k of it (31 * i + 7 * j + k) % 251, after a gap of 3 bytes between peers.
    const auto n = static_cast<std::size_t>(g->size());
    const auto count = [](std::size_t i, std::size_t j) { return i == 1 && j == 1 ? std::size_t{0} : (i + 1) * (j + 2); };
    const auto byte = [](std::size_t i, std::size_t j, std::size_t k) { return static_cast<unsigned char>((31 * i + 7 * j + k) % 251); };
    const auto me = static_cast<std::size_t>(g->rank());
    std::vector<std::size_t> sb(n), so(n), rb(n), ro(n);
    std::vector<unsigned char> send;
    std::size_t at = 0;
    for (std::size_t j = 0; j < n; ++j) {
      so[j] = at + 3;
      sb[j] = count(me, j);
      send.resize(so[j] + sb[j], 0xee);
      for (std::size_t k = 0; k < sb[j]; ++k) send[so[j] + k] = byte(me, j, k);
      at = so[j] + sb[j];
    }
    at = 0;
    for (std::size_t i = 0; i < n; ++i) {
      ro[i] = at;
      rb[i] = count(i, me);
      at += rb[i];
    }
    std::vector<unsigned char> recv(at + 1, 0xaa);
    g->alltoallv(send.data(), sb, so, recv.data(), rb, ro, "test exchange");
    bool same = recv.back() == 0xaa;  // nothing written past the counts
    for (std::size_t i = 0; i < n; ++i)
      for (std::size_t k = 0; k < rb[i]; ++k) same = same && recv[ro[i] + k] == byte(i, me, k);
    CHECK(same);
  }
}
