// The files of the source tree and the build's other tools, found from the test binary's own
// folder (<build>/bin). CMake gives the source tree relative to that folder (DLO_SOURCE_FROM_BIN:
// "../.." for tools/setup.sh's build/), so no absolute path is compiled into a test: a fresh clone
// compiles the same text as every other and ccache serves it (absolute paths made a clean clone
// recompile eight test binaries, about three of the setup's four minutes on 2 cores).
#pragma once

#include <filesystem>
#include <string>

#ifndef DLO_SOURCE_FROM_BIN
#error "DLO_SOURCE_FROM_BIN must give the source tree relative to the test binaries' folder"
#endif

namespace dlo::test {

// The folder of the running binary (the build's bin/), symbolic links resolved.
inline std::filesystem::path bin_dir() { return std::filesystem::read_symlink("/proc/self/exe").parent_path(); }

// The source tree's root, without a trailing '/'.
inline std::string source_dir() {
  std::string s = (bin_dir() / DLO_SOURCE_FROM_BIN).lexically_normal().string();
  if (s.size() > 1 && s.back() == '/') s.pop_back();
  return s;
}

}  // namespace dlo::test
