// dlo/dist/tool.h: the exit-code mapping every tool's main() inherits, and the messages for
// allocation failures (issue 8, defect 11: out of memory must be an error with a message, not
// SIGABRT). Checked against real failures: libtorch refusing a 4 TiB tensor, std::bad_alloc.
#include "common/doctest_torch.h"  // first: removes c10's glog-style CHECK

#include <sys/wait.h>
#include <unistd.h>

#include <new>
#include <string>
#include <thread>

#include "dlo/common/error.h"
#include "dlo/common/settings.h"
#include "dlo/app/tool.h"

namespace {
bool contains(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }
}  // namespace

TEST_CASE("an allocation libtorch cannot satisfy is named out of memory, without a stack trace") {
  std::string what;
  bool oom = false;
  try {
    at::empty({std::int64_t{1} << 40}, at::kFloat);  // 4 TiB
  } catch (const std::exception& e) {
    oom = dlo::is_allocation_failure(e);
    what = dlo::describe_exception(e);
  }
  CHECK(oom);
  CHECK_MESSAGE(contains(what, "out of memory"), what);
  CHECK_MESSAGE(!contains(what, "Exception raised from"), what);
  CHECK(contains(dlo::describe_exception(std::bad_alloc()), "out of memory"));
  CHECK_FALSE(dlo::is_allocation_failure(dlo::Error("bad flag")));
  CHECK(dlo::describe_exception(dlo::Error("bad flag")) == "bad flag");
}

TEST_CASE("run_tool maps outcomes to the exit codes: 0/returned, 2 for dlo::Error, 1 for anything else") {
  CHECK(dlo::run_tool("t", nullptr, [] { return 0; }) == dlo::kExitOk);
  CHECK(dlo::run_tool("t", nullptr, [] { return 3; }) == dlo::kExitSomeJobsFailed);
  CHECK(dlo::run_tool("t", nullptr, []() -> int { throw dlo::Error("bad input"); }) == dlo::kExitBadInput);
  CHECK(dlo::run_tool("t", nullptr, []() -> int { throw std::bad_alloc(); }) == dlo::kExitFailed);
  CHECK(dlo::run_tool("t", nullptr, []() -> int {
          at::empty({std::int64_t{1} << 40}, at::kFloat);
          return 0;
        }) == dlo::kExitFailed);
  CHECK(dlo::run_tool("t", nullptr, []() -> int { throw std::runtime_error("other"); }) == dlo::kExitFailed);
}

TEST_CASE("an exception escaping a thread ends the process with exit 1 and its message, not SIGABRT") {
  int fds[2];
  REQUIRE(::pipe(fds) == 0);
  const pid_t pid = ::fork();
  REQUIRE(pid >= 0);
  if (pid == 0) {
    ::dup2(fds[1], 2);
    dlo::install_fault_handlers(nullptr);
    std::thread t([] { throw dlo::Error("worker thread failed"); });
    t.join();
    ::_exit(0);  // not reached
  }
  ::close(fds[1]);
  std::string err;
  char buf[512];
  for (ssize_t n; (n = ::read(fds[0], buf, sizeof buf)) > 0;) err.append(buf, static_cast<std::size_t>(n));
  ::close(fds[0]);
  int status = 0;
  REQUIRE(::waitpid(pid, &status, 0) == pid);
  CHECK_FALSE(WIFSIGNALED(status));
  CHECK(WIFEXITED(status));
  CHECK(WEXITSTATUS(status) == dlo::kExitFailed);
  CHECK_MESSAGE(contains(err, "fatal: uncaught exception: worker thread failed"), err);
}
