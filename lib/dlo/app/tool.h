// What every tool's main() shares (dlo-checkpoint, dlo-forward, dlo-bench-engine, dlo-generate):
// signals turned into messages, exceptions mapped to exit codes, outputs checked on every rank
// before the work starts. Settings and thread bounds are in dlo/common/settings.h.
#pragma once

#include <exception>
#include <functional>
#include <string>
#include <vector>

#include "dlo/common/error.h"
#include "dlo/models/torch_errors.h"

namespace dlo {

class MpiWorld;

// Installs, once per process (later calls only update the rank tag):
//   * a SIGBUS handler: a read of a memory-mapped checkpoint whose file was truncated or rewritten
//     while in use prints "[r/n] fatal: '<file>' changed while in use (truncated or rewritten by
//     another process): reading its mapping failed (SIGBUS); aborting all ranks" and ends every
//     rank (MPI_Abort, exit code 1) instead of a silent exit 135. A SIGBUS outside any mapping
//     says so the same way;
//   * a std::terminate handler: an exception that escapes a thread prints its message and ends
//     every rank (exit code 1) instead of SIGABRT.
// `world` (may be null) gives the rank tag of the messages. Not thread-safe: call from main().
void install_fault_handlers(const MpiWorld* world);

// SIGINT and SIGTERM as a request to stop: the first only sets stop_signal() (a batch stops at its
// next pass boundary on every rank and finishes the decodes already queued, a bounded few); a
// second one stops now (acted on within 20 ms by a watcher thread, not in the handler):
// "[r/n] fatal: second signal N: stopping now; ..." and every rank ends with 128 + N
// (MPI_Abort), the output folder's lock released. What it leaves is safe to resume from:
// partial files have temporary names, finished videos carry their job in their metadata.
void install_stop_handlers();
int stop_signal();  // 0 until the first

// Runs a tool's body under the shared rules and returns its exit code:
//   * body()'s return value;
//   * an exception, as "<tool>: error: <message>" (describe_exception: no libtorch stack traces)
//     and the exit code of its kind (exit_code_of in common/settings.h; exceptions that are not dlo::Error are
//     internal). With several ranks, an error every rank raised alike (Error::on_every_rank(),
//     as MpiWorld::check_all throws them) is printed once, by rank 0, and every rank returns; any
//     other error is this rank's alone and the others may be waiting for it in a collective, so it
//     ends every rank at once (MpiWorld::abort) with this rank's message and its kind's code.
// Installs the fault handlers first. `world` may be null (tools without MPI).
int run_tool(const std::string& tool, const MpiWorld* world, const std::function<int()>& body);

// What run_tool does with an exception escaping a tool's body with several ranks, for code that
// must not wait for the stack to unwind (threads still running, a collective in flight): ends
// every rank now with "<tool>: <message>" and the kind's exit code. Returns only if the error is
// on_every_rank() (which needs no abort) or the world has one rank.
void end_all_ranks_unless_shared(const std::string& tool, const MpiWorld& world, const std::exception& e);

// Collective: the CPU threads each rank computes with when --threads is not given. OMP_NUM_THREADS
// when set (Slurm scripts set it from SLURM_CPUS_PER_TASK); otherwise the cores of this rank's
// affinity mask divided among the ranks of its node whose masks overlap it: all of them when the
// launcher binds no one (mpirun -np 2 on a laptop: half the cores each), none but itself when it
// binds each rank to its own cores (srun --cpus-per-task=8: 8 each). `why` says which rule chose.
int default_threads(const MpiWorld& world, std::string* why);

}  // namespace dlo
