// Parallel HDF5 (C API, MPI-IO driver) for the batch's final latents. See latents_h5.h for the file
// layout and what a killed batch leaves.
//
// The rules of parallel HDF5 1.10 this relies on:
//   * H5Fcreate/H5Fopen/H5Fflush/H5Fclose, H5Dcreate, H5Ldelete, H5Acreate/H5Awrite/H5Adelete and
//     the last H5Dclose/H5Aclose of an object are collective, with the same arguments on every
//     rank: all of them happen in the constructor and the destructor, driven by one plan that rank
//     0 makes and broadcasts, so every rank does the same metadata operations in the same order.
//   * H5Dopen, H5Aopen, H5Aread and H5Dread of an object nobody modifies may be independent, but
//     what they read stays in the rank's metadata cache and (for variable-length strings) in its
//     list of global heap collections, and a later collective operation needs those to be the same
//     on every rank: so every rank inspects an existing file with the same reads in the same order.
//   * H5Dwrite in independent mode (the default transfer) is allowed on any rank at any time once
//     the dataset's storage exists; storage is allocated at creation (H5D_ALLOC_TIME_EARLY,
//     contiguous, no filters), so a write changes raw bytes only, never metadata. Modification
//     times are not tracked (H5Pset_obj_track_times false), so no object header is dirtied by a
//     write either. This is what keeps the file valid on disk when a rank dies after the
//     constructor: the constructor's final H5Fflush has written all metadata and extended the
//     file to its end-of-allocation address.
//   * The default (earliest) file format has superblock version 0 without the "open for writing"
//     flag of the 1.10 format, so a reader (h5py) opens a file whose writer was killed without
//     needing `h5clear`.
//   * Debian's parallel HDF5 is not thread-safe (H5_HAVE_THREADSAFE unset): callers serialise.
#include "dlo/media/latents_h5.h"

#include <hdf5.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <climits>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <sys/stat.h>

#include "dlo/common/error.h"
#include "dlo/mpi/mpi_world.h"
#include "dlo/common/file.h"
#include "dlo/common/sha256.h"

#ifndef H5_HAVE_PARALLEL
#error "dlo_h5 needs a parallel HDF5 build (Debian: libhdf5-openmpi-dev; CMake: HDF5_PREFER_PARALLEL)"
#endif

static_assert(sizeof(hid_t) == sizeof(std::int64_t), "hid_t is stored as int64_t in latents_h5.h");

namespace dlo {
namespace {

// An existing latents file must be a regular HDF5 file: anything else is refused, never replaced.
void check_hdf5_signature(const std::string& resolved) {
  check_regular_file(resolved);
  std::ifstream in(resolved, std::ios::binary);
  char sig[8] = {};
  in.read(sig, 8);
  DLO_CHECK(in && std::memcmp(sig, "\211HDF\r\n\032\n", 8) == 0,
            "exists and is not an HDF5 file; refusing to replace it: choose another file or remove it");
}

constexpr const char* kFlags = "_complete";
constexpr const char* kFingerprint = "fingerprint";
constexpr const char* kVersionAttr = "dlo_latents_version";
constexpr int kVersion = 2;
constexpr const char* kLayout =
    "One float32 dataset per entry (C order) with string attributes, among them 'fingerprint'. "
    "/_complete/NAME (uint8, a scalar) == 1 where the dataset /NAME holds complete data; 0 where it "
    "was never written or its writing was cut off; a dataset without one is incomplete (trust only "
    "datasets whose flag is 1).";
// Data sets of at least this size start at a multiple of it, so ranks writing different entries
// never share a file-system block or stripe (Lustre's default stripe is 1 MiB).
constexpr hsize_t kAlignment = 1 << 20;

// HDF5 prints its error stack to stderr by default; the library prints nothing. Silenced while a
// method runs (the setting is process-wide in a build without thread-safety), restored after.
class QuietHdf5 {
 public:
  QuietHdf5() {
    H5Eget_auto2(H5E_DEFAULT, &func_, &data_);
    H5Eset_auto2(H5E_DEFAULT, nullptr, nullptr);
  }
  ~QuietHdf5() { H5Eset_auto2(H5E_DEFAULT, func_, data_); }
  QuietHdf5(const QuietHdf5&) = delete;
  QuietHdf5& operator=(const QuietHdf5&) = delete;

 private:
  H5E_auto2_t func_ = nullptr;
  void* data_ = nullptr;
};

herr_t collect_error(unsigned, const H5E_error2_t* e, void* out) {
  auto* v = static_cast<std::vector<std::string>*>(out);
  std::string s = e->func_name ? e->func_name : "?";
  if (e->desc && *e->desc) s += std::string(": ") + e->desc;
  v->push_back(s);
  return 0;
}

// The HDF5 error stack of this thread as one line (the API call, then the innermost cause), and
// clears it.
std::string hdf5_error() {
  std::vector<std::string> v;
  H5Ewalk2(H5E_DEFAULT, H5E_WALK_DOWNWARD, collect_error, &v);
  H5Eclear2(H5E_DEFAULT);
  if (v.empty()) return "HDF5 error";
  if (v.size() == 1) return v.front();
  return v.front() + " (" + v.back() + ")";
}

// An HDF5 identifier closed by the matching H5?close.
class Id {
 public:
  Id() = default;
  Id(hid_t id, herr_t (*close)(hid_t)) : id_(id), close_(close) {}
  ~Id() { reset(); }
  Id(Id&& o) noexcept : id_(o.id_), close_(o.close_) { o.id_ = -1; }
  Id& operator=(Id&& o) noexcept {
    if (this != &o) {
      reset();
      id_ = o.id_, close_ = o.close_;
      o.id_ = -1;
    }
    return *this;
  }
  Id(const Id&) = delete;
  Id& operator=(const Id&) = delete;
  hid_t get() const { return id_; }
  bool ok() const { return id_ >= 0; }
  hid_t release() {
    const hid_t id = id_;
    id_ = -1;
    return id;
  }
  void reset() {
    if (id_ >= 0 && close_) close_(id_);
    id_ = -1;
  }

 private:
  hid_t id_ = -1;
  herr_t (*close_)(hid_t) = nullptr;
};

Id checked(hid_t id, herr_t (*close)(hid_t), const std::string& what) {
  DLO_CHECK(id >= 0, what, ": ", hdf5_error());
  return Id(id, close);
}
void check_h5(herr_t rc, const std::string& what) { DLO_CHECK(rc >= 0, what, ": ", hdf5_error()); }

Id string_type() {
  Id t = checked(H5Tcopy(H5T_C_S1), H5Tclose, "H5Tcopy");
  check_h5(H5Tset_size(t.get(), H5T_VARIABLE), "H5Tset_size");
  check_h5(H5Tset_cset(t.get(), H5T_CSET_UTF8), "H5Tset_cset");
  return t;
}

// Link or attribute creation properties that mark names as UTF-8 (h5py decodes them either way;
// other readers look at the flag).
Id utf8_names(hid_t cls) {
  Id p = checked(H5Pcreate(cls), H5Pclose, "H5Pcreate");
  check_h5(H5Pset_char_encoding(p.get(), H5T_CSET_UTF8), "H5Pset_char_encoding");
  return p;
}

// A scalar variable-length UTF-8 string attribute (h5py reads it as str). Collective.
void write_string_attribute(hid_t obj, const std::string& name, const std::string& value) {
  Id type = string_type();
  Id space = checked(H5Screate(H5S_SCALAR), H5Sclose, "H5Screate");
  Id acpl = utf8_names(H5P_ATTRIBUTE_CREATE);
  Id attr = checked(H5Acreate2(obj, name.c_str(), type.get(), space.get(), acpl.get(), H5P_DEFAULT), H5Aclose,
                    "creating attribute '" + name + "'");
  const char* p = value.c_str();
  check_h5(H5Awrite(attr.get(), type.get(), &p), "writing attribute '" + name + "'");
}

// The value of a scalar string attribute; false if it is missing or not a variable-length string.
bool read_string_attribute(hid_t obj, const std::string& name, std::string* out) {
  if (H5Aexists(obj, name.c_str()) <= 0) return H5Eclear2(H5E_DEFAULT), false;
  Id attr(H5Aopen(obj, name.c_str(), H5P_DEFAULT), H5Aclose);
  if (!attr.ok()) return H5Eclear2(H5E_DEFAULT), false;
  Id ftype(H5Aget_type(attr.get()), H5Tclose);
  Id space(H5Aget_space(attr.get()), H5Sclose);
  if (!ftype.ok() || !space.ok() || H5Tget_class(ftype.get()) != H5T_STRING || H5Tis_variable_str(ftype.get()) <= 0 ||
      H5Sget_simple_extent_type(space.get()) != H5S_SCALAR)
    return H5Eclear2(H5E_DEFAULT), false;
  Id type = string_type();
  char* p = nullptr;
  if (H5Aread(attr.get(), type.get(), &p) < 0) return H5Eclear2(H5E_DEFAULT), false;
  *out = p ? p : "";
  if (p) H5free_memory(p);
  return true;
}

herr_t collect_name(hid_t, const char* name, const H5A_info_t*, void* out) {
  static_cast<std::vector<std::string>*>(out)->push_back(name);
  return 0;
}
herr_t collect_link(hid_t, const char* name, const H5L_info_t*, void* out) {
  static_cast<std::vector<std::string>*>(out)->push_back(name);
  return 0;
}

std::string folder_of(const std::string& path) {
  const std::size_t slash = path.rfind('/');
  if (slash == std::string::npos) return ".";
  return slash == 0 ? "/" : path.substr(0, slash);
}

// ---- small collectives, through MpiWorld's bounded ones ----------------------------------------

// Collective: if any rank has an error, every rank throws the error of the lowest such rank.
void agree(const MpiWorld& world, const std::string& my_error) {
  const std::int64_t first = world.allreduce_min(my_error.empty() ? INT_MAX : world.rank(), "latents file");
  if (first == INT_MAX) return;
  std::string msg = world.broadcast_string(my_error, static_cast<int>(first), "latents file");
  if (world.size() > 1 && first != 0) msg += str(" (on rank ", first, ")");
  throw Error(msg, ErrorKind::kInput, /*on_every_rank=*/true);
}

// Runs fn() and returns its dlo::Error message, "" if none.
template <typename Fn>
std::string error_of(Fn&& fn) {
  try {
    fn();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

// ---- entries --------------------------------------------------------------------------------------

std::string validate(const std::vector<LatentsEntry>& entries) {
  if (entries.empty()) return "no entries";
  std::set<std::string> names;
  for (std::size_t i = 0; i < entries.size(); ++i) {
    const LatentsEntry& e = entries[i];
    const std::string where = str("entry ", i, " ('", e.name, "'): ");
    if (e.name.empty()) return str("entry ", i, ": empty name");
    if (e.name.find('/') != std::string::npos) return where + "the name must not contain '/'";
    if (e.name.find('\0') != std::string::npos) return where + "the name must not contain a NUL byte";
    if (e.name == "." || e.name == kFlags) return where + "the name is reserved";
    if (!names.insert(e.name).second) return where + "the name is used by an earlier entry";
    if (e.shape.empty() || e.shape.size() > H5S_MAX_RANK) return where + str("shape has ", e.shape.size(), " dims (1..32)");
    std::int64_t bytes = 4;
    for (std::int64_t d : e.shape) {
      if (d < 1) return where + str("shape dimension ", d, " (must be >= 1)");
      if (d > INT_MAX / bytes) return where + "more than 2^31-1 bytes of data (one MPI-IO call per write)";
      bytes *= d;
    }
    if (e.fingerprint.empty()) return where + "empty fingerprint";
    if (e.fingerprint.find('\0') != std::string::npos) return where + "the fingerprint must not contain a NUL byte";
    std::set<std::string> attrs;
    for (const auto& [k, v] : e.attributes) {
      if (k.empty()) return where + "an attribute has an empty name";
      if (k == kFingerprint) return where + "attribute name 'fingerprint' is reserved (the fingerprint field)";
      if (k.find('\0') != std::string::npos || v.find('\0') != std::string::npos)
        return where + "attribute '" + k + "': names and values must not contain NUL bytes";
      if (!attrs.insert(k).second) return where + "attribute '" + k + "' appears twice";
    }
  }
  return "";
}

// A digest of everything the ranks must agree on.
std::string digest(const std::string& path, const std::vector<LatentsEntry>& entries) {
  Sha256 h;
  auto put = [&](const std::string& s) {
    const std::uint64_t n = s.size();
    h.update(&n, sizeof n);
    h.update(s.data(), s.size());
  };
  put(path);
  for (const LatentsEntry& e : entries) {
    put(e.name);
    put(e.fingerprint);
    const std::uint64_t n = e.shape.size();
    h.update(&n, sizeof n);
    h.update(e.shape.data(), e.shape.size() * sizeof(std::int64_t));
    for (const auto& [k, v] : e.attributes) put(k), put(v);
    put("\x01");
  }
  return h.hex_digest();
}

Id dataset_creation(bool flags) {
  Id dcpl = checked(H5Pcreate(H5P_DATASET_CREATE), H5Pclose, "H5Pcreate");
  check_h5(H5Pset_layout(dcpl.get(), H5D_CONTIGUOUS), "H5Pset_layout");
  check_h5(H5Pset_alloc_time(dcpl.get(), H5D_ALLOC_TIME_EARLY), "H5Pset_alloc_time");
  check_h5(H5Pset_obj_track_times(dcpl.get(), false), "H5Pset_obj_track_times");
  if (flags) {
    const unsigned char zero = 0;
    check_h5(H5Pset_fill_value(dcpl.get(), H5T_NATIVE_UINT8, &zero), "H5Pset_fill_value");
    check_h5(H5Pset_fill_time(dcpl.get(), H5D_FILL_TIME_ALLOC), "H5Pset_fill_time");
  } else {
    // Writing fill values would write every dataset once more at creation; the flags say which
    // data are valid instead.
    check_h5(H5Pset_fill_time(dcpl.get(), H5D_FILL_TIME_NEVER), "H5Pset_fill_time");
  }
  return dcpl;
}

// Whether an existing dataset can keep its data for `e`: float32 little-endian, contiguous and
// allocated, same shape, same fingerprint.
bool reusable(hid_t ds, const LatentsEntry& e) {
  Id type(H5Dget_type(ds), H5Tclose);
  if (!type.ok() || H5Tequal(type.get(), H5T_IEEE_F32LE) <= 0) return false;
  Id space(H5Dget_space(ds), H5Sclose);
  if (!space.ok() || H5Sget_simple_extent_ndims(space.get()) != static_cast<int>(e.shape.size())) return false;
  std::vector<hsize_t> dims(e.shape.size());
  H5Sget_simple_extent_dims(space.get(), dims.data(), nullptr);
  for (std::size_t i = 0; i < dims.size(); ++i)
    if (dims[i] != static_cast<hsize_t>(e.shape[i])) return false;
  Id dcpl(H5Dget_create_plist(ds), H5Pclose);
  if (!dcpl.ok() || H5Pget_layout(dcpl.get()) != H5D_CONTIGUOUS) return false;
  H5D_space_status_t status{};
  if (H5Dget_space_status(ds, &status) < 0 || status != H5D_SPACE_STATUS_ALLOCATED) return false;
  std::string fp;
  return read_string_attribute(ds, kFingerprint, &fp) && fp == e.fingerprint;
}

// The version of a latents file this class wrote (1 or 2); throws for any other file.
int latents_version(hid_t file) {
  int version = 0;
  const bool ours = H5Aexists(file, kVersionAttr) > 0 && [&] {
    Id a(H5Aopen(file, kVersionAttr, H5P_DEFAULT), H5Aclose);
    return a.ok() && H5Aread(a.get(), H5T_NATIVE_INT, &version) >= 0;
  }();
  H5Eclear2(H5E_DEFAULT);
  DLO_CHECK(ours, "an HDF5 file that dlo did not write (no root attribute '", kVersionAttr,
            "'); refusing to change it: choose another file or remove it");
  DLO_CHECK(version == 1 || version == kVersion, "written by a dlo with latents file version ", version,
            " (this one reads 1 and ", kVersion, "); choose another file or remove it");
  return version;
}

// Version 1: the flags of the table /_complete by name (1: complete). A /_complete that does not
// read back as a table counts as all 0.
std::map<std::string, int> read_table_flags(hid_t file) {
  std::map<std::string, int> old_flags;
  if (H5Lexists(file, kFlags, H5P_DEFAULT) > 0) {
    Id ds(H5Dopen2(file, kFlags, H5P_DEFAULT), H5Dclose);
    Id space(ds.ok() ? H5Dget_space(ds.get()) : -1, H5Sclose);
    Id attr(ds.ok() && H5Aexists(ds.get(), "names") > 0 ? H5Aopen(ds.get(), "names", H5P_DEFAULT) : -1, H5Aclose);
    Id aspace(attr.ok() ? H5Aget_space(attr.get()) : -1, H5Sclose);
    if (space.ok() && aspace.ok() && H5Sget_simple_extent_ndims(space.get()) == 1 &&
        H5Sget_simple_extent_ndims(aspace.get()) == 1) {
      hsize_t n = 0, na = 0;
      H5Sget_simple_extent_dims(space.get(), &n, nullptr);
      H5Sget_simple_extent_dims(aspace.get(), &na, nullptr);
      std::vector<unsigned char> flags(n);
      std::vector<char*> names(na, nullptr);
      Id type = string_type();
      if (n == na && n > 0 && H5Dread(ds.get(), H5T_NATIVE_UINT8, H5S_ALL, H5S_ALL, H5P_DEFAULT, flags.data()) >= 0 &&
          H5Aread(attr.get(), type.get(), names.data()) >= 0) {
        for (hsize_t i = 0; i < n; ++i)
          if (names[i]) old_flags[names[i]] = flags[i] == 1;
      }
      for (char* p : names)
        if (p) H5free_memory(p);
    }
  }
  H5Eclear2(H5E_DEFAULT);
  return old_flags;
}

// Version 2: the group /_complete; throws if there is none.
Id open_flag_group(hid_t file) {
  H5O_info_t info{};
  const bool group = H5Lexists(file, kFlags, H5P_DEFAULT) > 0 &&
                     H5Oget_info_by_name2(file, kFlags, &info, H5O_INFO_BASIC, H5P_DEFAULT) >= 0 &&
                     info.type == H5O_TYPE_GROUP;
  H5Eclear2(H5E_DEFAULT);
  DLO_CHECK(group, "has no group /_complete (damaged, e.g. by a batch killed while opening it); remove it to start "
                   "afresh");
  return checked(H5Gopen2(file, kFlags, H5P_DEFAULT), H5Gclose, "opening /_complete");
}

// Version 2: the flag /_complete/<name>: 1 or 0 (any byte but 1); -1 where there is none; -2 where
// what is there is not a flag (a contiguous, allocated uint8 scalar).
int read_flag(hid_t group, const std::string& name) {
  if (H5Lexists(group, name.c_str(), H5P_DEFAULT) <= 0) return H5Eclear2(H5E_DEFAULT), -1;
  int flag = -2;
  H5O_info_t info{};
  if (H5Oget_info_by_name2(group, name.c_str(), &info, H5O_INFO_BASIC, H5P_DEFAULT) >= 0 &&
      info.type == H5O_TYPE_DATASET) {
    Id ds(H5Dopen2(group, name.c_str(), H5P_DEFAULT), H5Dclose);
    Id type(ds.ok() ? H5Dget_type(ds.get()) : -1, H5Tclose);
    Id space(ds.ok() ? H5Dget_space(ds.get()) : -1, H5Sclose);
    Id dcpl(ds.ok() ? H5Dget_create_plist(ds.get()) : -1, H5Pclose);
    H5D_space_status_t status{};
    unsigned char byte = 0;
    if (type.ok() && space.ok() && dcpl.ok() && H5Tequal(type.get(), H5T_STD_U8LE) > 0 &&
        H5Sget_simple_extent_type(space.get()) == H5S_SCALAR && H5Pget_layout(dcpl.get()) == H5D_CONTIGUOUS &&
        H5Dget_space_status(ds.get(), &status) >= 0 && status == H5D_SPACE_STATUS_ALLOCATED &&
        H5Dread(ds.get(), H5T_NATIVE_UINT8, H5S_ALL, H5S_ALL, H5P_DEFAULT, &byte) >= 0)
      flag = byte == 1;
  }
  H5Eclear2(H5E_DEFAULT);
  return flag;
}

// The root group's datasets, /_complete aside, by name.
std::vector<std::string> root_datasets(hid_t file) {
  std::vector<std::string> links, out;
  hsize_t idx = 0;
  check_h5(H5Literate(file, H5_INDEX_NAME, H5_ITER_INC, &idx, collect_link, &links), "listing the root group");
  for (const std::string& n : links) {
    H5O_info_t info{};
    if (n != kFlags && H5Oget_info_by_name2(file, n.c_str(), &info, H5O_INFO_BASIC, H5P_DEFAULT) >= 0 &&
        info.type == H5O_TYPE_DATASET)
      out.push_back(n);
  }
  H5Eclear2(H5E_DEFAULT);
  return out;
}

// The reading of an existing file (the same reads on every rank): what every rank then does.
//   {"version": 0 (a new file) | 1 (converted here) | 2,
//    "entries": [{"do": "keep"|"attrs"|"create"|"replace", "old": [names], "flag": 0|1,
//                 "renew": bool, "drop": bool}],
//    "extras": [{"name": ..., "flag": 0|1}]}
// "renew": the entry's flag is created (with value "flag"; 1 only for kept data of a version-1
// file whose table says so), "drop": an old one is deleted first. "extras": version 1 only, the
// file's other datasets, whose flags move from the table into the group; version 2 leaves them.
nlohmann::json make_plan(hid_t file, const std::vector<LatentsEntry>& entries, bool existing) {
  nlohmann::json plan = {{"version", 0}, {"entries", nlohmann::json::array()}, {"extras", nlohmann::json::array()}};
  const int version = existing ? latents_version(file) : 0;
  plan["version"] = version;
  std::map<std::string, int> table;  // version 1
  Id group;                          // version 2
  if (version == 1) table = read_table_flags(file);
  if (version == 2) group = open_flag_group(file);
  std::set<std::string> wanted;
  for (const LatentsEntry& e : entries) {
    wanted.insert(e.name);
    nlohmann::json step = {{"do", "create"}, {"flag", 0}, {"renew", true}, {"drop", false}};
    const int flag = group.ok() ? read_flag(group.get(), e.name) : -1;
    step["drop"] = flag != -1;
    if (existing && H5Lexists(file, e.name.c_str(), H5P_DEFAULT) > 0) {
      step["do"] = "replace";
      H5O_info_t info{};
      Id ds;
      if (H5Oget_info_by_name2(file, e.name.c_str(), &info, H5O_INFO_BASIC, H5P_DEFAULT) >= 0 &&
          info.type == H5O_TYPE_DATASET)
        ds = Id(H5Dopen2(file, e.name.c_str(), H5P_DEFAULT), H5Dclose);
      if (ds.ok() && reusable(ds.get(), e)) {
        if (version == 1) step["flag"] = table.count(e.name) ? table[e.name] : 0;
        // A kept dataset keeps its flag as it is, unless it has none that reads as one.
        if (flag >= 0) step["flag"] = flag, step["renew"] = false, step["drop"] = false;
        // The other attributes: kept when equal, else all rewritten.
        std::vector<std::string> names;
        H5Aiterate2(ds.get(), H5_INDEX_NAME, H5_ITER_INC, nullptr, collect_name, &names);
        std::map<std::string, std::string> have, want(e.attributes.begin(), e.attributes.end());
        std::vector<std::string> old;
        for (const std::string& n : names) {
          if (n == kFingerprint) continue;
          old.push_back(n);
          std::string v;
          have[n] = read_string_attribute(ds.get(), n, &v) ? v : std::string("\x01(not a string)");
        }
        step["do"] = have == want ? "keep" : "attrs";
        step["old"] = old;
      }
      H5Eclear2(H5E_DEFAULT);
    }
    plan["entries"].push_back(step);
  }
  if (version == 1)
    for (const std::string& n : root_datasets(file))
      if (!wanted.count(n)) plan["extras"].push_back({{"name", n}, {"flag", table.count(n) ? table[n] : 0}});
  return plan;
}

}  // namespace

// ---- LatentsFile ----------------------------------------------------------------------------------

LatentsFile::LatentsFile(const MpiWorld& world, const std::string& path, const std::vector<LatentsEntry>& entries)
    : world_(world), path_(path), entries_(entries) {
  QuietHdf5 quiet;
  const std::string ctx = "latents file '" + path + "'";
  rank_ = world.rank();
  comm_handle_ = world.duplicate_comm("latents file");
  std::string temp;  // rank 0: the temporary a new file is built under
  try {
    std::string err = validate(entries_);
    if (err.empty() && path.empty()) err = "empty path";
    agree(world_, err.empty() ? "" : ctx + ": " + err);
    const std::string mine = digest(path, entries_);
    const std::string root = world_.broadcast_string(mine, 0, "latents file");
    agree(world_, mine == root ? "" : str(ctx, ": rank ", rank_, " was given a different path or entries than rank 0"));

    // Rank 0 decides: open the existing file or create a new one under a temporary name.
    std::string target;  // the path every rank opens
    int existing = 0;
    if (rank_ == 0) {
      err = error_of([&] {
        const std::string resolved = resolve_output_path(path);
        struct stat st {};
        if (::stat(resolved.c_str(), &st) == 0) {
          check_hdf5_signature(resolved);
          existing = 1;
          target = resolved;
        } else {
          check_output_path(resolved);
          temp = unique_temp_name(resolved);
          target = temp;
        }
      });
    }
    agree(world_, err.empty() ? "" : ctx + ": " + err);
    existing = static_cast<int>(world_.allreduce_max(rank_ == 0 ? existing : 0, "latents file"));
    target = world_.broadcast_string(target, 0, "latents file");

    err = error_of([&] {
      Id fapl = checked(H5Pcreate(H5P_FILE_ACCESS), H5Pclose, "H5Pcreate");
      check_h5(H5Pset_fapl_mpio(fapl.get(), MPI_Comm_f2c(comm_handle_), MPI_INFO_NULL), "H5Pset_fapl_mpio");
      check_h5(H5Pset_alignment(fapl.get(), kAlignment, kAlignment), "H5Pset_alignment");
      const hid_t f = existing ? H5Fopen(target.c_str(), H5F_ACC_RDWR, fapl.get())
                               : H5Fcreate(target.c_str(), H5F_ACC_EXCL, H5P_DEFAULT, fapl.get());
      DLO_CHECK(f >= 0, existing ? "cannot open it for writing: " : "cannot create it: ", hdf5_error());
      file_ = f;
    });
    if (!err.empty() && file_ >= 0) {
      // Opened here but not on another rank: closing would wait for that rank forever, so the
      // handle is left open (the process is about to report the error anyway).
      file_ = -1;
    }
    agree(world_, err.empty() ? "" : ctx + ": " + err);

    // Every rank reads the existing file the same way and makes the plan. Not rank 0 alone: the
    // reads fill each rank's metadata cache and HDF5's list of global heap collections with free
    // space, and the collective operations below hang or diverge unless those are the same on
    // every rank (seen: H5Awrite of a string stalled in a broadcast of a heap collection that
    // only rank 0 had read). The plans are compared; rank 0's is followed.
    std::string plan_text;
    err = error_of([&] { plan_text = make_plan(file_, entries_, existing).dump(); });
    agree(world_, err.empty() ? "" : ctx + ": " + err);
    const std::string root_plan = world_.broadcast_string(plan_text, 0, "latents file");
    agree(world_, root_plan == plan_text ? ""
                                        : str(ctx, ": rank ", rank_, " reads the file differently from rank 0 (a file "
                                                   "system without coherent MPI-IO, such as NFS with caching?)"));
    const nlohmann::json plan = nlohmann::json::parse(root_plan);

    // Every rank: the same metadata operations in the same order. An error stops this rank's
    // sequence; the others find out at agree() below (HDF5 itself reports per rank).
    datasets_.assign(entries_.size(), -1);
    flags_.assign(entries_.size(), -1);
    complete_.assign(entries_.size(), 0);
    err = error_of([&] {
      const hid_t f = file_;
      const int version = plan["version"];
      // Flags that go (version 1's table; those of entries whose data are replaced) are deleted
      // on disk before any dataset changes: a batch killed from here on re-renders those entries
      // rather than trusting a flag of replaced data.
      bool dropped = false;
      if (version == 1 && H5Lexists(f, kFlags, H5P_DEFAULT) > 0)
        check_h5(H5Ldelete(f, kFlags, H5P_DEFAULT), "deleting version 1's /_complete"), dropped = true;
      Id group = version == 2 ? checked(H5Gopen2(f, kFlags, H5P_DEFAULT), H5Gclose, "opening /_complete")
                              : checked(H5Gcreate2(f, kFlags, H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT), H5Gclose,
                                        "creating /_complete");
      for (std::size_t i = 0; i < entries_.size(); ++i)
        if (plan["entries"][i]["drop"].get<bool>())
          check_h5(H5Ldelete(group.get(), entries_[i].name.c_str(), H5P_DEFAULT),
                   "deleting the old flag of '" + entries_[i].name + "'"),
              dropped = true;
      if (dropped) check_h5(H5Fflush(f, H5F_SCOPE_GLOBAL), "H5Fflush");
      Id dcpl = dataset_creation(false);
      Id fcpl = dataset_creation(true);
      Id lcpl = utf8_names(H5P_LINK_CREATE);
      Id scalar = checked(H5Screate(H5S_SCALAR), H5Sclose, "H5Screate");
      // A new flag (0, written at creation); `value` 1 is written by rank 0 alone (independent).
      auto new_flag = [&](const std::string& name, int value) {
        Id ds = checked(H5Dcreate2(group.get(), name.c_str(), H5T_STD_U8LE, scalar.get(), lcpl.get(), fcpl.get(),
                                   H5P_DEFAULT),
                        H5Dclose, "creating the flag of '" + name + "'");
        const unsigned char one = 1;
        if (value == 1 && rank_ == 0)
          check_h5(H5Dwrite(ds.get(), H5T_NATIVE_UINT8, H5S_ALL, H5S_ALL, H5P_DEFAULT, &one),
                   "writing the flag of '" + name + "'");
        return ds;
      };
      for (std::size_t i = 0; i < entries_.size(); ++i) {
        const LatentsEntry& e = entries_[i];
        const nlohmann::json& step = plan["entries"][i];
        const std::string what = step["do"];
        const std::string dname = "dataset '" + e.name + "'";
        // The flag before the data: its storage (small) comes before the data's in the file.
        flags_[i] = step["renew"].get<bool>()
                        ? new_flag(e.name, step["flag"].get<int>()).release()
                        : checked(H5Dopen2(group.get(), e.name.c_str(), H5P_DEFAULT), H5Dclose,
                                  "opening the flag of '" + e.name + "'")
                              .release();
        Id ds;
        if (what == "keep" || what == "attrs") {
          ds = checked(H5Dopen2(f, e.name.c_str(), H5P_DEFAULT), H5Dclose, "opening " + dname);
          if (what == "attrs")
            for (const std::string n : step["old"])
              check_h5(H5Adelete(ds.get(), n.c_str()), dname + ": deleting attribute '" + n + "'");
          complete_[i] = step["flag"].get<int>() == 1;
        } else {
          if (what == "replace") check_h5(H5Ldelete(f, e.name.c_str(), H5P_DEFAULT), "deleting the old " + dname);
          std::vector<hsize_t> dims(e.shape.begin(), e.shape.end());
          Id space = checked(H5Screate_simple(static_cast<int>(dims.size()), dims.data(), nullptr), H5Sclose,
                             "H5Screate_simple");
          ds = checked(H5Dcreate2(f, e.name.c_str(), H5T_IEEE_F32LE, space.get(), lcpl.get(), dcpl.get(), H5P_DEFAULT),
                       H5Dclose, "creating " + dname);
          write_string_attribute(ds.get(), kFingerprint, e.fingerprint);
        }
        if (what != "keep")
          for (const auto& [k, v] : e.attributes)
            with_context(dname, [&] { write_string_attribute(ds.get(), k, v); });
        datasets_[i] = ds.release();
      }
      for (const nlohmann::json& x : plan["extras"]) new_flag(x["name"].get<std::string>(), x["flag"].get<int>());
      if (version != kVersion) {
        if (version == 1) {
          check_h5(H5Adelete(f, kVersionAttr), "deleting version 1's version attribute");
          if (H5Aexists(f, "layout") > 0) check_h5(H5Adelete(f, "layout"), "deleting version 1's layout attribute");
        }
        Id a = checked(H5Acreate2(f, kVersionAttr, H5T_STD_I32LE, scalar.get(), H5P_DEFAULT, H5P_DEFAULT), H5Aclose,
                       "creating the version attribute");
        check_h5(H5Awrite(a.get(), H5T_NATIVE_INT, &kVersion), "writing the version attribute");
        write_string_attribute(f, "layout", kLayout);
      }
    });
    agree(world_, err.empty() ? "" : ctx + ": " + err);
    err = error_of([&] { check_h5(H5Fflush(file_, H5F_SCOPE_GLOBAL), "H5Fflush"); });
    agree(world_, err.empty() ? "" : ctx + ": " + err);

    // A new file appears under its final name only now, complete.
    if (rank_ == 0 && !existing) {
      err = error_of([&] {
        const std::string resolved = resolve_output_path(path);
        DLO_CHECK(::rename(temp.c_str(), resolved.c_str()) == 0, "renaming '", temp, "' into place: ",
                  std::strerror(errno));
        temp.clear();
        sync_folder(folder_of(resolved));
      });
    }
    agree(world_, err.empty() ? "" : ctx + ": " + err);
  } catch (...) {
    close_all();
    if (!temp.empty()) ::unlink(temp.c_str());
    throw;
  }
}

void LatentsFile::close_all() noexcept {
  for (std::int64_t& d : datasets_)
    if (d >= 0) H5Dclose(d), d = -1;
  for (std::int64_t& d : flags_)
    if (d >= 0) H5Dclose(d), d = -1;
  if (file_ >= 0) H5Fclose(file_), file_ = -1;
  H5Eclear2(H5E_DEFAULT);
  if (comm_handle_ >= 0) MpiWorld::free_comm(comm_handle_), comm_handle_ = -1;
}

LatentsFile::~LatentsFile() {
  QuietHdf5 quiet;
  close_all();
}

void LatentsFile::write(std::size_t index, const float* data) {
  QuietHdf5 quiet;
  DLO_CHECK(index < entries_.size(), "latents file '", path_, "': entry index ", index, " out of range (",
            entries_.size(), " entries)");
  const LatentsEntry& e = entries_[index];
  const std::string ctx = "latents file '" + path_ + "': writing entry " + std::to_string(index) + " ('" + e.name + "')";
  DLO_CHECK(data != nullptr, ctx, ": no data");
  auto set_flag = [&](unsigned char v) {
    check_h5(H5Dwrite(flags_[index], H5T_NATIVE_UINT8, H5S_ALL, H5S_ALL, H5P_DEFAULT, &v), "writing its flag");
  };
  with_context(ctx, [&] {
    // Flag down (it may be up from an earlier run or another rank), data, flag up: a write cut
    // off at any point leaves the flag down.
    complete_[index] = 0;
    set_flag(0);
    check_h5(H5Dwrite(datasets_[index], H5T_NATIVE_FLOAT, H5S_ALL, H5S_ALL, H5P_DEFAULT, data), "writing its data");
    set_flag(1);
    complete_[index] = 1;
  });
}

bool LatentsFile::complete(std::size_t index) const {
  DLO_CHECK(index < entries_.size(), "latents file '", path_, "': entry index ", index, " out of range (",
            entries_.size(), " entries)");
  return complete_[index] != 0;
}

void LatentsFile::flush() {
  QuietHdf5 quiet;
  const std::string err = H5Fflush(file_, H5F_SCOPE_GLOBAL) < 0 ? "H5Fflush: " + hdf5_error() : "";
  // Every rank's flags, the most complete view of each entry (a flag only ever goes up by a write).
  const std::vector<std::int64_t> mine(complete_.begin(), complete_.end());
  const std::vector<std::int64_t> all = world_.allgather(mine, "latents file flush");
  for (std::size_t r = 0; r < all.size() / std::max<std::size_t>(1, mine.size()); ++r)
    for (std::size_t i = 0; i < mine.size(); ++i)
      complete_[i] = std::max<unsigned char>(complete_[i], static_cast<unsigned char>(all[r * mine.size() + i]));
  agree(world_, err.empty() ? "" : "latents file '" + path_ + "': flushing: " + err);
}

std::map<std::string, SavedLatentsEntry> read_latents_entries(const std::string& path) {
  QuietHdf5 quiet;
  std::map<std::string, SavedLatentsEntry> out;
  with_context("latents file '" + path + "'", [&] {
    const std::string resolved = resolve_output_path(path);
    struct stat st {};
    if (::stat(resolved.c_str(), &st) != 0) return;  // none yet
    check_hdf5_signature(resolved);
    Id file(H5Fopen(resolved.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT), H5Fclose);
    DLO_CHECK(file.ok(), "cannot open it: ", hdf5_error());
    const int version = latents_version(file.get());
    std::map<std::string, int> table;  // version 1
    Id group;                          // version 2
    if (version == 1) table = read_table_flags(file.get());
    if (version == 2) group = open_flag_group(file.get());
    for (const std::string& n : root_datasets(file.get())) {
      Id ds(H5Dopen2(file.get(), n.c_str(), H5P_DEFAULT), H5Dclose);
      SavedLatentsEntry e;
      if (ds.ok()) read_string_attribute(ds.get(), kFingerprint, &e.fingerprint);
      const int flag = group.ok() ? read_flag(group.get(), n) : table.count(n) ? table[n] : 0;
      e.complete = flag == 1 && !e.fingerprint.empty();
      out[n] = e;
    }
    H5Eclear2(H5E_DEFAULT);
  });
  return out;
}

}  // namespace dlo
