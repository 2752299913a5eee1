// What every tool's main() shares (dlo-checkpoint, dlo-forward, dlo-bench-engine, dlo-generate):
// signals turned into messages, exceptions mapped to exit codes, outputs checked on every rank
// before the work starts. Settings and thread bounds are in dlo/common/settings.h.
#pragma once

#include <exception>
#include <functional>
#include <string>
#include <vector>

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

// The one-line message for an exception: dlo::Error's message; c10::Error without the stack
// trace; an allocation failure (std::bad_alloc, libtorch's "not enough memory") as "out of
// memory: ...".
std::string describe_exception(const std::exception& e);
bool is_allocation_failure(const std::exception& e);

// Runs a tool's body under the shared rules and returns its exit code:
//   * body()'s return value;
//   * dlo::Error: "<tool>: error: <message>" on stderr (rank 0 only when `world` has several
//     ranks: by contract such errors are found before the work and are the same on every rank,
//     see MpiWorld::check_all) and kExitBadInput (2);
//   * any other exception (libtorch errors, out of memory, ...): on one rank "<tool>: error:
//     <describe_exception>" and kExitFailed (1); on several, MpiWorld::abort with that message
//     (the other ranks may be waiting in a collective).
// Installs the fault handlers first. `world` may be null (tools without MPI).
int run_tool(const std::string& tool, const MpiWorld* world, const std::function<int()>& body);

// Collective: checks on every rank that each of `files` can be written (dlo::check_output_path:
// a regular file or a new one in a writable folder; symlinks followed; devices, FIFOs and folders
// refused). Any failure becomes the same dlo::Error on every rank. Empty paths are skipped.
void check_output_files(const MpiWorld& world, const std::vector<std::string>& files);

}  // namespace dlo
