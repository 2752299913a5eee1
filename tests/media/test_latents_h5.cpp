// dlo/media/latents_h5.h: one HDF5 file written by every rank (parallel HDF5 over MPI-IO), read
// back independently with h5py (Debian's /usr/bin/python3 + python3-h5py, latents_h5_check.py),
// which computes the expected values itself. Run under mpirun at 1, 2 and 3 ranks.
#define DOCTEST_CONFIG_IMPLEMENT
#include <doctest/doctest.h>
#include <mpi.h>

#include <sys/resource.h>

#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>
#include <vector>

#include "dlo/common/error.h"
#include "dlo/media/latents_h5.h"
#include "media/latents_h5_util.h"
#include "common/source_tree.h"

using namespace dlo;
using dlo::test::latents_values;
using dlo::test::SharedDir;
using json = nlohmann::json;

namespace {

// tests/media/latents_h5_check.py: h5py's view of a file.
std::string latents_check() { return dlo::test::source_dir() + "/tests/media/latents_h5_check.py"; }

int rank() {
  int r = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &r);
  return r;
}
int size() {
  int s = 1;
  MPI_Comm_size(MPI_COMM_WORLD, &s);
  return s;
}

std::string bcast(std::string s) {
  int n = static_cast<int>(s.size());
  MPI_Bcast(&n, 1, MPI_INT, 0, MPI_COMM_WORLD);
  s.resize(static_cast<std::size_t>(n));
  MPI_Bcast(s.data(), n, MPI_CHAR, 0, MPI_COMM_WORLD);
  return s;
}

// Runs `cmd` on rank 0; every rank gets its exit status and output.
std::pair<int, std::string> run_on_rank0(const std::string& cmd, const SharedDir& dir) {
  int rc = -1;
  std::string out;
  if (rank() == 0) {
    const std::string log = dir.file("cmd.log");
    rc = std::system((cmd + " > '" + log + "' 2>&1").c_str());
    std::ifstream in(log);
    out.assign(std::istreambuf_iterator<char>(in), {});
    std::filesystem::remove(log);
  }
  MPI_Bcast(&rc, 1, MPI_INT, 0, MPI_COMM_WORLD);
  return {rc, bcast(out)};
}

// What h5py must find for one dataset.
struct Expect {
  const LatentsEntry* entry;
  bool complete;
  int index, gen;  // latents_values(index, gen, shape) when complete
};

// latents_h5_check.py check: 0 when the file holds exactly `datasets`, each with its flag.
void check_with_h5py(const SharedDir& dir, const std::string& path, const std::vector<Expect>& datasets) {
  json e = {{"path", path}, {"datasets", json::object()}};
  for (const Expect& x : datasets) {
    json attrs = json::object();
    for (const auto& [k, v] : x.entry->attributes) attrs[k] = v;
    e["datasets"][x.entry->name] = {{"shape", x.entry->shape}, {"attrs", attrs}, {"fingerprint", x.entry->fingerprint},
                                    {"complete", x.complete}, {"index", x.index}, {"gen", x.gen}};
  }
  const std::string file = dir.file("expect.json");
  if (rank() == 0) std::ofstream(file) << e.dump();
  const auto [rc, out] = run_on_rank0(std::string(DLO_TEST_H5PY_PYTHON) + " '" + latents_check() + "' check '" + file + "'", dir);
  INFO(out);
  CHECK(rc == 0);
  if (rank() == 0) std::filesystem::remove(file);
}

// The files in the folder (rank 0's listing, on every rank).
std::vector<std::string> listing(const SharedDir& dir) {
  std::string all;
  if (rank() == 0)
    for (const auto& p : std::filesystem::directory_iterator(dir.path())) all += p.path().filename().string() + "\n";
  all = bcast(all);
  std::vector<std::string> names;
  for (std::size_t a = 0, b; (b = all.find('\n', a)) != std::string::npos; a = b + 1) names.push_back(all.substr(a, b - a));
  std::sort(names.begin(), names.end());
  return names;
}

// The dlo::Error message of fn() on this rank, and whether every rank got the same one.
std::string error_of(const std::function<void()>& fn, bool* same_on_all = nullptr) {
  std::string msg = "(no error)";
  try {
    fn();
  } catch (const Error& e) {
    msg = e.what();
  }
  if (same_on_all) {
    int same = bcast(msg) == msg;
    MPI_Allreduce(MPI_IN_PLACE, &same, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
    *same_on_all = same != 0;
  }
  return msg;
}

LatentsEntry entry(const std::string& name, std::vector<std::int64_t> shape, const std::string& fp,
                   std::vector<std::pair<std::string, std::string>> attrs) {
  return {name, std::move(shape), std::move(attrs), fp};
}

std::vector<LatentsEntry> batch_entries() {
  const std::vector<std::vector<std::int64_t>> shapes = {{1, 4, 3, 5, 6}, {2, 3}, {1}, {3, 1, 2},
                                                         {1, 16, 2, 3, 4}, {5}, {2, 2, 2, 2}};
  std::vector<LatentsEntry> v;
  for (std::size_t i = 0; i < shapes.size(); ++i) {
    const std::string id = i == 2 ? "clip é 2" : "job-" + std::to_string(i);  // a UTF-8 name, a space
    json params = {{"prompt", "a cat says \"hi\"\nüñí 🐈 " + std::to_string(i)}, {"seed", 1000 + i}, {"steps", 2 + i}};
    v.push_back(entry(id, shapes[i], "f00d" + std::to_string(i),
                      {{"prompt", params["prompt"]}, {"parameters_json", params.dump()}, {"seed", std::to_string(1000 + i)}}));
  }
  return v;
}

// latents_h5_check.py offsets: where h5py finds each dataset's data and flag bytes in the file.
json offsets(const SharedDir& dir, const std::string& path) {
  const auto [rc, out] = run_on_rank0(std::string(DLO_TEST_H5PY_PYTHON) + " '" + latents_check() + "' offsets '" + path + "'", dir);
  INFO(out);
  REQUIRE(rc == 0);
  return json::parse(out);
}

// The bytes of `path` at offsets[name]["data"] and ["flag"] (a region [offset, bytes]).
std::string raw(const std::string& path, const json& region) {
  std::ifstream in(path, std::ios::binary);
  std::string b(region[1].get<std::size_t>(), '\0');
  in.seekg(region[0].get<std::streamoff>());
  in.read(b.data(), static_cast<std::streamsize>(b.size()));
  REQUIRE(in);
  return b;
}
std::string raw_entry(const std::string& path, const json& off, const std::string& name) {
  return raw(path, off[name]["data"]) + raw(path, off[name]["flag"]);
}

// Runs a python one-liner with h5py on rank 0 (a file that dlo did not write).
void h5py(const SharedDir& dir, const std::string& code) {
  const auto [rc, out] = run_on_rank0(std::string(DLO_TEST_H5PY_PYTHON) + " -c \"import h5py, numpy; " + code + "\"", dir);
  INFO(out);
  REQUIRE(rc == 0);
}

}  // namespace

TEST_CASE("ranks write different entries at different times, h5py reads back every value, shape, attribute and flag") {
  SharedDir dir(MPI_COMM_WORLD);
  const std::string path = dir.file("latents.h5");
  const std::vector<LatentsEntry> entries = batch_entries();
  const std::size_t n = entries.size(), never = 5;  // entry 5 is never written
  const int r = rank(), s = size();
  {
    LatentsFile f(dlo::test::world(), path, entries);
    REQUIRE(f.size() == n);
    for (std::size_t i = 0; i < n; ++i) CHECK_FALSE(f.complete(i));
    // Rank r writes entries i % size == r, last first, each after a different pause.
    for (std::size_t k = n; k-- > 0;) {
      if (static_cast<int>(k % s) != r || k == never) continue;
      std::this_thread::sleep_for(std::chrono::milliseconds(15 * ((k * 13) % 7)));
      f.write(k, latents_values(k, 0, entries[k].shape).data());
      CHECK(f.complete(k));
    }
    f.flush();  // afterwards every rank knows every rank's flags
    for (std::size_t i = 0; i < n; ++i) CHECK(f.complete(i) == (i != never));
    // Entry 0 written again by another rank than the first (generation 2): the flag goes down,
    // the data are replaced, the flag goes up.
    if (r == 1 % s) f.write(0, latents_values(0, 2, entries[0].shape).data());
  }
  // Nothing but the file in the folder (the temporary it was built under is gone).
  CHECK(listing(dir) == std::vector<std::string>{"latents.h5"});
  // Read by one process before a batch opens it (resume): each entry's fingerprint and flag; no
  // entries where there is no file; a file that is not HDF5 refused, as the constructor does.
  if (r == 0) {
    const auto saved = read_latents_entries(path);
    CHECK(saved.size() == n);
    for (std::size_t i = 0; i < n; ++i) {
      CAPTURE(i);
      CHECK(saved.at(entries[i].name).fingerprint == entries[i].fingerprint);
      CHECK(saved.at(entries[i].name).complete == (i != never));
    }
    CHECK(read_latents_entries(dir.file("none.h5")).empty());
    std::ofstream(dir.file("text.h5")) << "not HDF5\n";
    CHECK(error_of([&] { read_latents_entries(dir.file("text.h5")); }).find("text.h5': exists and is not an HDF5 file") !=
          std::string::npos);
    std::filesystem::remove(dir.file("text.h5"));
  }
  MPI_Barrier(MPI_COMM_WORLD);
  std::vector<Expect> expect;
  for (std::size_t i = 0; i < n; ++i) expect.push_back({&entries[i], i != never, static_cast<int>(i), i == 0 ? 2 : 0});
  check_with_h5py(dir, path, expect);

  // Reopened with the same entries (a resumed batch): every flag comes back from the file, on
  // every rank, and nothing changes.
  {
    LatentsFile f(dlo::test::world(), path, entries);
    for (std::size_t i = 0; i < n; ++i) CHECK(f.complete(i) == (i != never));
  }
  check_with_h5py(dir, path, expect);
}

TEST_CASE("a reopen with changed entries keeps matching data, replaces changed ones and keeps other datasets") {
  SharedDir dir(MPI_COMM_WORLD);
  const std::string path = dir.file("resume.h5");
  const int r = rank(), s = size();
  auto a_entry = [](int i, std::vector<std::int64_t> shape = {2, 3, 4}, std::string fp = "",
                    std::string prompt = "") {
    return entry("a" + std::to_string(i), std::move(shape), fp.empty() ? "fa" + std::to_string(i) : fp,
                 {{"parameters_json", "{\"i\":" + std::to_string(i) + "}"},
                  {"prompt", prompt.empty() ? "p" + std::to_string(i) : prompt}});
  };
  std::vector<LatentsEntry> a;
  for (int i = 0; i < 6; ++i) a.push_back(a_entry(i));
  {
    LatentsFile f(dlo::test::world(), path, a);
    for (std::size_t i = 0; i < a.size(); ++i)
      if (static_cast<int>(i % s) == r && i != 4) f.write(i, latents_values(i, 0, a[i].shape).data());
  }
  // The second batch: a6 new; a3 same parameters but other attributes (data kept, attributes
  // rewritten); a2 another shape and a1 another fingerprint (both replaced); a0 and a4 (never
  // written) unchanged; a5 left out (stays in the file with its flag). Another order.
  LatentsEntry a3b = a_entry(3, {2, 3, 4}, "", "p3 reworded");
  a3b.attributes.push_back({"extra", "x"});
  const std::vector<LatentsEntry> b = {a_entry(6, {3, 3}), a3b, a_entry(2, {4, 3, 2}), a_entry(1, {2, 3, 4}, "fa1-v2"),
                                       a[0], a[4]};
  const std::vector<bool> kept = {false, true, false, false, true, false};
  {
    LatentsFile f(dlo::test::world(), path, b);
    for (std::size_t i = 0; i < b.size(); ++i) CHECK(f.complete(i) == kept[i]);
    // The missing ones, round robin over the ranks.
    std::size_t k = 0;
    for (std::size_t i = 0; i < b.size(); ++i)
      if (!kept[i] && b[i].name != "a4" && static_cast<int>(k++ % s) == r)
        f.write(i, latents_values(std::stoi(b[i].name.substr(1)), 1, b[i].shape).data());
  }
  check_with_h5py(dir, path,
                  {{&b[0], true, 6, 1}, {&b[1], true, 3, 0}, {&b[2], true, 2, 1}, {&b[3], true, 1, 1},
                   {&b[4], true, 0, 0}, {&b[5], false, 4, 0}, {&a[5], true, 5, 0}});

  // Back to the first batch: a5's flag is as the first batch left it; a6 is now the other one.
  {
    LatentsFile f(dlo::test::world(), path, a);
    const std::vector<bool> want = {true, false, false, true, false, true};
    for (std::size_t i = 0; i < a.size(); ++i) CHECK(f.complete(i) == want[i]);
  }
  check_with_h5py(dir, path,
                  {{&a[0], true, 0, 0}, {&a[1], false, 1, 0}, {&a[2], false, 2, 0}, {&a[3], true, 3, 0},
                   {&a[4], false, 4, 0}, {&a[5], true, 5, 0}, {&b[0], true, 6, 1}});
  CHECK(listing(dir) == std::vector<std::string>{"resume.h5"});
}

TEST_CASE("bad entries, paths and files give the same error on every rank and write nothing") {
  SharedDir dir(MPI_COMM_WORLD);
  const std::string path = dir.file("bad.h5");
  const std::vector<LatentsEntry> good = batch_entries();
  struct Case {
    const char* what;
    std::function<void(std::vector<LatentsEntry>&)> change;
    const char* message;
  };
  const std::vector<Case> cases = {
      {"no entries", [](auto& v) { v.clear(); }, "no entries"},
      {"a '/' in a name", [](auto& v) { v[3].name = "a/b"; }, "entry 3 ('a/b'): the name must not contain '/'"},
      {"an empty name", [](auto& v) { v[1].name = ""; }, "entry 1: empty name"},
      {"the reserved name", [](auto& v) { v[0].name = "_complete"; }, "entry 0 ('_complete'): the name is reserved"},
      {"a duplicate name", [](auto& v) { v[4].name = v[1].name; }, "entry 4 ('job-1'): the name is used by an earlier entry"},
      {"a zero dimension", [](auto& v) { v[2].shape = {1, 0, 3}; }, "shape dimension 0 (must be >= 1)"},
      {"no dimensions", [](auto& v) { v[2].shape = {}; }, "shape has 0 dims"},
      {"too many bytes", [](auto& v) { v[2].shape = {1 << 16, 1 << 15}; }, "more than 2^31-1 bytes"},
      {"an empty fingerprint", [](auto& v) { v[6].fingerprint = ""; }, "entry 6 ('job-6'): empty fingerprint"},
      {"a 'fingerprint' attribute", [](auto& v) { v[6].attributes.push_back({"fingerprint", "x"}); },
       "attribute name 'fingerprint' is reserved"},
      {"a duplicate attribute", [](auto& v) { v[6].attributes.push_back({"seed", "1"}); }, "attribute 'seed' appears twice"},
      {"a NUL in a value", [](auto& v) { v[6].attributes[0].second += std::string(1, '\0'); }, "must not contain NUL bytes"},
  };
  for (const Case& c : cases) {
    CAPTURE(c.what);
    std::vector<LatentsEntry> v = good;
    c.change(v);
    bool same = false;
    const std::string msg = error_of([&] { LatentsFile f(dlo::test::world(), path, v); }, &same);
    CHECK(msg.find("latents file '" + path + "': ") == 0);
    CHECK(msg.find(c.message) != std::string::npos);
    CHECK(same);
  }
  CHECK(listing(dir).empty());

  if (size() > 1) {
    // Rank 1 disagrees about one fingerprint: caught before the file is touched, on every rank.
    std::vector<LatentsEntry> v = good;
    if (rank() == 1) v[2].fingerprint = "other";
    bool same = false;
    const std::string msg = error_of([&] { LatentsFile f(dlo::test::world(), path, v); }, &same);
    CHECK(msg.find("rank 1 was given a different path or entries than rank 0") != std::string::npos);
    CHECK(msg.find(path) != std::string::npos);
    CHECK(same);
    CHECK(listing(dir).empty());
  }

  // Paths: a folder, a missing folder.
  bool same = false;
  std::string msg = error_of([&] { LatentsFile f(dlo::test::world(), dir.path(), good); }, &same);
  CHECK(msg.find("is a directory") != std::string::npos);
  CHECK(same);
  msg = error_of([&] { LatentsFile f(dlo::test::world(), dir.file("no/such/x.h5"), good); }, &same);
  CHECK(msg.find("does not exist") != std::string::npos);
  CHECK(msg.find("no/such/x.h5") != std::string::npos);
  CHECK(same);

  // A file that is not HDF5 is never replaced.
  if (rank() == 0) std::ofstream(path) << "my notes";
  MPI_Barrier(MPI_COMM_WORLD);
  msg = error_of([&] { LatentsFile f(dlo::test::world(), path, good); }, &same);
  CHECK(msg.find("exists and is not an HDF5 file; refusing to replace it") != std::string::npos);
  CHECK(same);
  std::ifstream in(path);
  CHECK(std::string(std::istreambuf_iterator<char>(in), {}) == "my notes");

  // Nor is an HDF5 file that dlo did not write (made here by h5py).
  const std::string other = dir.file("other.h5");
  const auto [rc, out] = run_on_rank0(std::string(DLO_TEST_H5PY_PYTHON) + " -c \"import h5py; h5py.File('" + other +
                                          "', 'w')['job-1'] = [1.0]\"", dir);
  INFO(out);
  REQUIRE(rc == 0);
  msg = error_of([&] { LatentsFile f(dlo::test::world(), other, good); }, &same);
  CHECK(msg.find("an HDF5 file that dlo did not write") != std::string::npos);
  CHECK(msg.find(other) != std::string::npos);
  CHECK(same);

  // Another version, and a version-2 file without its flags' group.
  const std::string v3 = dir.file("v3.h5"), nogroup = dir.file("nogroup.h5");
  h5py(dir, "h5py.File('" + v3 + "', 'w').attrs['dlo_latents_version'] = 3");
  h5py(dir, "h5py.File('" + nogroup + "', 'w').attrs['dlo_latents_version'] = 2");
  msg = error_of([&] { LatentsFile f(dlo::test::world(), v3, good); }, &same);
  CHECK(msg.find("latents file '" + v3 + "': written by a dlo with latents file version 3 (this one reads 1 and 2)") !=
        std::string::npos);
  CHECK(same);
  msg = error_of([&] { LatentsFile f(dlo::test::world(), nogroup, good); }, &same);
  CHECK(msg.find("latents file '" + nogroup + "': has no group /_complete") != std::string::npos);
  CHECK(same);
  if (rank() == 0) {
    CHECK(error_of([&] { read_latents_entries(v3); }).find("latents file version 3") != std::string::npos);
    CHECK(error_of([&] { read_latents_entries(nogroup); }).find("has no group /_complete") != std::string::npos);
  }

  // Index errors.
  std::filesystem::path ok = dir.file("ok.h5");
  LatentsFile f(dlo::test::world(), ok, good);
  const std::vector<float> data(1000, 1.0f);
  msg = error_of([&] { f.write(good.size(), data.data()); });
  CHECK(msg.find("entry index 7 out of range (7 entries)") != std::string::npos);
  CHECK(msg.find(ok.string()) != std::string::npos);
  msg = error_of([&] { f.write(1, nullptr); });
  CHECK(msg.find("writing entry 1 ('job-1'): no data") != std::string::npos);
  msg = error_of([&] { (void)f.complete(99); });
  CHECK(msg.find("out of range") != std::string::npos);
}

// N2: /_complete was one table that every open rebuilt from its own entries, so a writer's flag
// landed in a table that another open had already replaced. Now each flag has its place.
TEST_CASE("two opens with disjoint entries never rewrite each other's flags or data (the table rebuilt from one writer's view)") {
  SharedDir dir(MPI_COMM_WORLD);
  const std::string path = dir.file("shared.h5");
  const int r = rank(), s = size();
  std::vector<LatentsEntry> a, b;
  for (int i = 0; i < 3; ++i) a.push_back(entry("a" + std::to_string(i), {2, 3, i + 1}, "fa" + std::to_string(i), {{"k", "a"}}));
  for (int i = 0; i < 2; ++i) b.push_back(entry("b" + std::to_string(i), {4, i + 2}, "fb" + std::to_string(i), {{"k", "b"}}));
  {
    LatentsFile f(dlo::test::world(), path, a);
    for (std::size_t i = 0; i < 2; ++i)  // a2 is left unwritten
      if (static_cast<int>(i % s) == r) f.write(i, latents_values(i, 0, a[i].shape).data());
  }
  const json before = offsets(dir, path);
  const std::string a01 = r == 0 ? raw_entry(path, before, "a0") + raw_entry(path, before, "a1") : "";
  if (r == 0) CHECK(raw(path, before["a2"]["flag"]) == std::string(1, '\0'));
  {
    LatentsFile g(dlo::test::world(), path, b);
    for (std::size_t i = 0; i < b.size(); ++i) CHECK_FALSE(g.complete(i));
    // Meanwhile a2 is finished by a writer that opened the file before this open did (what the
    // lock now prevents): its data, then its flag, where that open found them.
    if (r == 0) {
      const std::vector<float> v = latents_values(2, 0, a[2].shape);
      std::fstream io(path, std::ios::in | std::ios::out | std::ios::binary);
      io.seekp(before["a2"]["data"][0].get<std::streamoff>());
      io.write(reinterpret_cast<const char*>(v.data()), static_cast<std::streamsize>(v.size() * sizeof(float)));
      io.seekp(before["a2"]["flag"][0].get<std::streamoff>());
      io.put('\1');
      REQUIRE(io.flush());
    }
    MPI_Barrier(MPI_COMM_WORLD);
    for (std::size_t i = 0; i < b.size(); ++i)
      if (static_cast<int>((i + 1) % s) == r) g.write(i, latents_values(10 + i, 1, b[i].shape).data());
  }
  // a0 and a1: the same bytes where they were; a2 complete with what its writer wrote.
  const json after = offsets(dir, path);
  for (const char* n : {"a0", "a1", "a2"}) CHECK(after[n] == before[n]);
  if (r == 0) CHECK(raw_entry(path, after, "a0") + raw_entry(path, after, "a1") == a01);
  check_with_h5py(dir, path,
                  {{&a[0], true, 0, 0}, {&a[1], true, 1, 0}, {&a[2], true, 2, 0}, {&b[0], true, 10, 1}, {&b[1], true, 11, 1}});
  // The first batch again: all of its entries complete; b's bytes untouched.
  const std::string bs = r == 0 ? raw_entry(path, after, "b0") + raw_entry(path, after, "b1") : "";
  {
    LatentsFile f(dlo::test::world(), path, a);
    for (std::size_t i = 0; i < a.size(); ++i) CHECK(f.complete(i));
  }
  const json last = offsets(dir, path);
  CHECK(last == after);
  if (r == 0) CHECK(raw_entry(path, last, "b0") + raw_entry(path, last, "b1") == bs);
}

TEST_CASE("a write cut off by the file system reads as incomplete: a rewrite clears the flag first, a flag follows its data") {
  SharedDir dir(MPI_COMM_WORLD);
  const std::string path = dir.file("cut.h5");
  const int w = size() - 1;  // the rank that writes
  // Over 1 MiB each: their data start at multiples of 1 MiB, after the (small) flags.
  const std::vector<LatentsEntry> entries = {entry("c0", {1, 16, 2, 96, 96}, "fc0", {}),
                                             entry("c1", {1, 16, 2, 96, 96}, "fc1", {})};
  {
    LatentsFile f(dlo::test::world(), path, entries);
    if (rank() == w) f.write(0, latents_values(0, 0, entries[0].shape).data());
  }
  const json off = offsets(dir, path);
  const std::int64_t c0 = off["c0"]["data"][0], c1 = off["c1"]["data"][0];
  REQUIRE(c0 < c1);
  REQUIRE(off["c0"]["flag"][0].get<std::int64_t>() < c0);
  REQUIRE(off["c1"]["flag"][0].get<std::int64_t>() < c0);
  constexpr std::int64_t kCut = 4096;  // bytes of c0's new data that reach the file
  {
    LatentsFile f(dlo::test::world(), path, entries);
    REQUIRE(f.complete(0));
    if (rank() == w) {
      // No write may reach past c0's first kCut bytes (RLIMIT_FSIZE: EFBIG, a short write).
      rlimit old{};
      getrlimit(RLIMIT_FSIZE, &old);
      const rlimit cut{static_cast<rlim_t>(c0 + kCut), old.rlim_max};
      auto* handler = std::signal(SIGXFSZ, SIG_IGN);
      REQUIRE(setrlimit(RLIMIT_FSIZE, &cut) == 0);
      const std::string rewrite = error_of([&] { f.write(0, latents_values(0, 2, entries[0].shape).data()); });
      const std::string first = error_of([&] { f.write(1, latents_values(1, 2, entries[1].shape).data()); });
      REQUIRE(setrlimit(RLIMIT_FSIZE, &old) == 0);
      std::signal(SIGXFSZ, handler);
      CHECK(rewrite.find("writing entry 0 ('c0')") != std::string::npos);
      CHECK(first.find("writing entry 1 ('c1')") != std::string::npos);
      CHECK_FALSE(f.complete(0));
      CHECK_FALSE(f.complete(1));
    }
  }
  // c0 holds new data up to the cut and old data after it: neither entry reads as complete.
  if (rank() == 0) {
    const std::vector<float> v0 = latents_values(0, 0, entries[0].shape), v2 = latents_values(0, 2, entries[0].shape);
    const std::string data = raw(path, off["c0"]["data"]);
    CHECK(data.compare(0, kCut, reinterpret_cast<const char*>(v2.data()), kCut) == 0);
    CHECK(data.compare(kCut, std::string::npos, reinterpret_cast<const char*>(v0.data()) + kCut, data.size() - kCut) == 0);
    const auto saved = read_latents_entries(path);
    CHECK_FALSE(saved.at("c0").complete);
    CHECK_FALSE(saved.at("c1").complete);
  }
  check_with_h5py(dir, path, {{&entries[0], false, 0, 0}, {&entries[1], false, 1, 0}});
  LatentsFile f(dlo::test::world(), path, entries);
  CHECK_FALSE(f.complete(0));
  CHECK_FALSE(f.complete(1));
}

TEST_CASE("a version-1 file (one table of flags) is converted on open: each dataset's flag from the table") {
  SharedDir dir(MPI_COMM_WORLD);
  const std::string path = dir.file("v1.h5");
  auto v_entry = [](const std::string& name, std::vector<std::int64_t> shape, const std::string& fp) {
    return entry(name, std::move(shape), fp, {{"parameters_json", "{\"id\": \"" + name + "\"}"}});
  };
  const std::vector<LatentsEntry> old = {v_entry("v0", {2, 3}, "f0"), v_entry("v1", {4}, "f1"), v_entry("v2", {3}, "f2"),
                                         v_entry("x8", {2}, "f8"), v_entry("x9", {1, 2}, "f9")};
  const std::vector<int> index = {0, 1, 2, 8, 9};
  // Written by h5py as dlo's version 1 wrote it; v1 and x8 cut off (flag 0), x9 not in this batch.
  json spec = {{"path", path}, {"table", json::array({json::array({"v0", 1}), json::array({"v1", 0}),
                                                        json::array({"x9", 1}), json::array({"v2", 1}),
                                                        json::array({"x8", 0})})},
               {"datasets", json::object()}};
  for (std::size_t i = 0; i < old.size(); ++i)
    spec["datasets"][old[i].name] = {{"shape", old[i].shape}, {"attrs", {{"parameters_json", old[i].attributes[0].second}}},
                                     {"fingerprint", old[i].fingerprint}, {"index", index[i]}, {"gen", 0}};
  const std::string spec_file = dir.file("v1.json");
  if (rank() == 0) std::ofstream(spec_file) << spec.dump();
  const auto [rc, out] = run_on_rank0(std::string(DLO_TEST_H5PY_PYTHON) + " '" + latents_check() + "' write-v1 '" + spec_file + "'", dir);
  INFO(out);
  REQUIRE(rc == 0);
  // Resume reads version 1 as it is.
  if (rank() == 0) {
    const auto saved = read_latents_entries(path);
    CHECK(saved.size() == 5);
    for (const char* n : {"v0", "v2", "x9"}) CHECK(saved.at(n).complete);
    for (const char* n : {"v1", "x8"}) CHECK_FALSE(saved.at(n).complete);
    CHECK(saved.at("v2").fingerprint == "f2");
  }
  // This batch: v0 and v1 as they were, v2 of other parameters, v4 new.
  const std::vector<LatentsEntry> now = {old[0], old[1], v_entry("v2", {3}, "f2-new"), v_entry("v4", {2, 2}, "f4")};
  {
    LatentsFile f(dlo::test::world(), path, now);
    const std::vector<bool> want = {true, false, false, false};
    for (std::size_t i = 0; i < now.size(); ++i) CHECK(f.complete(i) == want[i]);
    std::size_t k = 0;
    for (std::size_t i = 1; i < now.size(); ++i)
      if (static_cast<int>(k++ % size()) == rank()) f.write(i, latents_values(i + 20, 1, now[i].shape).data());
  }
  const std::vector<Expect> expect = {{&now[0], true, 0, 0},  {&now[1], true, 21, 1}, {&now[2], true, 22, 1},
                                      {&now[3], true, 23, 1}, {&old[3], false, 8, 0}, {&old[4], true, 9, 0}};
  check_with_h5py(dir, path, expect);
  if (rank() == 0) {
    const auto saved = read_latents_entries(path);
    CHECK(saved.size() == 6);
    for (const char* n : {"v0", "v1", "v2", "v4", "x9"}) CHECK(saved.at(n).complete);
    CHECK_FALSE(saved.at("x8").complete);
    CHECK(saved.at("v2").fingerprint == "f2-new");
  }
  // Converted once: the next open changes nothing.
  const json converted = offsets(dir, path);
  {
    LatentsFile f(dlo::test::world(), path, now);
    for (std::size_t i = 0; i < now.size(); ++i) CHECK(f.complete(i));
  }
  CHECK(offsets(dir, path) == converted);
  check_with_h5py(dir, path, expect);
}

int main(int argc, char** argv) {
  int provided = 0;
  // As dlo's MpiWorld does (the batch's ranks run with MPI_THREAD_MULTIPLE).
  MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided);
  doctest::Context ctx(argc, argv);
  int failed = ctx.run();
  // A failure on any rank fails the test.
  MPI_Allreduce(MPI_IN_PLACE, &failed, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
  MPI_Finalize();
  return failed;
}
