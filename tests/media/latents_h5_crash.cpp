// Driver for the crash test (latents_h5_check.py crash): a batch whose last rank SIGKILLs itself
// mid-way, and the resumed run after it.
//
//   latents_h5_crash FILE crash   every rank writes its entries among 0-3 (i % size == rank), a
//                                 barrier, then the last rank writes entry 5 and kills itself
//                                 while the others wait: the batch ends without a close or flush.
//   latents_h5_crash FILE resume  reopens: entries 0-3 and 5 must read as complete, the others
//                                 not (exit 1 otherwise); writes the missing ones, closes.
// The entries: 8 of shape [1, 4, 3, 8, 8], named e<i>, fingerprint fp<i>, attribute
// parameters_json {"i": <i>}; values latents_values(i, 0, shape).
#include <mpi.h>

#include <csignal>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "dlo/common/error.h"
#include "dlo/media/latents_h5.h"
#include "media/latents_h5_util.h"

int main(int argc, char** argv) {
  int provided = 0;
  MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided);
  int rank = 0, size = 1, rc = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  if (argc != 3 || (std::strcmp(argv[2], "crash") != 0 && std::strcmp(argv[2], "resume") != 0)) {
    if (rank == 0) std::fprintf(stderr, "usage: latents_h5_crash FILE crash|resume\n");
    MPI_Finalize();
    return 2;
  }
  const bool crash = std::strcmp(argv[2], "crash") == 0;
  std::vector<dlo::LatentsEntry> entries;
  for (int i = 0; i < 8; ++i)
    entries.push_back({"e" + std::to_string(i), {1, 4, 3, 8, 8}, {{"parameters_json", "{\"i\": " + std::to_string(i) + "}"}},
                       "fp" + std::to_string(i)});
  try {
    dlo::LatentsFile f(dlo::test::world(), argv[1], entries);
    if (crash) {
      for (int i = 0; i < 4; ++i)
        if (i % size == rank) f.write(i, dlo::test::latents_values(i, 0, entries[i].shape).data());
      MPI_Barrier(MPI_COMM_WORLD);
      if (rank == size - 1) {
        f.write(5, dlo::test::latents_values(5, 0, entries[5].shape).data());
        std::raise(SIGKILL);
      }
      MPI_Barrier(MPI_COMM_WORLD);  // never passes: mpirun ends every rank when one dies
      rc = 3;
    } else {
      int k = 0;
      for (std::size_t i = 0; i < entries.size(); ++i) {
        const bool want = i < 4 || i == 5;
        if (f.complete(i) != want) {
          std::fprintf(stderr, "[%d/%d] entry %zu: complete() %d, expected %d\n", rank, size, i, f.complete(i), want);
          rc = 1;
        }
        if (!f.complete(i) && k++ % size == rank) f.write(i, dlo::test::latents_values(i, 0, entries[i].shape).data());
      }
    }
  } catch (const dlo::Error& e) {
    std::fprintf(stderr, "[%d/%d] %s\n", rank, size, e.what());
    rc = 1;
  }
  MPI_Allreduce(MPI_IN_PLACE, &rc, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
  MPI_Finalize();
  return rc;
}
