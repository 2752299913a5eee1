// Shared by the latents HDF5 tests: the values every entry is written with (latents_h5_check.py
// computes the same ones independently) and a folder shared by the ranks.
#pragma once

#include <mpi.h>

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <random>
#include <string>
#include <vector>

#include "dlo/mpi/mpi_world.h"

namespace dlo::test {

// The tests' MpiWorld (MPI initialised by their main first; it finalises MPI itself).
inline const MpiWorld& world() {
  static MpiWorld w(nullptr, nullptr);
  return w;
}

// Element e of entry `index` written in generation `gen`: exact in float32 (every term below 2^24,
// halves), with both signs.
inline std::vector<float> latents_values(std::size_t index, int gen, const std::vector<std::int64_t>& shape) {
  std::int64_t n = 1;
  for (std::int64_t d : shape) n *= d;
  std::vector<float> v(static_cast<std::size_t>(n));
  for (std::int64_t e = 0; e < n; ++e) {
    const double sign = e % 2 == 1 ? -1.0 : 1.0;
    v[static_cast<std::size_t>(e)] = static_cast<float>(sign * (static_cast<double>(index + 1) * 1000 + gen * 100000) +
                                                        static_cast<double>(e % 997) * 0.5);
  }
  return v;
}

// A fresh folder that every rank of `comm` sees (rank 0 makes it under $TMPDIR; one machine), removed
// at scope exit. Collective construction and destruction.
class SharedDir {
 public:
  explicit SharedDir(MPI_Comm comm) : comm_(comm) {
    MPI_Comm_rank(comm_, &rank_);
    std::string p;
    if (rank_ == 0) {
      std::random_device rd;
      p = (std::filesystem::temp_directory_path() / ("dlo-h5-test-" + std::to_string(rd()) + std::to_string(rd())))
              .string();
      std::filesystem::create_directories(p);
    }
    int n = static_cast<int>(p.size());
    MPI_Bcast(&n, 1, MPI_INT, 0, comm_);
    p.resize(static_cast<std::size_t>(n));
    MPI_Bcast(p.data(), n, MPI_CHAR, 0, comm_);
    path_ = p;
  }
  ~SharedDir() {
    MPI_Barrier(comm_);
    std::error_code ec;
    if (rank_ == 0) std::filesystem::remove_all(path_, ec);
  }
  SharedDir(const SharedDir&) = delete;
  SharedDir& operator=(const SharedDir&) = delete;
  const std::string& path() const { return path_; }
  std::string file(const std::string& name) const { return path_ + "/" + name; }

 private:
  MPI_Comm comm_;
  int rank_ = 0;
  std::string path_;
};

}  // namespace dlo::test
