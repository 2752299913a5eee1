#include "dlo/io/safetensors.h"

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <set>
#include <sstream>

#include <nlohmann/json.hpp>

#include "dlo/common/error.h"
#include "dlo/common/file.h"

namespace dlo {
namespace fs = std::filesystem;
using json = nlohmann::json;

namespace {

constexpr int kMaxJsonDepth = 16;

// Parses JSON text, rejecting duplicate object keys and deep nesting (a safetensors header is
// two levels deep; an index three). Throws dlo::Error on failure.
json parse_json_strict(std::string_view text, const std::string& what) {
  std::vector<std::set<std::string>> keys;  // one set per open object
  auto cb = [&](int depth, json::parse_event_t event, json& parsed) -> bool {
    DLO_CHECK(depth <= kMaxJsonDepth, what, " nests deeper than ", kMaxJsonDepth, " levels");
    switch (event) {
      case json::parse_event_t::object_start: keys.emplace_back(); break;
      case json::parse_event_t::object_end:
        if (!keys.empty()) keys.pop_back();
        break;
      case json::parse_event_t::key: {
        const auto& k = parsed.get_ref<const std::string&>();
        DLO_CHECK(!keys.empty() && keys.back().insert(k).second, what, " has the key '", k,
                  "' twice in one object");
        break;
      }
      default: break;
    }
    return true;
  };
  try {
    return json::parse(text.begin(), text.end(), cb);
  } catch (const json::exception& e) {
    // e.what() is "[json.exception.parse_error.101] parse error at line 1, column 5: ...".
    std::string msg = e.what();
    if (auto p = msg.find("] "); p != std::string::npos) msg = msg.substr(p + 2);
    throw Error(str(what, " is not valid JSON: ", msg));
  }
}

std::uint64_t as_u64(const json& v, const std::string& what) {
  DLO_CHECK(v.is_number_integer() || v.is_number_unsigned(), what, " must be an integer, got ",
            v.dump());
  DLO_CHECK(v.is_number_unsigned(), what, " is negative (", v.dump(), ")");
  return v.get<std::uint64_t>();
}

TensorInfo parse_entry(const std::string& name, const json& v, std::uint64_t data_start,
                       std::uint64_t data_size) {
  const std::string where = str("tensor '", name, "'");
  DLO_CHECK(!name.empty(), "a tensor has an empty name");
  DLO_CHECK(v.is_object(), where, ": entry must be a JSON object, got ", v.type_name());
  auto field = [&](const char* key) -> const json& {
    auto it = v.find(key);
    DLO_CHECK(it != v.end(), where, ": missing '", key, "'");
    return *it;
  };
  TensorInfo t;
  t.name = name;

  const json& dtype = field("dtype");
  DLO_CHECK(dtype.is_string(), where, ": 'dtype' must be a string, got ", dtype.dump());
  auto dt = parse_dtype(dtype.get_ref<const std::string&>());
  DLO_CHECK(dt.has_value(), where, ": unknown dtype ", dtype.dump());
  t.dtype = *dt;

  const json& shape = field("shape");
  DLO_CHECK(shape.is_array(), where, ": 'shape' must be an array, got ", shape.dump());
  DLO_CHECK(shape.size() <= 16, where, ": shape has ", shape.size(), " dimensions (at most 16)");
  std::uint64_t numel = 1;
  bool overflow = false;
  for (const auto& d : shape) {
    std::uint64_t dim = as_u64(d, str(where, ": shape dimension"));
    DLO_CHECK(dim <= static_cast<std::uint64_t>(std::numeric_limits<std::int64_t>::max()), where,
              ": shape dimension ", dim, " is absurd");
    t.shape.push_back(static_cast<std::int64_t>(dim));
    overflow = overflow || __builtin_mul_overflow(numel, dim, &numel);
  }
  std::uint64_t nbytes = 0;
  overflow = overflow || __builtin_mul_overflow(numel, dtype_size(t.dtype), &nbytes);
  DLO_CHECK(!overflow && numel <= static_cast<std::uint64_t>(std::numeric_limits<std::int64_t>::max()),
            where, ": shape ", shape.dump(), " is absurd (element count overflows)");

  const json& offs = field("data_offsets");
  DLO_CHECK(offs.is_array() && offs.size() == 2, where,
            ": 'data_offsets' must be [begin, end], got ", offs.dump());
  const std::uint64_t begin = as_u64(offs[0], str(where, ": data_offsets begin"));
  const std::uint64_t end = as_u64(offs[1], str(where, ": data_offsets end"));
  DLO_CHECK(begin <= end, where, ": data_offsets run backwards (begin ", begin, " > end ", end, ")");
  DLO_CHECK(end <= data_size, where, ": end offset ", end, " beyond the data section (",
            data_size, " bytes; file size ", data_start + data_size, ")");
  DLO_CHECK(end - begin == nbytes, where, ": byte length ", end - begin, " does not match shape ",
            shape.dump(), " x ", dtype_name(t.dtype), " (", nbytes, " bytes)");
  t.offset = data_start + begin;
  t.nbytes = nbytes;
  return t;
}

std::map<std::string, std::string> parse_string_map(const json& v, const std::string& what,
                                                    bool allow_non_strings) {
  DLO_CHECK(v.is_object(), what, " must be a JSON object, got ", v.type_name());
  std::map<std::string, std::string> out;
  for (auto it = v.begin(); it != v.end(); ++it) {
    if (it->is_string()) {
      out[it.key()] = it->get<std::string>();
    } else {
      DLO_CHECK(allow_non_strings, what, ": value of '", it.key(), "' must be a string, got ",
                it->dump());
      out[it.key()] = it->dump();
    }
  }
  return out;
}

bool ends_with(std::string_view s, std::string_view suffix) {
  return s.size() >= suffix.size() && s.substr(s.size() - suffix.size()) == suffix;
}

std::string read_text_file(const std::string& path) { return read_file(path); }  // FIFO-safe

}  // namespace

std::int64_t TensorInfo::numel() const {
  std::int64_t n = 1;
  for (auto d : shape) n *= d;
  return n;
}

SafetensorsHeader parse_safetensors_header(const std::byte* data, std::size_t size,
                                           const std::string& label) {
  return with_context(label, [&] {
    DLO_CHECK(size >= 8, "file is ", size, " bytes, too short for a safetensors header");
    std::uint64_t n = 0;
    std::memcpy(&n, data, 8);  // little-endian u64; all supported hosts are little-endian
    DLO_CHECK(n <= kMaxHeaderBytes, "header length ", n, " exceeds the ", kMaxHeaderBytes,
              "-byte limit");
    DLO_CHECK(n <= size - 8, "header length ", n, " runs beyond the file (", size, " bytes)");
    SafetensorsHeader h;
    h.data_start = 8 + n;
    const std::uint64_t data_size = size - h.data_start;
    std::string_view text(reinterpret_cast<const char*>(data) + 8, n);
    json j = parse_json_strict(text, "header");
    DLO_CHECK(j.is_object(), "header must be a JSON object, got ", j.type_name());
    for (auto it = j.begin(); it != j.end(); ++it) {
      if (it.key() == "__metadata__") {
        h.metadata = parse_string_map(*it, "__metadata__", /*allow_non_strings=*/false);
        continue;
      }
      h.tensors.push_back(parse_entry(it.key(), *it, h.data_start, data_size));
    }
    std::sort(h.tensors.begin(), h.tensors.end(), [](const TensorInfo& a, const TensorInfo& b) {
      return a.offset != b.offset ? a.offset < b.offset : a.nbytes < b.nbytes;
    });
    const TensorInfo* prev = nullptr;  // the non-empty tensor reaching furthest so far
    for (const auto& b : h.tensors) {
      if (b.nbytes == 0) continue;
      if (prev != nullptr)
        DLO_CHECK(prev->offset + prev->nbytes <= b.offset, "tensor '", b.name, "' overlaps tensor '",
                  prev->name, "' (data bytes ", b.offset - h.data_start, "..",
                  b.offset - h.data_start + b.nbytes, " vs ", prev->offset - h.data_start, "..",
                  prev->offset - h.data_start + prev->nbytes, ")");
      prev = &b;
    }
    return h;
  });
}

SafetensorsIndex parse_safetensors_index(std::string_view json_text, const std::string& label) {
  return with_context(label, [&] {
    json j = parse_json_strict(json_text, "index");
    DLO_CHECK(j.is_object(), "index must be a JSON object, got ", j.type_name());
    SafetensorsIndex idx;
    auto wm = j.find("weight_map");
    DLO_CHECK(wm != j.end(), "index has no 'weight_map'");
    idx.weight_map = parse_string_map(*wm, "weight_map", /*allow_non_strings=*/false);
    for (const auto& [name, file] : idx.weight_map) {
      DLO_CHECK(!name.empty(), "weight_map has an empty tensor name");
      DLO_CHECK(!file.empty() && file != "." && file != ".." &&
                    file.find('/') == std::string::npos && file.find('\0') == std::string::npos,
                "weight_map: tensor '", name, "' names shard '", file,
                "', which is not a plain file name");
    }
    if (auto md = j.find("metadata"); md != j.end() && !md->is_null())
      idx.metadata = parse_string_map(*md, "metadata", /*allow_non_strings=*/true);
    return idx;
  });
}

SafetensorsFile::SafetensorsFile(const std::string& path) : map_(MappedFile::open(path)) {
  header_ = parse_safetensors_header(map_->data(), map_->size(), path);
}

std::uint64_t Checkpoint::total_bytes() const {
  std::uint64_t n = 0;
  for (const auto* t : sorted_) n += t->nbytes;
  return n;
}

const TensorInfo* Checkpoint::find(std::string_view name) const {
  auto it = by_name_.find(name);
  return it == by_name_.end() ? nullptr : it->second.first;
}

const TensorInfo& Checkpoint::at(std::string_view name) const {
  const TensorInfo* t = find(name);
  DLO_CHECK(t != nullptr, source_, ": no tensor '", name, "'");
  return *t;
}

const SafetensorsFile& Checkpoint::file_of(const TensorInfo& t) const {
  auto it = by_name_.find(t.name);
  DLO_ASSERT(it != by_name_.end() && it->second.first == &t, "tensor not from this checkpoint");
  return *files_[it->second.second];
}

void Checkpoint::rename_tensors(const std::function<std::string(const std::string&)>& rename) {
  std::map<std::string, std::string> taken;  // new name -> old name
  for (const auto& f : files_)
    for (const auto& t : f->header().tensors) {
      const std::string to = rename(t.name);
      const auto [it, fresh] = taken.emplace(to, t.name);
      DLO_CHECK(fresh, source_, ": tensors '", it->second, "' and '", t.name, "' would both be '", to, "'");
    }
  by_name_.clear();
  for (std::size_t fi = 0; fi < files_.size(); ++fi)
    for (auto& t : files_[fi]->header_.tensors) {
      t.name = rename(t.name);
      by_name_.emplace(t.name, std::make_pair(&t, fi));
    }
  build_lookup();
}

void Checkpoint::add_file(std::unique_ptr<SafetensorsFile> f) {
  const std::size_t fi = files_.size();
  for (const auto& t : f->header().tensors) {
    auto [it, inserted] = by_name_.emplace(t.name, std::make_pair(&t, fi));
    DLO_CHECK(inserted, "tensor '", t.name, "' is in two shards: '",
              files_[it->second.second]->path(), "' and '", f->path(), "'");
  }
  files_.push_back(std::move(f));
}

void Checkpoint::build_lookup() {
  sorted_.clear();
  for (const auto& [name, entry] : by_name_) sorted_.push_back(entry.first);
}

Checkpoint Checkpoint::open(const std::string& path_in) {
  fs::path path(path_in);
  std::error_code ec;
  DLO_CHECK(fs::exists(path, ec), "checkpoint '", path_in, "' does not exist");
  if (fs::is_directory(path, ec)) {
    std::vector<fs::path> indexes, singles;
    for (const auto& e : fs::directory_iterator(path, ec)) {
      const std::string n = e.path().filename().string();
      if (ends_with(n, ".safetensors.index.json")) indexes.push_back(e.path());
      else if (ends_with(n, ".safetensors")) singles.push_back(e.path());
    }
    DLO_CHECK(indexes.size() <= 1, "checkpoint directory '", path_in, "' holds ", indexes.size(),
              " *.safetensors.index.json files; name the one to open");
    if (indexes.size() == 1) return open(indexes[0].string());
    DLO_CHECK(singles.size() == 1, "checkpoint directory '", path_in, "' holds ",
              singles.size(), " .safetensors files and no index; name the one to open");
    return open(singles[0].string());
  }

  Checkpoint ck;
  ck.source_ = path.string();
  if (!ends_with(path.string(), ".json")) {
    ck.add_file(std::make_unique<SafetensorsFile>(path.string()));
    ck.metadata_ = ck.files_[0]->header().metadata;
    ck.build_lookup();
    return ck;
  }

  const SafetensorsIndex idx = parse_safetensors_index(read_text_file(path.string()), path.string());
  ck.metadata_ = idx.metadata;
  const fs::path dir = path.parent_path();
  std::map<std::string, std::vector<std::string>> promised;  // shard -> tensors
  for (const auto& [name, file] : idx.weight_map) promised[file].push_back(name);
  for (const auto& [file, names] : promised) {
    const fs::path shard = dir / file;
    DLO_CHECK(fs::exists(shard, ec), path.string(), ": names shard '", file, "' (for tensor '",
              names.front(), "'), which does not exist");
    ck.add_file(std::make_unique<SafetensorsFile>(shard.string()));
    for (const auto& name : names) {
      const TensorInfo* t = ck.find(name);
      DLO_CHECK(t != nullptr && &ck.file_of(*t) == ck.files_.back().get(), shard.string(),
                ": lacks tensor '", name, "' that the index '", path.string(), "' promises");
    }
  }
  ck.build_lookup();
  return ck;
}

}  // namespace dlo
