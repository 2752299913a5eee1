// MPI wiring: run under mpirun -np 2 (see tests/CMakeLists.txt). Every rank contributes a
// buffer whose values encode (rank, index); after MPI_Allgather every rank checks every value.
#define DOCTEST_CONFIG_IMPLEMENT
#include <doctest/doctest.h>
#include <mpi.h>

#include <cstdint>
#include <vector>

TEST_CASE("MPI_Allgather delivers every rank's buffer to every rank, in rank order") {
  int rank = -1, size = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  REQUIRE(size >= 2);
  const int n = 1 << 20;  // 4 MiB per rank: larger than any eager limit
  std::vector<std::int32_t> mine(n), all(static_cast<std::size_t>(n) * size, -1);
  for (int i = 0; i < n; ++i) mine[i] = rank * 7919 + i;
  REQUIRE(MPI_Allgather(mine.data(), n, MPI_INT32_T, all.data(), n, MPI_INT32_T, MPI_COMM_WORLD) == MPI_SUCCESS);
  std::size_t wrong = 0;
  for (int r = 0; r < size; ++r)
    for (int i = 0; i < n; ++i) wrong += all[static_cast<std::size_t>(r) * n + i] != r * 7919 + i;
  CHECK(wrong == 0);
}

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  doctest::Context ctx(argc, argv);
  int failed = ctx.run();
  // A failure on any rank fails the test.
  MPI_Allreduce(MPI_IN_PLACE, &failed, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
  MPI_Finalize();
  return failed;
}
