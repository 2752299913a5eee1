// Files: inputs read without blocking on a FIFO, outputs that never look finished before they are.
//
// The output rule, for every file the tools write (MP4, PNG, safetensors, JSON, reports):
//   * a missing path or a regular file is written under a temporary name unique to this process
//     in the same folder (".<name>.tmp-<host>-<pid>-<n>"), every byte checked, fsync'ed, then
//     renamed over the path (and the folder fsync'ed), so a reader sees the old file or the whole
//     new one, and two processes writing the same path never share a temporary;
//   * a symbolic link is followed: its target is replaced as above and the link stays;
//   * anything else (a directory, a device such as /dev/null, a FIFO, a socket) is refused with a
//     dlo::Error: nothing the tools write is ever streamed into something that is not a file.
// The input rule: inputs are checked to be regular files (by stat, which never blocks) before
// they are opened.
//
// Thread-safety: the functions are thread-safe; one AtomicFile is driven by one thread.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>

namespace dlo {

// The folder part of `path` ("." when it has none, "/" for a file in the root) and its last
// component, as the shell's dirname and basename for paths without a trailing slash.
std::string path_folder(const std::string& path);
std::string path_name(const std::string& path);

// `path` absolute and normalised, with the symbolic links of its existing part resolved
// (std::filesystem::weakly_canonical): the one spelling of a location, for plans shared between
// ranks and for fingerprints. Never throws (a path it cannot resolve comes back absolute and
// normalised).
std::string canonical_path(const std::string& path);

// The path an output to `path` replaces: `path` itself, or the target of a symbolic link (links
// followed, relative targets resolved). Throws dlo::Error if that is a directory, device, FIFO or
// socket.
std::string resolve_output_path(const std::string& path);

// Checks before any work starts that an AtomicFile for `path` can be created: resolve_output_path
// accepts it, and its folder exists, is a folder and is writable. Throws dlo::Error naming the path
// and the reason. Creates nothing.
void check_output_path(const std::string& path);

// Checks before any work starts that the folder `dir` can take outputs: it is a folder (a symbolic
// link to one is followed) that is writable, or it does not exist and its nearest existing ancestor
// is a writable folder (so creating it will succeed). Throws dlo::Error naming the path ("'x'
// exists and is a regular file, not a folder"). Creates nothing.
void check_output_folder(const std::string& dir);

// Creates the folder `dir` and its missing parents. Throws dlo::Error naming the path if a part of
// it is not a folder or it cannot be created.
void make_folders(const std::string& dir);

// Checks that `path` exists and is a regular file, without opening it (a FIFO would block an open).
// Throws dlo::Error ("'path' is a FIFO, not a regular file").
void check_regular_file(const std::string& path);

// The whole of a regular file. Throws dlo::Error naming the path (missing, not a regular file,
// unreadable).
std::string read_file(const std::string& path);

// A file written under a temporary name and renamed into place by commit(); the destructor
// removes the temporary if commit() was not reached, so a crash or an exception never leaves a
// file under the final name that looks finished.
class AtomicFile {
 public:
  // Resolves `path` by the output rule and creates the temporary (O_EXCL). Throws dlo::Error.
  explicit AtomicFile(const std::string& path);
  ~AtomicFile();
  AtomicFile(const AtomicFile&) = delete;
  AtomicFile& operator=(const AtomicFile&) = delete;

  // The final path (symlinks resolved) and the temporary's path. Libraries that open files by
  // name (libav, HDF5) may write to temp_path() between construction and commit(); the temporary
  // exists (empty) from construction on.
  const std::string& path() const { return path_; }
  const std::string& temp_path() const { return temp_; }

  // Appends `n` bytes; all of them are written or dlo::Error is thrown (disk full included).
  void write(const void* data, std::size_t n);
  void write(std::string_view text) { write(text.data(), text.size()); }

  // fsync, close, rename over path(), fsync the folder. Throws dlo::Error (the temporary is then
  // removed by the destructor). Call once.
  void commit();

 private:
  std::string path_, temp_;
  int fd_ = -1;
  bool committed_ = false;
};

// A temporary name in the folder of `final_path`, unique to this process and call
// (".<name>.tmp-<host>-<pid>-<n>"). For outputs that are folders (a PNG sequence).
std::string unique_temp_name(const std::string& final_path);

// Removes the temporaries that writers of `final_path` on this host left when they were killed
// (".<name>.tmp-<host>-<pid>-<n>" whose process no longer runs; files or folders). Temporaries of
// live processes and of other hosts are left alone. Returns how many were removed. Never throws.
int remove_stale_temporaries(const std::string& final_path);

// AtomicFile(path), write(data), commit().
void write_file_atomic(const std::string& path, std::string_view data);

// fsync of a folder (after a rename in it). Throws dlo::Error.
void sync_folder(const std::string& dir);

}  // namespace dlo
