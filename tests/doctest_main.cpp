// main() for the doctest binaries whose cases CTest runs one by one (dlo_test in CMakeLists.txt:
// "--test-case=NAME"). A filter that selects no case fails the run: doctest itself passes it, so
// a case whose name CTest cannot carry (a ';' splits a CMake list, and the name arrives cut)
// would otherwise pass without running.
#define DOCTEST_CONFIG_IMPLEMENT
#include <doctest/doctest.h>

#include "common/doctest_listener.h"

#include <atomic>
#include <cstdio>
#include <string>

namespace {

std::atomic<int> g_cases{0};

struct CaseCounter : dlo::test::QuietListener {
  using QuietListener::QuietListener;
  void test_case_start(const doctest::TestCaseData&) override { ++g_cases; }
};
DOCTEST_REGISTER_LISTENER("dlo_case_counter", 1, CaseCounter);

}  // namespace

int main(int argc, char** argv) {
  doctest::Context context(argc, argv);
  const int rc = context.run();
  if (context.shouldExit()) return rc;  // --help, --list-test-cases, ...
  std::string filter;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    for (const char* p : {"--test-case=", "-tc="})
      if (a.rfind(p, 0) == 0) filter = a.substr(std::string(p).size());
  }
  if (!filter.empty() && g_cases == 0) {
    std::fprintf(stderr, "no test case matches --test-case=%s (a name with ';' is cut by CTest: use ',')\n", filter.c_str());
    return rc != 0 ? rc : 1;
  }
  return rc;
}
