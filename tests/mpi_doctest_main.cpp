// main() for doctest binaries run under mpirun: MPI set up first, every rank runs every case, a
// failure on any rank fails the run.
//
// A hang fails fast: ranks that disagree on a collective (one rank gathers a block twice, another
// once) would otherwise wait until CTest's timeout and end with no message. A watchdog thread
// ends every rank after DLO_TEST_TIMEOUT_S seconds (default 150; CTest's timeout for these tests
// is 300), naming the test case it was in.
#define DOCTEST_CONFIG_IMPLEMENT
#include <doctest/doctest.h>
#include <mpi.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdlib>
#include <mutex>
#include <string>
#include <thread>

#include "common/doctest_listener.h"
#include "dlo/mpi/mpi_world.h"

namespace {

std::mutex g_case_mu;
std::string g_case = "(before the first test case)";

// Records the running test case for the watchdog's message.
struct CaseTracker : dlo::test::QuietListener {
  using QuietListener::QuietListener;
  void test_case_start(const doctest::TestCaseData& tc) override {
    std::lock_guard<std::mutex> lock(g_case_mu);
    g_case = tc.m_name;
  }
};
DOCTEST_REGISTER_LISTENER("dlo_case_tracker", 1, CaseTracker);

class Watchdog {
 public:
  explicit Watchdog(int seconds)
      : thread_([this, seconds] {
          std::unique_lock<std::mutex> lock(mu_);
          if (cv_.wait_for(lock, std::chrono::seconds(seconds), [this] { return done_; })) return;
          std::string where;
          {
            std::lock_guard<std::mutex> l(g_case_mu);
            where = g_case;
          }
          dlo::MpiWorld::abort("test watchdog: still running after " + std::to_string(seconds) +
                                   " s (DLO_TEST_TIMEOUT_S) in test case \"" + where +
                                   "\": a rank is stuck in a collective the others never joined",
                               124);
        }) {}
  ~Watchdog() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      done_ = true;
    }
    cv_.notify_all();
    thread_.join();
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  bool done_ = false;
  std::thread thread_;
};

}  // namespace

int main(int argc, char** argv) {
  dlo::MpiWorld world(&argc, &argv);
  const char* env = std::getenv("DLO_TEST_TIMEOUT_S");
  const int timeout_s = env != nullptr && std::atoi(env) > 0 ? std::atoi(env) : 150;
  int failed = 0;
  {
    Watchdog dog(timeout_s);
    doctest::Context ctx(argc, argv);
    failed = ctx.run();
    MPI_Allreduce(MPI_IN_PLACE, &failed, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
  }
  return failed;
}
