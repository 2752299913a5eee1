#include "dlo/io/safetensors_writer.h"

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <memory>
#include <new>
#include <numeric>
#include <set>

#include <nlohmann/json.hpp>

#include "dlo/common/error.h"
#include "dlo/common/file.h"
#include "dlo/io/safetensors.h"

namespace dlo {
namespace fs = std::filesystem;
using ordered_json = nlohmann::ordered_json;

namespace {

void check_specs(const std::vector<TensorSpec>& specs) {
  std::set<std::string_view> names;
  for (const auto& s : specs) {
    DLO_CHECK(!s.name.empty(), "a tensor has an empty name");
    DLO_CHECK(s.name != "__metadata__", "'__metadata__' is reserved and cannot name a tensor");
    DLO_CHECK(names.insert(s.name).second, "tensor '", s.name, "' is given twice");
    for (auto d : s.shape) DLO_CHECK(d >= 0, "tensor '", s.name, "' has a negative dimension");
  }
}

// Writes the tensors `order` (indices into specs) as one file. `buffer` holds the largest tensor.
void write_one(AtomicFile& out, const std::vector<TensorSpec>& specs, std::vector<std::size_t> order,
               const FillFn& fill, const std::map<std::string, std::string>& metadata,
               std::vector<std::byte>& buffer) {
  // Larger elements first (stable), as Python safetensors does, so every tensor starts at an
  // offset aligned to its element size.
  std::stable_sort(order.begin(), order.end(), [&](std::size_t a, std::size_t b) {
    return dtype_size(specs[a].dtype) > dtype_size(specs[b].dtype);
  });
  ordered_json header = ordered_json::object();
  if (!metadata.empty()) header["__metadata__"] = metadata;
  std::uint64_t offset = 0;
  for (std::size_t i : order) {
    const auto& s = specs[i];
    const std::uint64_t n = s.nbytes();
    header[s.name] = {{"dtype", std::string(dtype_name(s.dtype))},
                      {"shape", s.shape},
                      {"data_offsets", {offset, offset + n}}};
    offset += n;
  }
  std::string text = header.dump();
  text.append((8 - text.size() % 8) % 8, ' ');  // data starts 8-byte aligned
  const std::uint64_t len = text.size();
  out.write(&len, 8);
  out.write(text.data(), text.size());
  for (std::size_t i : order) {
    const auto n = static_cast<std::size_t>(specs[i].nbytes());
    if (n == 0) continue;
    fill(i, specs[i], buffer.data());
    out.write(buffer.data(), n);
  }
}

std::vector<std::byte> largest_buffer(const std::vector<TensorSpec>& specs) {
  std::uint64_t largest = 0;
  for (const auto& s : specs) largest = std::max(largest, s.nbytes());
  try {
    return std::vector<std::byte>(static_cast<std::size_t>(largest));
  } catch (const std::bad_alloc&) {
    throw Error(str("out of memory: the writer's buffer for the largest tensor needs ", largest, " bytes"));
  }
}

bool ends_with(const std::string& s, const char* suffix) {
  const std::size_t n = std::strlen(suffix);
  return s.size() >= n && s.compare(s.size() - n, n, suffix) == 0;
}

// Removes the checkpoint files of `dir` that `written` did not write (WriteOptions::replace_folder).
void remove_stale_files(const std::string& dir, const WriteResult& written) {
  std::set<std::string> keep;
  for (const auto& f : written.files) keep.insert(fs::path(f).filename().string());
  if (!written.index_path.empty()) keep.insert(fs::path(written.index_path).filename().string());
  std::error_code ec;
  bool removed = false;
  for (const auto& e : fs::directory_iterator(dir, ec)) {
    const std::string name = e.path().filename().string();
    if (keep.count(name) || !(ends_with(name, ".safetensors") || ends_with(name, ".safetensors.index.json"))) continue;
    std::error_code type_ec;
    if (e.is_directory(type_ec)) continue;
    std::error_code rm;
    fs::remove(e.path(), rm);
    DLO_CHECK(!rm, "removing the stale checkpoint file '", e.path().string(), "': ", rm.message());
    removed = true;
  }
  DLO_CHECK(!ec, "listing '", dir, "': ", ec.message());
  if (removed) sync_folder(dir);
}

}  // namespace

std::uint64_t TensorSpec::nbytes() const {
  std::uint64_t n = dtype_size(dtype);
  for (auto d : shape) {
    DLO_CHECK(d >= 0 && !__builtin_mul_overflow(n, static_cast<std::uint64_t>(d), &n), "tensor '",
              name, "': shape is absurd");
  }
  return n;
}

void write_safetensors_file(const std::string& path, const std::vector<TensorSpec>& specs,
                            const FillFn& fill, const std::map<std::string, std::string>& metadata) {
  check_specs(specs);
  std::vector<std::size_t> order(specs.size());
  std::iota(order.begin(), order.end(), 0);
  auto buffer = largest_buffer(specs);
  AtomicFile out(path);
  write_one(out, specs, order, fill, metadata, buffer);
  out.commit();
}

WriteResult write_safetensors_dir(const std::string& dir, const std::vector<TensorSpec>& specs,
                                  const FillFn& fill, const WriteOptions& options) {
  check_specs(specs);
  DLO_CHECK(!options.base_name.empty() && options.base_name.find('/') == std::string::npos,
            "base name '", options.base_name, "' must be a plain file name");
  make_folders(dir);

  // Split in the given order, the way diffusers/transformers shard a state dict.
  std::vector<std::vector<std::size_t>> shards(1);
  std::uint64_t current = 0;
  WriteResult result;
  for (std::size_t i = 0; i < specs.size(); ++i) {
    const std::uint64_t n = specs[i].nbytes();
    result.total_bytes += n;
    if (options.max_shard_bytes > 0 && !shards.back().empty() &&
        current + n > options.max_shard_bytes) {
      shards.emplace_back();
      current = 0;
    }
    shards.back().push_back(i);
    current += n;
  }

  auto buffer = largest_buffer(specs);
  const std::size_t count = shards.size();
  std::vector<std::unique_ptr<AtomicFile>> pending;
  ordered_json weight_map = ordered_json::object();
  std::map<std::string, std::string> names;  // sorted weight map
  for (std::size_t k = 0; k < count; ++k) {
    char file[512];
    if (count == 1)
      std::snprintf(file, sizeof file, "%s.safetensors", options.base_name.c_str());
    else
      std::snprintf(file, sizeof file, "%s-%05zu-of-%05zu.safetensors", options.base_name.c_str(),
                    k + 1, count);
    const std::string path = (fs::path(dir) / file).string();
    pending.push_back(std::make_unique<AtomicFile>(path));
    write_one(*pending.back(), specs, shards[k], fill, options.metadata, buffer);
    result.files.push_back(path);
    for (std::size_t i : shards[k]) names[specs[i].name] = file;
  }
  std::unique_ptr<AtomicFile> index;
  if (count > 1) {
    result.index_path = (fs::path(dir) / (options.base_name + ".safetensors.index.json")).string();
    for (const auto& [name, file] : names) weight_map[name] = file;
    ordered_json j = {{"metadata", {{"total_size", result.total_bytes}}}, {"weight_map", weight_map}};
    const std::string text = j.dump(2) + "\n";
    index = std::make_unique<AtomicFile>(result.index_path);
    index->write(text.data(), text.size());
  }
  for (auto& p : pending) p->commit();
  if (index) index->commit();
  if (options.replace_folder) remove_stale_files(dir, result);
  return result;
}

void check_writes_elsewhere(const Checkpoint& src, const std::string& dir) {
  std::error_code ec;
  if (fs::exists(dir, ec))
    for (const auto& f : src.files()) {
      const fs::path from = fs::path(f->path()).parent_path().empty() ? fs::path(".") : fs::path(f->path()).parent_path();
      std::error_code eq;
      DLO_CHECK(!fs::equivalent(from, dir, eq), "'", dir, "' holds the source checkpoint ('", f->path(),
                "'): write into another folder");
    }
}

WriteResult copy_checkpoint(const Checkpoint& src, const std::string& dir, WriteOptions options) {
  check_writes_elsewhere(src, dir);
  std::vector<TensorSpec> specs;
  std::vector<const TensorInfo*> infos;
  // File order, so the source is read sequentially.
  for (const auto& f : src.files())
    for (const auto& t : f->header().tensors) {
      specs.push_back({t.name, t.dtype, t.shape});
      infos.push_back(&t);
    }
  auto metadata = src.metadata();
  metadata.erase("total_size");  // an index's own bookkeeping, recomputed by the writer
  for (const auto& [k, v] : options.metadata) metadata[k] = v;
  options.metadata = std::move(metadata);
  return write_safetensors_dir(
      dir, specs,
      [&](std::size_t i, const TensorSpec& spec, std::byte* out) {
        std::memcpy(out, src.data(*infos[i]), spec.nbytes());
      },
      options);
}

}  // namespace dlo
