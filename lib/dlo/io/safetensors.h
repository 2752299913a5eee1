// Safetensors checkpoints read in place: a single file, or shards listed by an index.
//
// Nothing here copies tensor data. Files are mmap'ed read-only and shared, so N processes that
// open the same checkpoint share one copy in the page cache. Every header and index is validated
// before any tensor is handed out: a malformed file throws dlo::Error naming the file and tensor,
// and never makes the process read outside the mapping.
//
// Torch-free: tensor views as at::Tensor live in dlo/io/tensor_view.h.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "dlo/io/dtype.h"
#include "dlo/io/mapped_file.h"

namespace dlo {

struct TensorInfo {
  std::string name;
  DType dtype = DType::F32;
  std::vector<std::int64_t> shape;
  std::uint64_t offset = 0;  // absolute byte offset in the file
  std::uint64_t nbytes = 0;  // == numel() * dtype_size(dtype)

  std::int64_t numel() const;
};

// The parsed header of one safetensors file.
struct SafetensorsHeader {
  std::vector<TensorInfo> tensors;              // in file order (by offset)
  std::map<std::string, std::string> metadata;  // "__metadata__", empty if absent
  std::uint64_t data_start = 0;                 // 8 + header length
};

// Largest header length accepted (the safetensors reference limit).
inline constexpr std::uint64_t kMaxHeaderBytes = 100ull << 20;

// Parses and validates the header of a safetensors file whose first `size` bytes are at `data`
// (the whole file). `label` names the file in errors. Throws dlo::Error on any malformed input;
// never reads outside [data, data+size).
SafetensorsHeader parse_safetensors_header(const std::byte* data, std::size_t size,
                                           const std::string& label);

// A parsed `*.safetensors.index.json`.
struct SafetensorsIndex {
  std::map<std::string, std::string> weight_map;  // tensor name -> shard file name
  std::map<std::string, std::string> metadata;    // "metadata" values, as JSON text for non-strings
};

// Parses and validates an index. Shard names must be plain file names (no directories).
SafetensorsIndex parse_safetensors_index(std::string_view json_text, const std::string& label);

// One mapped safetensors file with its validated header.
class SafetensorsFile {
 public:
  // Maps and validates `path`. Throws dlo::Error naming the file.
  explicit SafetensorsFile(const std::string& path);

  const std::string& path() const { return map_->path(); }
  const SafetensorsHeader& header() const { return header_; }
  const std::shared_ptr<const MappedFile>& mapping() const { return map_; }
  const std::byte* data(const TensorInfo& t) const { return map_->data() + t.offset; }

 private:
  friend class Checkpoint;  // rename_tensors
  std::shared_ptr<const MappedFile> map_;
  SafetensorsHeader header_;
};

// A checkpoint: one safetensors file, or the shards named by an index. Immutable once shared
// (rename_tensors, the one mutation, comes before);
// safe to read from several threads.
class Checkpoint {
 public:
  // `path` is a .safetensors file, a *.safetensors.index.json, or a directory holding exactly one
  // index or (if none) exactly one .safetensors file. Validates every shard against the index.
  // Throws dlo::Error naming the file (and tensor) on any problem.
  static Checkpoint open(const std::string& path);

  // All tensors, sorted by name.
  const std::vector<const TensorInfo*>& tensors() const { return sorted_; }
  // The tensor named `name`, or nullptr.
  const TensorInfo* find(std::string_view name) const;
  // Like find(), but throws dlo::Error naming the checkpoint if absent.
  const TensorInfo& at(std::string_view name) const;
  // The file holding tensor `t` (which must come from this checkpoint).
  const SafetensorsFile& file_of(const TensorInfo& t) const;
  const std::byte* data(const TensorInfo& t) const { return file_of(t).data(t); }

  const std::vector<std::unique_ptr<SafetensorsFile>>& files() const { return files_; }
  // Metadata of the single file, or the index's "metadata" for a sharded checkpoint.
  const std::map<std::string, std::string>& metadata() const { return metadata_; }
  // What was opened: the file or the index path.
  const std::string& source() const { return source_; }
  std::uint64_t total_bytes() const;

  // Gives every tensor the name `rename(name)` (a layout's names read as another's: the tensors'
  // bytes stay where they are mapped). Throws dlo::Error naming the checkpoint when two tensors
  // would get one name. Not thread-safe: call before the checkpoint is shared.
  void rename_tensors(const std::function<std::string(const std::string&)>& rename);

  Checkpoint(Checkpoint&&) noexcept = default;
  Checkpoint& operator=(Checkpoint&&) noexcept = default;

 private:
  Checkpoint() = default;
  void add_file(std::unique_ptr<SafetensorsFile> f);
  void build_lookup();

  std::string source_;
  std::vector<std::unique_ptr<SafetensorsFile>> files_;
  std::map<std::string, std::string> metadata_;
  std::map<std::string, std::pair<const TensorInfo*, std::size_t>, std::less<>> by_name_;
  std::vector<const TensorInfo*> sorted_;
};

}  // namespace dlo
