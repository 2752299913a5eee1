// The waiting, failing and closing rules for one non-blocking NCCL communicator (see the header).
#include "dlo/dist/nccl_comm.h"

#include <chrono>
#include <thread>
#include <utility>

#include "dlo/common/error.h"

namespace dlo {
namespace {

class SteadyClock final : public NcclWaitClock {
 public:
  double now_s() override {
    return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
  }
  void pause(long polls) override {
    if (polls <= 64) {
      std::this_thread::yield();
    } else if (polls <= 2000) {
      std::this_thread::sleep_for(std::chrono::microseconds(20));
    } else {
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
  }
};

}  // namespace

NcclWaitClock& NcclWaitClock::real() {
  static SteadyClock clock;
  return clock;
}

NcclWait wait_nccl_call(NcclResult first, NcclCommOps& ops, double timeout_s, NcclWaitClock& clock,
                        const std::atomic<bool>* stop) {
  NcclWait w;
  if (first == NcclResult::kSuccess) return w;
  if (first != NcclResult::kInProgress) {
    w.kind = NcclWait::kFailed;
    w.result = first;
    return w;
  }
  const double deadline = clock.now_s() + timeout_s;
  for (;;) {
    if (stop != nullptr && stop->load()) {
      w.kind = NcclWait::kStopped;
      w.result = NcclResult::kInProgress;
      return w;
    }
    NcclResult state = NcclResult::kInProgress;
    const NcclResult r = ops.get_async_error(&state);
    ++w.polls;
    if (r != NcclResult::kSuccess) {
      w.kind = NcclWait::kFailed;
      w.result = r;
      return w;
    }
    if (state == NcclResult::kSuccess) return w;
    if (state != NcclResult::kInProgress) {
      w.kind = NcclWait::kFailed;
      w.result = state;
      return w;
    }
    if (clock.now_s() >= deadline) {
      w.kind = NcclWait::kTimedOut;
      w.result = NcclResult::kInProgress;
      return w;
    }
    clock.pause(w.polls);
  }
}

NcclComm::NcclComm(std::unique_ptr<NcclCommOps> ops, double timeout_s, std::string context,
                   std::function<void(const std::string&)> log, NcclWaitClock& clock)
    : ops_(std::move(ops)), timeout_s_(timeout_s), context_(std::move(context)), log_(std::move(log)), clock_(clock) {
  DLO_ASSERT(ops_ != nullptr);
  DLO_ASSERT(timeout_s_ > 0, "NCCL wait timeout must be positive, got ", timeout_s_);
}

NcclComm::~NcclComm() { close(); }

std::string NcclComm::last_error_suffix() {
  std::string last;
  try {
    last = ops_->last_error();
  } catch (...) {
  }
  // NCCL's last warning is process-wide and never cleared, so it may be older than this error.
  return last.empty() ? std::string() : str(" (NCCL's last warning: ", last, ")");
}

std::string NcclComm::unusable_message(const std::string& what) const {
  if (state_.load() == kClosed) return str("NCCL ", what, " (", context_, "): the communicator was already closed");
  return str("NCCL ", what, " (", context_, "): the communicator was aborted (",
             abort_reason_.empty() ? std::string("abort() was called") : abort_reason_, "); it cannot be used again");
}

void NcclComm::fail_locked(const std::string& what, const NcclWait& w) {
  std::string message;
  if (w.kind == NcclWait::kTimedOut) {
    message = str("NCCL ", what, " (", context_, ") did not complete within ", timeout_s_,
                  " s (the gather timeout, DLO_GATHER_TIMEOUT_S): a rank is gone or stuck");
  } else if (w.kind == NcclWait::kStopped) {
    message = str("NCCL ", what, " (", context_, ") was stopped: the communicator is being aborted (",
                  abort_reason_.empty() ? std::string("abort() was called") : abort_reason_, ")");
    throw Error(message, ErrorKind::kTransfer);  // the aborting thread calls ncclCommAbort once it has the lock
  } else {
    message = str("NCCL ", what, " (", context_, ") failed: ", ops_->error_string(w.result), last_error_suffix());
  }
  abort_locked(message);
  throw Error(message + "; the communicator was aborted", ErrorKind::kTransfer);
}

void NcclComm::abort_locked(const std::string& reason) noexcept {
  if (state_.load() != kLive) return;
  abort_reason_ = reason;
  NcclResult r = NcclResult::kSuccess;
  try {
    r = ops_->abort();
  } catch (...) {
    r = NcclResult::kInternalError;
  }
  state_.store(kAborted);
  if (r != NcclResult::kSuccess) {
    try {
      log_(str("NCCL (", context_, "): ncclCommAbort returned ", ops_->error_string(r), last_error_suffix()));
    } catch (...) {
    }
  }
}

void NcclComm::complete_init(NcclResult first) {
  std::lock_guard<std::mutex> lock(mu_);
  const std::string what = "communicator set-up (ncclCommInitRankConfig)";
  if (state_.load() != kLive) throw Error(unusable_message(what), ErrorKind::kTransfer);
  const NcclWait w = wait_nccl_call(first, *ops_, timeout_s_, clock_, &abort_requested_);
  if (w.kind != NcclWait::kDone) fail_locked(what, w);
}

void NcclComm::call(const std::string& what, const std::function<NcclResult()>& fn) {
  std::lock_guard<std::mutex> lock(mu_);
  if (state_.load() != kLive || abort_requested_.load()) throw Error(unusable_message(what), ErrorKind::kTransfer);
  const NcclWait w = wait_nccl_call(fn(), *ops_, timeout_s_, clock_, &abort_requested_);
  if (w.kind != NcclWait::kDone) fail_locked(what, w);
}

void NcclComm::check_async_error() {
  std::unique_lock<std::mutex> lock(mu_, std::try_to_lock);
  if (!lock.owns_lock()) return;  // the owner is in a call and polls the same state itself
  const int state = state_.load();
  if (state == kClosed) return;
  if (state == kAborted) throw Error(unusable_message("asynchronous error check"), ErrorKind::kTransfer);
  NcclResult async = NcclResult::kSuccess;
  const NcclResult r = ops_->get_async_error(&async);
  const NcclResult bad = r != NcclResult::kSuccess ? r : async;
  // ncclInProgress cannot be seen here: every call completes before it releases the lock.
  if (bad == NcclResult::kSuccess || bad == NcclResult::kInProgress) return;
  const std::string message =
      str("NCCL communicator (", context_, ") reported an asynchronous error: ", ops_->error_string(bad),
          last_error_suffix());
  abort_locked(message);
  throw Error(message + "; the communicator was aborted", ErrorKind::kTransfer);
}

void NcclComm::abort(const std::string& reason) noexcept {
  abort_requested_.store(true);
  std::lock_guard<std::mutex> lock(mu_);  // a waiting owner sees abort_requested_ within one poll
  abort_locked(reason);
}

void NcclComm::close() noexcept {
  try {
    std::lock_guard<std::mutex> lock(mu_);
    if (state_.load() != kLive) return;
    const NcclWait w = wait_nccl_call(ops_->finalize(), *ops_, timeout_s_, clock_, &abort_requested_);
    if (w.kind != NcclWait::kDone) {
      const std::string why =
          w.kind == NcclWait::kTimedOut  ? str("ncclCommFinalize did not complete within ", timeout_s_, " s")
          : w.kind == NcclWait::kStopped ? std::string("abort() was called while ncclCommFinalize was pending")
                                         : str("ncclCommFinalize failed: ", ops_->error_string(w.result),
                                               last_error_suffix());
      log_(str("NCCL (", context_, "): ", why, "; aborting the communicator instead of destroying it"));
      abort_locked(why);
      state_.store(kClosed);
      return;
    }
    const NcclResult r = ops_->destroy();
    // No abort after a failed destroy: NCCL may have freed the communicator by the time an error
    // comes back from its group end (src/init.cc:2381-2391), and a leak at exit is harmless.
    if (r != NcclResult::kSuccess)
      log_(str("NCCL (", context_, "): ncclCommDestroy failed: ", ops_->error_string(r), last_error_suffix(),
               "; the communicator is left as it is"));
    state_.store(kClosed);
  } catch (...) {
    // log_ or an allocation failed; nothing more can be done from a destructor.
  }
}

}  // namespace dlo
