// dlo/dist/nccl_comm: the rules around a non-blocking NCCL communicator, driven by a scripted fake
// of NCCL's calls and a fake clock (no GPU, no NCCL). The reference is NCCL 2.28.9's contract
// (nccl.h and src/init.cc, src/group.cc, src/enqueue.cc): a call that returned ncclInProgress is
// complete only once ncclCommGetAsyncError reports ncclSuccess; any other state is an error;
// destroy only after finalize has completed; abort on every failure.
#include <doctest/doctest.h>

#include <atomic>
#include <chrono>
#include <deque>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "common/test_util.h"
#include "dlo/common/error.h"
#include "dlo/dist/nccl_comm.h"

using dlo::NcclComm;
using dlo::NcclCommOps;
using dlo::NcclResult;
using dlo::NcclWait;
using R = NcclResult;

namespace {

bool contains(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

// A communicator whose ncclCommGetAsyncError answers from a script; when the script runs out it
// keeps answering `rest`. Counts every call. Thread-safe where the tests need it (the counters).
struct FakeOps final : NcclCommOps {
  struct Log {
    std::atomic<int> polls{0}, finalizes{0}, destroys{0}, aborts{0};
    std::mutex mu;
    std::deque<R> script;  // states ncclCommGetAsyncError reports, in order
    R rest = R::kSuccess;
    R poll_result = R::kSuccess;  // the call's own result
    R finalize_result = R::kInProgress;
    R destroy_result = R::kSuccess;
    std::string last = "";
  };
  explicit FakeOps(Log& l) : log(l) {}
  R get_async_error(R* state) override {
    ++log.polls;
    std::lock_guard<std::mutex> lock(log.mu);
    if (log.script.empty()) {
      *state = log.rest;
    } else {
      *state = log.script.front();
      log.script.pop_front();
    }
    return log.poll_result;
  }
  R finalize() override {
    ++log.finalizes;
    return log.finalize_result;
  }
  R destroy() override {
    ++log.destroys;
    return log.destroy_result;
  }
  R abort() override {
    ++log.aborts;
    return R::kSuccess;
  }
  std::string error_string(R r) override {
    switch (r) {
      case R::kRemoteError: return "remote process exited or there was a network error";
      case R::kInvalidUsage: return "invalid usage (run with NCCL_DEBUG=WARN for details)";
      case R::kInvalidArgument: return "invalid argument (run with NCCL_DEBUG=WARN for details)";
      case R::kSystemError: return "unhandled system error";
      default: return "error " + std::to_string(static_cast<int>(r));
    }
  }
  std::string last_error() override { return log.last; }
  Log& log;
};

// Time advances 1 ms per pause and never otherwise.
struct FakeClock final : dlo::NcclWaitClock {
  double t = 1000;
  long pauses = 0;
  double now_s() override { return t; }
  void pause(long) override {
    ++pauses;
    t += 0.001;
  }
};

// A clock that also lets other threads run (for the tests with a second thread).
struct YieldingClock final : dlo::NcclWaitClock {
  std::atomic<double> t{0};
  double now_s() override { return t.load(); }
  void pause(long) override {
    t = t.load() + 0.001;
    std::this_thread::sleep_for(std::chrono::microseconds(50));
  }
};

struct Rig {
  FakeOps::Log log;
  FakeClock clock;
  std::vector<std::string> lines;
  std::unique_ptr<NcclComm> comm;
  explicit Rig(double timeout_s = 60, dlo::NcclWaitClock* clk = nullptr) {
    comm = std::make_unique<NcclComm>(
        std::make_unique<FakeOps>(log), timeout_s, "rank 1 of 2, cuda:0",
        [this](const std::string& l) { lines.push_back(l); }, clk != nullptr ? *clk : clock);
  }
  void script(std::initializer_list<R> states) { log.script.assign(states.begin(), states.end()); }
};

using dlo::test::error_of;

}  // namespace

TEST_CASE("wait_nccl_call: ncclInProgress is not completion, it polls until the state is ncclSuccess") {
  FakeOps::Log log;
  FakeOps ops(log);
  FakeClock clock;
  log.script = {R::kInProgress, R::kInProgress, R::kInProgress, R::kInProgress, R::kInProgress, R::kSuccess};
  log.rest = R::kRemoteError;  // a poll past the script would see an error
  const NcclWait w = dlo::wait_nccl_call(R::kInProgress, ops, 60, clock);
  CHECK(w.kind == NcclWait::kDone);
  CHECK(w.polls == 6);
  CHECK(log.polls == 6);
  CHECK(log.script.empty());
  CHECK(clock.pauses == 5);  // a pause between polls, none after the last
}

TEST_CASE("wait_nccl_call: a call that returned ncclSuccess is complete without a poll, any other result is a failure") {
  FakeOps::Log log;
  FakeOps ops(log);
  FakeClock clock;
  CHECK(dlo::wait_nccl_call(R::kSuccess, ops, 60, clock).kind == NcclWait::kDone);
  CHECK(log.polls == 0);
  const NcclWait w = dlo::wait_nccl_call(R::kInvalidArgument, ops, 60, clock);
  CHECK(w.kind == NcclWait::kFailed);
  CHECK(w.result == R::kInvalidArgument);
  CHECK(log.polls == 0);
}

TEST_CASE("wait_nccl_call: an asynchronous error after ncclInProgress, and a failing ncclCommGetAsyncError, are failures") {
  FakeOps::Log log;
  FakeOps ops(log);
  FakeClock clock;
  log.script = {R::kInProgress, R::kInProgress, R::kRemoteError};
  NcclWait w = dlo::wait_nccl_call(R::kInProgress, ops, 60, clock);
  CHECK(w.kind == NcclWait::kFailed);
  CHECK(w.result == R::kRemoteError);
  CHECK(w.polls == 3);
  log.script = {R::kInProgress};
  log.poll_result = R::kInvalidArgument;
  w = dlo::wait_nccl_call(R::kInProgress, ops, 60, clock);
  CHECK(w.kind == NcclWait::kFailed);
  CHECK(w.result == R::kInvalidArgument);
}

TEST_CASE("wait_nccl_call: a state that never leaves ncclInProgress times out after timeout_s, not before") {
  FakeOps::Log log;
  FakeOps ops(log);
  FakeClock clock;
  log.rest = R::kInProgress;
  const double t0 = clock.t;
  const NcclWait w = dlo::wait_nccl_call(R::kInProgress, ops, 2.5, clock);
  CHECK(w.kind == NcclWait::kTimedOut);
  CHECK(clock.t - t0 >= 2.5);
  CHECK(clock.t - t0 < 2.5 + 0.0015);
  CHECK(w.polls == clock.pauses + 1);
}

TEST_CASE("wait_nccl_call: a stop request ends the wait at the next poll") {
  FakeOps::Log log;
  FakeOps ops(log);
  FakeClock clock;
  log.rest = R::kInProgress;
  std::atomic<bool> stop{true};
  const NcclWait w = dlo::wait_nccl_call(R::kInProgress, ops, 60, clock, &stop);
  CHECK(w.kind == NcclWait::kStopped);
  CHECK(log.polls == 0);
}

TEST_CASE("NcclComm::call returns only once the call is complete, and the next call goes ahead") {
  Rig rig;
  rig.comm->complete_init(R::kSuccess);
  int calls = 0;
  for (int i = 0; i < 3; ++i) {
    rig.script({R::kInProgress, R::kInProgress, R::kSuccess});
    rig.log.rest = R::kInvalidArgument;  // what ncclCommEnsureReady says to a call made too early
    rig.comm->call("AllGather of 10-byte shards", [&] {
      ++calls;
      return R::kInProgress;
    });
    CHECK(rig.log.script.empty());  // it waited for ncclSuccess
  }
  CHECK(calls == 3);
  CHECK(rig.log.polls == 9);
  CHECK(rig.log.aborts == 0);
  CHECK(rig.comm->usable());
}

TEST_CASE("NcclComm::call: an asynchronous error aborts the communicator once and names the operation, the error and NCCL's last warning") {
  Rig rig;
  rig.comm->complete_init(R::kSuccess);
  rig.script({R::kInProgress, R::kRemoteError});
  rig.log.last = "NET/Socket : peer 127.0.0.1<40000> closed the connection";
  const std::string what = error_of([&] { rig.comm->call("AllGather of 1234-byte shards", [] { return R::kInProgress; }); });
  CAPTURE(what);
  CHECK(contains(what, "AllGather of 1234-byte shards"));
  CHECK(contains(what, "rank 1 of 2, cuda:0"));
  CHECK(contains(what, "remote process exited or there was a network error"));
  CHECK(contains(what, "peer 127.0.0.1<40000> closed the connection"));
  CHECK(contains(what, "aborted"));
  CHECK(rig.log.aborts == 1);
  CHECK_FALSE(rig.comm->usable());

  // Later calls do not touch the dead communicator.
  bool ran = false;
  const std::string again = error_of([&] {
    rig.comm->call("AllGather of 8-byte shards", [&] {
      ran = true;
      return R::kSuccess;
    });
  });
  CHECK_FALSE(ran);
  CHECK(contains(again, "AllGather of 8-byte shards"));
  CHECK(contains(again, "aborted"));
  CHECK(contains(again, "AllGather of 1234-byte shards"));  // the first failure, kept as the reason
  CHECK_THROWS_AS(rig.comm->check_async_error(), dlo::Error);
  rig.comm->close();  // nothing more on an aborted communicator
  CHECK(rig.log.finalizes == 0);
  CHECK(rig.log.destroys == 0);
  CHECK(rig.log.aborts == 1);
}

TEST_CASE("NcclComm::call: a call that fails at once aborts too") {
  Rig rig;
  rig.comm->complete_init(R::kSuccess);
  const std::string what = error_of([&] { rig.comm->call("AllGather of 3-byte shards", [] { return R::kInvalidArgument; }); });
  CHECK(contains(what, "AllGather of 3-byte shards"));
  CHECK(contains(what, "invalid argument"));
  CHECK(rig.log.aborts == 1);
  CHECK(rig.log.polls == 0);
}

TEST_CASE("NcclComm::call: never finishing times out, names the operation and the timeout, aborts exactly once") {
  Rig rig(7);
  rig.comm->complete_init(R::kSuccess);
  rig.log.rest = R::kInProgress;
  const std::string what = error_of([&] { rig.comm->call("AllGather of 99-byte shards", [] { return R::kInProgress; }); });
  CAPTURE(what);
  CHECK(contains(what, "AllGather of 99-byte shards"));
  CHECK(contains(what, "within 7 s"));
  CHECK(contains(what, "DLO_GATHER_TIMEOUT_S"));
  CHECK(rig.log.aborts == 1);
  rig.comm->abort();  // idempotent
  rig.comm->close();
  CHECK(rig.log.aborts == 1);
  CHECK(rig.log.finalizes == 0);
}

TEST_CASE("NcclComm::complete_init: a failed or unfinished set-up aborts the communicator (no init thread left) and says why") {
  SUBCASE("an error after ncclInProgress: two ranks on one GPU") {
    Rig rig;
    rig.script({R::kInProgress, R::kInvalidUsage});
    rig.log.last = "Duplicate GPU detected : rank 0 and rank 1 both on CUDA device 1a000";
    const std::string what = error_of([&] { rig.comm->complete_init(R::kInProgress); });
    CHECK(contains(what, "communicator set-up"));
    CHECK(contains(what, "Duplicate GPU detected"));
    CHECK(rig.log.aborts == 1);
  }
  SUBCASE("a rank that never arrives") {
    Rig rig(30);
    rig.log.rest = R::kInProgress;
    const std::string what = error_of([&] { rig.comm->complete_init(R::kInProgress); });
    CHECK(contains(what, "communicator set-up"));
    CHECK(contains(what, "within 30 s"));
    CHECK(rig.log.aborts == 1);
  }
  SUBCASE("set-up that completes") {
    Rig rig;
    rig.script({R::kInProgress, R::kInProgress, R::kSuccess});
    rig.comm->complete_init(R::kInProgress);
    CHECK(rig.log.script.empty());
    CHECK(rig.log.aborts == 0);
    CHECK(rig.comm->usable());
  }
}

TEST_CASE("NcclComm::close: finalize, wait for ncclSuccess, then destroy, silent when all goes well") {
  Rig rig;
  rig.comm->complete_init(R::kSuccess);
  rig.script({R::kInProgress, R::kInProgress, R::kInProgress, R::kSuccess});
  rig.log.rest = R::kInvalidArgument;  // a destroy before finalize completed would be refused
  rig.comm->close();
  CHECK(rig.log.finalizes == 1);
  CHECK(rig.log.script.empty());
  CHECK(rig.log.destroys == 1);
  CHECK(rig.log.aborts == 0);
  CHECK(rig.lines.empty());
  rig.comm->close();  // once only
  rig.comm.reset();   // the destructor closes too: still once
  CHECK(rig.log.finalizes == 1);
  CHECK(rig.log.destroys == 1);
}

TEST_CASE("NcclComm::close: finalize that never completes or fails ends in an abort, one line, no throw") {
  SUBCASE("timeout") {
    Rig rig(5);
    rig.comm->complete_init(R::kSuccess);
    rig.log.rest = R::kInProgress;
    rig.comm.reset();  // the destructor
    CHECK(rig.log.finalizes == 1);
    CHECK(rig.log.destroys == 0);
    CHECK(rig.log.aborts == 1);
    REQUIRE(rig.lines.size() == 1);
    CHECK(contains(rig.lines[0], "rank 1 of 2"));
    CHECK(contains(rig.lines[0], "did not complete within 5 s"));
  }
  SUBCASE("finalize refused") {
    Rig rig;
    rig.comm->complete_init(R::kSuccess);
    rig.log.finalize_result = R::kSystemError;
    rig.comm->close();
    CHECK(rig.log.destroys == 0);
    CHECK(rig.log.aborts == 1);
    REQUIRE(rig.lines.size() == 1);
    CHECK(contains(rig.lines[0], "unhandled system error"));
  }
  SUBCASE("an error while finalizing") {
    Rig rig;
    rig.comm->complete_init(R::kSuccess);
    rig.script({R::kInProgress, R::kRemoteError});
    rig.comm->close();
    CHECK(rig.log.destroys == 0);
    CHECK(rig.log.aborts == 1);
    CHECK(rig.lines.size() == 1);
  }
  SUBCASE("finalize returns ncclSuccess at once, destroy fails: reported, not aborted") {
    Rig rig;
    rig.comm->complete_init(R::kSuccess);
    rig.log.finalize_result = R::kSuccess;
    rig.log.destroy_result = R::kInternalError;
    rig.comm->close();
    CHECK(rig.log.polls == 0);
    CHECK(rig.log.destroys == 1);
    CHECK(rig.log.aborts == 0);
    CHECK(rig.lines.size() == 1);
  }
}

TEST_CASE("NcclComm::check_async_error: polls when free, skips while a call holds the lock, aborts on an error") {
  YieldingClock clock;
  Rig rig(1e9, &clock);
  rig.comm->complete_init(R::kSuccess);
  rig.comm->check_async_error();
  CHECK(rig.log.polls == 1);

  // A call in progress holds the lock: the watchdog's check must not poll concurrently.
  std::atomic<bool> inside{false}, release{false};
  std::thread owner([&] {
    rig.comm->call("AllGather of 5-byte shards", [&] {
      inside = true;
      while (!release.load()) std::this_thread::sleep_for(std::chrono::microseconds(100));
      return R::kSuccess;
    });
  });
  while (!inside.load()) std::this_thread::sleep_for(std::chrono::microseconds(100));
  for (int i = 0; i < 20; ++i) rig.comm->check_async_error();
  CHECK(rig.log.polls == 1);
  release = true;
  owner.join();

  rig.log.rest = R::kRemoteError;
  rig.log.last = "peer went away";
  const std::string what = error_of([&] { rig.comm->check_async_error(); });
  CHECK(contains(what, "asynchronous error"));
  CHECK(contains(what, "remote process exited"));
  CHECK(contains(what, "peer went away"));
  CHECK(rig.log.aborts == 1);
  CHECK_THROWS_AS(rig.comm->check_async_error(), dlo::Error);  // dead: keeps saying so
  CHECK(rig.log.aborts == 1);
}

TEST_CASE("NcclComm::abort from another thread stops a pending wait, aborts once, and later calls throw") {
  YieldingClock clock;
  Rig rig(1e9, &clock);
  rig.comm->complete_init(R::kSuccess);
  rig.log.rest = R::kInProgress;  // a gather whose peer never comes
  std::string what;
  std::atomic<bool> started{false};
  std::thread owner([&] {
    what = error_of([&] {
      rig.comm->call("AllGather of 64-byte shards", [&] {
        started = true;
        return R::kInProgress;
      });
    });
  });
  // Bounded, so that a broken wait (one that returns at once) fails here instead of hanging.
  for (int i = 0; i < 100000 && (!started.load() || rig.log.polls.load() < 3); ++i)
    std::this_thread::sleep_for(std::chrono::microseconds(100));
  const bool polling = rig.log.polls.load() >= 3;
  rig.comm->abort("the gather watchdog gave up");
  owner.join();
  REQUIRE(polling);
  CHECK(contains(what, "AllGather of 64-byte shards"));
  CHECK(contains(what, "aborted"));
  CHECK(rig.log.aborts == 1);
  CHECK_FALSE(rig.comm->usable());
  const std::string again = error_of([&] { rig.comm->call("AllGather of 1-byte shards", [] { return R::kSuccess; }); });
  CHECK(contains(again, "the gather watchdog gave up"));
  rig.comm->abort();
  rig.comm.reset();
  CHECK(rig.log.aborts == 1);
  CHECK(rig.log.finalizes == 0);
}
