// Final latents of a batch in one HDF5 file shared by every rank (parallel HDF5 over MPI-IO).
//
// This is the `dlo_h5` target: torch-free, and the only dlo target that links HDF5, so the binaries
// that travel to a bare GPU machine (which link `dlo`) do not need it. It uses the HDF5 C API of
// Debian's parallel build (libhdf5-openmpi).
//
// The file, as h5py sees it (version 2):
//   /<name>              one float32 dataset per entry (contiguous, little-endian, C order), with
//                        the entry's string attributes and "fingerprint" (all UTF-8 strings);
//   /_complete/<name>    the entry's completion flag: a uint8 scalar dataset (contiguous), 1 where
//                        /<name> holds complete data, 0 where it was never written or its writing
//                        was cut off. A dataset without a flag counts as incomplete;
//   root attributes      "dlo_latents_version" (int, 2) and "layout" (a sentence saying the above).
//   A reader trusts a dataset only where its flag is 1:
//     done = {n: int(d[()]) for n, d in f["_complete"].items()}
// Each flag is created with its entry's dataset (0, in the constructor, as metadata) and from then
// on only written in place, as one raw byte, by whoever writes that entry (write()). An open never
// rewrites the flag of a dataset that is not among its entries, and of its own entries only those
// whose data it replaces (or whose flag is missing or not a uint8 scalar). Version 1 (one table
// /_complete, uint8[n], names in its attribute "names") is converted to version 2 when a
// LatentsFile opens it: each dataset's flag is taken from the table (the caller's lock makes that
// the only writer), the table is deleted first; read_latents_entries() reads both versions.
//
// What a killed batch leaves (a rank SIGKILLed, MPI_Abort, a node lost). Every metadata change
// (datasets, flags, attributes, storage allocated in full) happens in the constructor, which
// ends with a collective flush; after that the only changes are raw bytes written in place. So
// once the constructor has returned on every rank, the file on disk is a valid HDF5 file whatever
// happens to the processes, and for each entry either its flag is 0, or its data were written
// before its flag (write() writes the data, then the flag byte; overwriting a complete entry first
// clears its flag). Data from a killed process reach the file when the kernel has them: a process
// death loses nothing that write() returned from, but a machine crash (power, kernel) can lose
// writes since the last flush() and, without an fsync between them, could keep the flag but not
// the data; flush() (MPI_File_sync) at the lead's checkpoints bounds that. A resumed run re-renders
// every entry whose flag is 0. A new file is built under a temporary name in the same folder and
// renamed into place at the end of the constructor, so a batch killed while creating the file
// leaves no file under the final name (only a stray ".NAME.tmp-HOST-PID-N" beside it). The flags
// of entries whose data an open replaces (and version 1's table) are deleted and flushed before
// any data changes. A batch killed inside the constructor of a resumed file (deleting or creating
// datasets in place; HDF5 1.10 has no journal) can leave the file unreadable: the constructor
// then throws naming the file, and deleting it starts afresh.
//
// File systems: MPI-IO needs a file system that every rank sees coherently: a local disk for one
// node; Lustre, GPFS or BeeGFS across nodes. NFS (a note; not tested here): Open MPI 4.1's MPI-IO
// (OMPIO, fs/ufs) detects NFS and then takes an fcntl lock on the whole file around every access
// (MCA fs_ufs_lock_algorithm), so ranks' writes serialise but stay correct where NFS locking
// works (lockd; NFSv3 with "noac", or NFSv4). Where it does not (a "nolock" mount, no lockd) the
// lock fails, so write() throws and the job's latents are not kept (its flag stays 0), or MPI-IO
// aborts (ROMIO's "File locking failed in ADIOI_Set_lock"). Without locks and with client-side
// caching, a rank on another node may read stale metadata when the file is opened: the ranks'
// plans then differ and the constructor fails on every rank rather than diverge. HDF5's own file
// locking is not used by the MPI-IO driver, so this class does not stop two batches from opening
// one file at once (their metadata changes could corrupt it): a caller that may share a file
// holds a lock on it for as long as it is open (dlo-generate: a FolderLock beside it, FILE.lock,
// taken before the file is read for resume). One after the other, opens with disjoint entries
// never touch each other's data or flags.
//
// Space: HDF5 1.10 does not give back the space of a deleted dataset in a later session, so a
// resumed batch that replaces datasets grows the file by their size (h5repack compacts it).
//
// Thread-safety: none. Debian's parallel HDF5 is not built thread-safe; every HDF5 call in the
// process (this class included) must come from one thread at a time. Destroy a LatentsFile before
// MPI_Finalize (HDF5 closes what is still open when MPI finalises, not collectively).
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <string>
#include <utility>
#include <vector>

namespace dlo {

class MpiWorld;

struct LatentsEntry {
  std::string name;                 // dataset name, e.g. the job id: unique, non-empty, no '/' or
                                    // NUL, not "." and not the reserved "_complete"
  std::vector<std::int64_t> shape;  // e.g. {1, 16, 21, 60, 104}; 1..32 dims, each >= 1; at most
                                    // 2^31-1 bytes in all (one MPI-IO call per write)
  // String attributes (the job's parameters; "parameters_json" holds the JSON): unique non-empty
  // names other than "fingerprint"; names and values without NUL bytes.
  std::vector<std::pair<std::string, std::string>> attributes;
  std::string fingerprint;          // the job's parameter fingerprint (hex), stored as attribute
                                    // "fingerprint"; non-empty
};

// One HDF5 file shared by all ranks of a communicator. Not copyable or movable.
class LatentsFile {
 public:
  // Collective over `world` (its collectives wait at most world.timeout_s(); HDF5's own collective
  // calls run on a duplicate of its communicator): every rank passes the same path and the same entries in the same order
  // (checked: a difference throws on every rank). Creates the file if missing (under a temporary
  // name, renamed into place when complete). If it exists, it must be a file this class wrote (root
  // attribute "dlo_latents_version"); then an entry's dataset is kept with its data and flag if its
  // shape, type (float32) and "fingerprint" match, its other attributes being rewritten where they
  // differ; a dataset that differs is deleted and created anew (flag 0); missing ones are created
  // (flag 0); datasets of the file that are not among the entries, and their flags, are left as
  // they are. A version-1 file is converted to version 2 (see above). Every rank
  // reads the file the same way and decides; the decisions are compared (a rank that reads the
  // file differently, as on an incoherent file system, is an error on every rank), so every rank
  // does the same metadata operations. Storage is allocated at creation (no fill value written). Ends with a collective
  // flush. Throws dlo::Error naming the file (the same error on every rank, except for failures
  // inside an HDF5 collective call, which HDF5 reports per rank); the file is then closed.
  LatentsFile(const MpiWorld& world, const std::string& path, const std::vector<LatentsEntry>& entries);
  // Collective close (every rank destroys it; flushes). Errors are swallowed (a destructor).
  ~LatentsFile();
  LatentsFile(const LatentsFile&) = delete;
  LatentsFile& operator=(const LatentsFile&) = delete;

  // Independent (any rank, any time, whatever the others are doing): writes entry `index`'s data
  // (float32, entries[index].shape, C order; `data` holds that many floats) and then sets its flag
  // /_complete/<name>. Writing an entry again (by this or another rank) is allowed: its flag is
  // cleared first, so a write cut off halfway never reads as complete. Two ranks must not write
  // the same entry concurrently. Throws dlo::Error naming the file and the entry.
  void write(std::size_t index, const float* data);

  // Whether entry `index` holds complete data, as this rank knows it: complete when the file was
  // opened, or written by this rank since, or by any rank before the last flush(). Local; no I/O.
  bool complete(std::size_t index) const;

  // Collective: flushes HDF5's buffers and syncs the file (MPI_File_sync), then shares every
  // rank's flags, so that afterwards complete() agrees on all ranks. Throws dlo::Error.
  void flush();

  const std::string& path() const { return path_; }
  std::size_t size() const { return entries_.size(); }

 private:
  void close_all() noexcept;

  const MpiWorld& world_;
  int comm_handle_ = -1;  // HDF5's duplicate of the world's communicator (MpiWorld::duplicate_comm)
  int rank_ = 0;
  std::string path_;
  std::vector<LatentsEntry> entries_;
  std::vector<unsigned char> complete_;  // per entry
  std::int64_t file_ = -1;               // hid_t
  std::vector<std::int64_t> flags_;      // hid_t per entry: /_complete/<name>
  std::vector<std::int64_t> datasets_;   // hid_t per entry
};

// An entry of an existing latents file: the fingerprint it was written for ("" if it has none) and
// whether its flag says its data are complete.
struct SavedLatentsEntry {
  std::string fingerprint;
  bool complete = false;
};

// Not collective (one process, no MPI-IO; before the ranks open the file): the datasets of the
// latents file at `path` (a symbolic link followed) by name. Empty when there is no file yet.
// Throws dlo::Error naming the file when it is something LatentsFile would refuse to open (not an
// HDF5 file, one dlo did not write, another version, unreadable). Reads metadata and the flags;
// reads version 1 as it is (a LatentsFile converts it).
std::map<std::string, SavedLatentsEntry> read_latents_entries(const std::string& path);

}  // namespace dlo
