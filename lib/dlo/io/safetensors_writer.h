// Writes safetensors checkpoints by streaming one tensor at a time.
//
// Memory is bounded by the largest tensor, not the file: the writer owns one buffer of that size,
// asks the caller to fill it for each tensor in turn, and writes it out. Files are written under
// a temporary name and renamed into place only when complete, so a crash never leaves a file that
// looks valid. Output loads in Python `safetensors` and in dlo::Checkpoint.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "dlo/io/dtype.h"
#include "dlo/io/tensor_spec.h"

namespace dlo {

// Called once per tensor, in the order the data is laid out on disk, with a buffer of exactly
// spec.nbytes() bytes to fill. `index` is the tensor's position in the `specs` vector.
using FillFn = std::function<void(std::size_t index, const TensorSpec& spec, std::byte* out)>;

struct WriteOptions {
  // 0: everything in one file "<base_name>.safetensors". Otherwise tensors are split, in the
  // order given, into shards of at most this many bytes (a larger tensor gets a shard of its own),
  // written as "<base_name>-0000K-of-0000N.safetensors" with "<base_name>.safetensors.index.json"
  // (the diffusers/transformers layout). A split that yields one shard writes the single file.
  std::uint64_t max_shard_bytes = 0;
  std::string base_name = "model";
  // "__metadata__" of every file written (e.g. {"format": "pt"}).
  std::map<std::string, std::string> metadata;
  // A checkpoint write replaces the previous checkpoint in its folder completely: once every new
  // file is in place, every other "*.safetensors" and "*.safetensors.index.json" in the folder is
  // removed (a stale index would otherwise win when the folder is opened, or a second single file
  // make it ambiguous). Until then the old files stay, so a failed write leaves the old checkpoint.
  // false: leave other files alone (several checkpoints in one folder, opened by file name).
  bool replace_folder = true;
};

struct WriteResult {
  std::vector<std::string> files;  // shard paths in order
  std::string index_path;          // empty when a single file was written
  std::uint64_t total_bytes = 0;   // tensor data bytes
};

// Writes `specs` into directory `dir` (created if missing; see WriteOptions::replace_folder for what
// happens to other checkpoint files in it). Tensor names must be unique and non-empty. Throws dlo::Error on bad specs or I/O failure (removing its temporary files);
// exceptions from `fill` propagate after the same cleanup.
WriteResult write_safetensors_dir(const std::string& dir, const std::vector<TensorSpec>& specs,
                                  const FillFn& fill, const WriteOptions& options);

// Writes `specs` into the single file `path`.
void write_safetensors_file(const std::string& path, const std::vector<TensorSpec>& specs,
                            const FillFn& fill, const std::map<std::string, std::string>& metadata);

class Checkpoint;
// Throws dlo::Error if `dir` is a folder `src`'s files are in: a checkpoint written there would
// replace (and then remove) what it reads.
void check_writes_elsewhere(const Checkpoint& src, const std::string& dir);

// Copies every tensor of `src` (byte for byte, keeping its metadata) into `dir`, resharded by
// `options` (options.metadata is merged over the source's). Streams through the source mapping.
// Throws dlo::Error if `dir` is a folder the source's files are in (a write there would replace
// what it is reading).
WriteResult copy_checkpoint(const Checkpoint& src, const std::string& dir, WriteOptions options);

// Default shard size of diffusers' save_pretrained ("10GB").
inline constexpr std::uint64_t kDiffusersShardBytes = 10'000'000'000ull;

}  // namespace dlo
