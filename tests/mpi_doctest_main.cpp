// main() for doctest binaries run under mpirun: MPI set up first, every rank runs every case, a
// failure on any rank fails the run.
#define DOCTEST_CONFIG_IMPLEMENT
#include <doctest/doctest.h>
#include <mpi.h>

#include "dlo/dist/mpi_world.h"

int main(int argc, char** argv) {
  dlo::MpiWorld world(&argc, &argv);
  doctest::Context ctx(argc, argv);
  int failed = ctx.run();
  MPI_Allreduce(MPI_IN_PLACE, &failed, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
  return failed;
}
