// Helpers for the doctest binaries run whole under mpirun (tests/mpi_doctest_main.cpp).
#pragma once

#include <string>

#include "common/test_util.h"
#include "dlo/mpi/mpi_world.h"

namespace dlo::test {

// The MpiWorld made by main(): MPI is already initialised, so this one only reads the facts.
inline const MpiWorld& world() {
  static MpiWorld w(nullptr, nullptr);
  return w;
}

// A directory rank 0 creates and every rank uses (all ranks of these tests share one machine).
class SharedDir {
 public:
  SharedDir() {
    if (world().rank() == 0) path_ = dir_.path().string();
    path_ = world().broadcast_string(path_);
  }
  std::string file(const std::string& n) const { return path_ + "/" + n; }

 private:
  TempDir dir_;  // rank 0's is the one used; the others' are empty and removed
  std::string path_;
};

}  // namespace dlo::test
