// dlo/common/file.h and settings.h: the output and input rules every tool inherits, checked
// against the file system itself (stat, readlink, directory listings).
#include <doctest/doctest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <functional>
#include <iterator>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "common/test_util.h"
#include "dlo/common/error.h"
#include "dlo/common/file.h"
#include "dlo/common/settings.h"

namespace fs = std::filesystem;
using dlo::test::TempDir;

namespace {

using dlo::test::error_of;

bool contains(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

std::string slurp(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

// Entries of `dir` other than `keep`: temporaries left behind.
std::vector<std::string> others(const fs::path& dir, const std::set<std::string>& keep) {
  std::vector<std::string> out;
  for (const auto& e : fs::directory_iterator(dir))
    if (!keep.count(e.path().filename().string())) out.push_back(e.path().filename().string());
  return out;
}

}  // namespace

TEST_CASE("AtomicFile: the whole file appears at commit, nothing before, no temporary after") {
  TempDir dir;
  const std::string path = dir.file("out.json");
  {
    dlo::AtomicFile f(path);
    f.write(std::string(100000, 'x'));
    CHECK_FALSE(fs::exists(path));          // not visible before commit
    CHECK(fs::exists(f.temp_path()));
    CHECK(fs::path(f.temp_path()).parent_path() == fs::path(path).parent_path());
    f.commit();
  }
  CHECK(slurp(path) == std::string(100000, 'x'));
  CHECK(others(dir.path(), {"out.json"}).empty());
  // An AtomicFile dropped without commit leaves the old file and no temporary.
  {
    dlo::AtomicFile f(path);
    f.write("half");
  }
  CHECK(slurp(path) == std::string(100000, 'x'));
  CHECK(others(dir.path(), {"out.json"}).empty());
}

TEST_CASE("temporary names are unique per call and carry the process id") {
  TempDir dir;
  const std::string a = dlo::unique_temp_name(dir.file("o")), b = dlo::unique_temp_name(dir.file("o"));
  CHECK(a != b);
  CHECK(contains(a, "-" + std::to_string(::getpid()) + "-"));
  // Two open AtomicFiles for one path (two writers) never share a temporary.
  dlo::AtomicFile f1(dir.file("o")), f2(dir.file("o"));
  CHECK(f1.temp_path() != f2.temp_path());
  f1.write("first");
  f2.write("second");
  f1.commit();
  f2.commit();
  CHECK(slurp(dir.file("o")) == "second");
}

TEST_CASE("outputs: devices, FIFOs and folders are refused, and symbolic links are followed") {
  TempDir dir;
  CHECK(contains(error_of([] { dlo::resolve_output_path("/dev/null"); }), "'/dev/null' is a character device"));
  CHECK(contains(error_of([] { dlo::check_output_path("/dev/null"); }), "outputs are written only to regular files"));
  const std::string fifo = dir.file("fifo");
  REQUIRE(::mkfifo(fifo.c_str(), 0600) == 0);
  CHECK(contains(error_of([&] { dlo::AtomicFile f(fifo); }), "is a FIFO"));
  CHECK(contains(error_of([&] { dlo::check_output_path(dir.path().string()); }), "is a directory"));
  CHECK(contains(error_of([&] { dlo::check_output_path(dir.file("missing/out")); }), "does not exist"));

  // A link to a file: the target is replaced, the link stays a link.
  const std::string target = dir.file("target"), link = dir.file("link");
  dlo::test::write_file(target, "old");
  fs::create_symlink("target", link);  // relative
  CHECK(dlo::resolve_output_path(link) == dir.file("target"));
  dlo::write_file_atomic(link, "new");
  CHECK(fs::is_symlink(link));
  CHECK(slurp(target) == "new");
  // A link to a device is refused like the device.
  fs::create_symlink("/dev/null", dir.file("null-link"));
  CHECK(contains(error_of([&] { dlo::check_output_path(dir.file("null-link")); }), "a character device"));
  // A read-only folder: refused before any work (root ignores permissions; skip the check then).
  if (::geteuid() != 0) {
    fs::create_directories(dir.file("ro"));
    fs::permissions(dir.file("ro"), fs::perms::owner_read | fs::perms::owner_exec);
    CHECK(contains(error_of([&] { dlo::check_output_path(dir.file("ro/x")); }), "is not writable"));
  }
}

TEST_CASE("output folders: a file in the way is refused, a missing one under a folder is fine") {
  TempDir dir;
  dlo::test::write_file(dir.file("file"), "x");
  CHECK(contains(error_of([&] { dlo::check_output_folder(dir.file("file")); }), "exists and is a regular file, not a folder"));
  CHECK(contains(error_of([&] { dlo::check_output_folder(dir.file("file/sub")); }), "is a regular file, not a folder"));
  CHECK(contains(error_of([&] { dlo::check_output_folder("/dev/null"); }), "a character device"));
  CHECK(error_of([&] { dlo::check_output_folder(dir.file("new/deeper")); }) == "(no error)");
  CHECK_FALSE(fs::exists(dir.file("new")));  // checks create nothing
  dlo::make_folders(dir.file("new/deeper"));
  CHECK(fs::is_directory(dir.file("new/deeper")));
}

TEST_CASE("inputs: a FIFO is refused at once, without waiting for a writer") {
  TempDir dir;
  const std::string fifo = dir.file("config.json");
  REQUIRE(::mkfifo(fifo.c_str(), 0600) == 0);
  CHECK(contains(error_of([&] { dlo::read_file(fifo); }), "is a FIFO, not a regular file"));
  CHECK(contains(error_of([&] { dlo::check_regular_file(fifo); }), "is a FIFO"));
  CHECK(contains(error_of([&] { dlo::read_file(dir.file("absent")); }), "No such file"));
  CHECK(contains(error_of([&] { dlo::read_file(dir.path().string()); }), "is a directory"));
  // (No timing asserted: a blocking open would hang the test, and CTest's timeout fails it.)
  dlo::test::write_file(dir.file("ok"), std::string("a\0b", 3));
  CHECK(dlo::read_file(dir.file("ok")) == std::string("a\0b", 3));
}

TEST_CASE("settings: durations are parsed strictly, and thread counts are bounded by the cores") {
  CHECK(dlo::parse_seconds_setting(nullptr, "DLO_GATHER_TIMEOUT_S", 600) == 600);
  CHECK(dlo::parse_seconds_setting("30", "DLO_GATHER_TIMEOUT_S", 600) == 30);
  CHECK(dlo::parse_seconds_setting("2.5", "DLO_GATHER_TIMEOUT_S", 600) == 2.5);
  for (const char* bad : {"abc", "", "-1", "0", "5s", " 5", "nan", "inf"}) {
    CAPTURE(bad);
    CHECK(contains(error_of([&] { dlo::parse_seconds_setting(bad, "DLO_GATHER_TIMEOUT_S", 600); }),
                   std::string("DLO_GATHER_TIMEOUT_S='") + bad + "' is not a number of seconds > 0"));
  }
  const int cores = dlo::available_cores();
  REQUIRE(cores >= 1);
  CHECK(cores <= static_cast<int>(std::thread::hardware_concurrency() > 0 ? std::thread::hardware_concurrency() : cores));
  std::string note;
  CHECK(dlo::bound_threads(0, "--threads", &note) == 0);
  CHECK(note.empty());
  CHECK(dlo::bound_threads(1, "--threads", &note) == 1);
  CHECK(dlo::bound_threads(100000, "--threads", &note) == cores);
  CHECK(contains(note, "--threads 100000 exceeds the " + std::to_string(cores) + " core(s)"));
  CHECK(contains(error_of([&] { dlo::bound_threads(-1, "--threads", &note); }), "--threads must be >= 0"));
}
