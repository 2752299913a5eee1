// What dlo does around one non-blocking NCCL communicator, kept free of NCCL, CUDA and torch
// headers so that a CPU test drives it with a fake (tests/dist/test_nccl_comm.cpp);
// collective_nccl.cpp plugs in the real calls.
//
// Why this exists (docs: ../shared/reference/gpu-notes.md A1, A5, A10, A12). dlo creates its
// communicator with config.blocking = 0 so that a rank that never arrives cannot hang start-up.
// That setting applies to every later call on the communicator, not only to init: a collective
// (ncclEnqueueCheck, NCCL 2.28.9 src/enqueue.cc:2620-2663) runs in an implicit group whose
// non-blocking branch (src/group.cc:706-738) marks the communicator ncclInProgress, starts a
// thread that connects and enqueues the kernel, and returns ncclInProgress at once. Until
// ncclCommGetAsyncError reports ncclSuccess:
//   - the kernel may not be on the stream yet (an event recorded now would precede it), and
//   - the next call on the communicator fails: ncclCommEnsureReady (src/init.cc:373-389) turns
//     the ncclInProgress state into ncclInvalidArgument.
// So every call is made complete here before it returns (wait_nccl_call), and a failure aborts
// the communicator before the error is thrown.
#pragma once

#include <atomic>
#include <functional>
#include <memory>
#include <mutex>
#include <string>

namespace dlo {

// ncclResult_t's values (nccl.h of NCCL 2.28.9, lines 42-50); collective_nccl.cpp checks them
// with static_assert.
enum class NcclResult : int {
  kSuccess = 0,
  kUnhandledCudaError = 1,
  kSystemError = 2,
  kInternalError = 3,
  kInvalidArgument = 4,
  kInvalidUsage = 5,
  kRemoteError = 6,
  kInProgress = 7,
};

// The calls on one communicator that the waiting and closing logic makes. The real one wraps an
// ncclComm_t; tests fake it. Called with NcclComm's lock held, from one thread at a time.
class NcclCommOps {
 public:
  virtual ~NcclCommOps() = default;
  // ncclCommGetAsyncError: returns the call's own result, writes the communicator's state.
  virtual NcclResult get_async_error(NcclResult* state) = 0;
  virtual NcclResult finalize() = 0;  // ncclCommFinalize
  virtual NcclResult destroy() = 0;   // ncclCommDestroy
  virtual NcclResult abort() = 0;     // ncclCommAbort
  // ncclGetErrorString(r), e.g. "remote process exited or there was a network error".
  virtual std::string error_string(NcclResult r) = 0;
  // ncclGetLastError: NCCL's last warning, process-wide ("" if none).
  virtual std::string last_error() = 0;
};

// Time for the waits. real(): the steady clock; pause() yields for the first polls (a gather's
// enqueue thread finishes in microseconds), then sleeps 20 us, then 1 ms. Tests pass a fake clock
// that advances on pause().
class NcclWaitClock {
 public:
  virtual ~NcclWaitClock() = default;
  virtual double now_s() = 0;
  // Called between polls; `polls` counts them from 1.
  virtual void pause(long polls) = 0;
  static NcclWaitClock& real();
};

// How a wait ended.
struct NcclWait {
  enum Kind {
    kDone,      // the communicator reported ncclSuccess: the call is complete
    kFailed,    // the call or the communicator reported an error (`result`)
    kTimedOut,  // still ncclInProgress when timeout_s had passed
    kStopped,   // *stop became true (another thread is aborting the communicator)
  };
  Kind kind = kDone;
  NcclResult result = NcclResult::kSuccess;  // the error for kFailed; kInProgress for the others
  long polls = 0;                            // ncclCommGetAsyncError calls made
};

// Waits for one call on a non-blocking communicator to complete. `first` is what the call
// returned: ncclSuccess means done (no poll); ncclInProgress means poll get_async_error, pausing
// in between, until the state leaves ncclInProgress or `timeout_s` passes; anything else is a
// failure. Makes no other call (the caller aborts and reports). `stop` may be null.
NcclWait wait_nccl_call(NcclResult first, NcclCommOps& ops, double timeout_s, NcclWaitClock& clock,
                        const std::atomic<bool>* stop = nullptr);

// One non-blocking NCCL communicator, owned: every call complete before it returns, an abort on
// any failure, one lock around all calls, and finalize + destroy (or abort) at the end.
//
// Threads: call() and close() from the owning thread(s), serialised by the lock;
// check_async_error() and abort() from any thread (a watchdog). ncclCommGetAsyncError is NOT safe
// to call concurrently with another call on the same communicator in NCCL 2.28.9: when the state
// is ncclSuccess and a group job is linked, it joins that job and clears comm->groupJob with plain
// writes (src/init.cc:2732-2736; ncclGroupJobComplete, src/group.cc:767-778, decrements a
// reference count that another caller would decrement again, a use after free). nccl.h says
// nothing about thread safety, and its collective section (lines 350-360) asks for one thread per
// call. So check_async_error() only polls when it gets the lock at once (try_lock): if the owner
// holds it, the owner is inside a call that polls the same state itself and fails on an error.
class NcclComm {
 public:
  // `ops` wraps a communicator whose creating call (ncclCommInitRankConfig) has returned; call
  // complete_init() next. `timeout_s` bounds every wait (MpiWorld::timeout_s()). `context` goes
  // into every message ("rank 1 of 2, cuda:0"); `log` receives close()'s one-line reports
  // (stderr in the real collective; never throws).
  NcclComm(std::unique_ptr<NcclCommOps> ops, double timeout_s, std::string context,
           std::function<void(const std::string&)> log, NcclWaitClock& clock = NcclWaitClock::real());
  // close().
  ~NcclComm();
  NcclComm(const NcclComm&) = delete;
  NcclComm& operator=(const NcclComm&) = delete;

  // Waits for the creating call, which returned `first`. On failure or timeout: aborts the
  // communicator (no init thread is left running) and throws dlo::Error naming the set-up, the
  // NCCL error and NCCL's last warning.
  void complete_init(NcclResult first);

  // Runs `fn` (one NCCL call on this communicator, e.g. ncclAllGather) under the lock and returns
  // only once it is complete (the kernel is on the stream). `what` names the operation in
  // messages ("AllGather of 1234-byte shards"). On an error or after timeout_s: aborts the
  // communicator and throws dlo::Error. After an abort (any thread): throws without calling `fn`.
  void call(const std::string& what, const std::function<NcclResult()>& fn);

  // Any thread. If the lock is free: polls the communicator and, on an error, aborts it and
  // throws dlo::Error. If the lock is held: returns (see the class comment). After an abort:
  // throws (the communicator is unusable). After close(): returns.
  void check_async_error();

  // Any thread, idempotent: makes the owner's wait (if any) stop at its next poll, then calls
  // ncclCommAbort under the lock, which also stops kernels still running on the device.
  // `reason` is kept for later errors. Never throws.
  void abort(const std::string& reason = "abort() was called") noexcept;

  // Ends the communicator, once: ncclCommFinalize, poll until ncclSuccess (bounded by
  // timeout_s), then ncclCommDestroy (nccl.h:183-193: destroy only after finalize has reached
  // ncclSuccess). If finalize fails, times out or abort() interrupts it: ncclCommAbort instead.
  // A failed destroy is only reported (NCCL may have freed the communicator already). Reports
  // each failure as one line through `log`; never throws. Does nothing after an abort.
  void close() noexcept;

  bool usable() const { return state_.load() == kLive; }
  double timeout_s() const { return timeout_s_; }

 private:
  enum State { kLive, kAborted, kClosed };
  [[noreturn]] void fail_locked(const std::string& what, const NcclWait& w);
  void abort_locked(const std::string& reason) noexcept;
  std::string last_error_suffix();
  std::string unusable_message(const std::string& what) const;

  std::unique_ptr<NcclCommOps> ops_;
  double timeout_s_;
  std::string context_;
  std::function<void(const std::string&)> log_;
  NcclWaitClock& clock_;
  std::mutex mu_;                       // held around every call on ops_
  std::atomic<int> state_{kLive};       // written under mu_
  std::atomic<bool> abort_requested_{false};
  std::string abort_reason_;            // under mu_
};

}  // namespace dlo
