// Errors: dlo::Error carries a kind, as LevelDB's Status carries a code, so that callers branch on
// what went wrong instead of on where it was caught; DLO_ASSERT is for bugs.
//
//   kInput     bad input, configuration or environment: the user can fix it. Found before the
//              work where possible; a tool exits 2.
//   kIo        reading or writing a file failed while working (disk full, a vanished folder).
//   kInternal  anything else that cannot go on (a library error, a failed allocation, a bug
//              that is not worth an abort): exit 1.
//   kTransfer  a weight or activation transfer between ranks failed or timed out: the
//              collective is out of step, so every rank must end (exit 1).
//
// An error raised the same way on every rank (MpiWorld::check_all, an agreed refusal) says so
// (on_every_rank()): ending the run then needs no MPI_Abort, every rank returns by itself. Any
// other error is one rank's own, and in a run of several ranks it ends all of them at once (the
// others may be waiting in a collective for this one); see app/tool.h.
//
// DLO_CHECK(cond, parts...) throws an input Error whose message is the parts streamed together
// (the TORCH_CHECK pattern); DLO_CHECK_IO and DLO_CHECK_KIND choose the kind. Callers add context
// as the error travels up with dlo::with_context(), which keeps the kind, so a user sees
// "loading X: tensor 'y': end offset 9 beyond file size 8".
#pragma once

#include <sstream>
#include <stdexcept>
#include <string>
#include <utility>

namespace dlo {

enum class ErrorKind { kInput, kIo, kInternal, kTransfer };

// "input", "io", "internal", "transfer".
const char* error_kind_name(ErrorKind kind);

class Error : public std::runtime_error {
 public:
  explicit Error(const std::string& what, ErrorKind kind = ErrorKind::kInput, bool on_every_rank = false)
      : std::runtime_error(what), kind_(kind), on_every_rank_(on_every_rank) {}
  ErrorKind kind() const { return kind_; }
  // True when every rank raised this same error (a collective check found it).
  bool on_every_rank() const { return on_every_rank_; }

 private:
  ErrorKind kind_;
  bool on_every_rank_;
};

namespace detail {
template <typename... Parts>
std::string concat(Parts&&... parts) {
  std::ostringstream os;
  (os << ... << std::forward<Parts>(parts));
  return os.str();
}
[[noreturn]] void assert_fail(const char* expr, const char* file, int line, const std::string& msg);
}  // namespace detail

// Streams the parts into one string (for messages built outside DLO_CHECK).
template <typename... Parts>
std::string str(Parts&&... parts) {
  return detail::concat(std::forward<Parts>(parts)...);
}

// Runs fn(); if it throws dlo::Error, rethrows it with "context: " in front of the message and
// the same kind.
template <typename Fn>
decltype(auto) with_context(const std::string& context, Fn&& fn) {
  try {
    return std::forward<Fn>(fn)();
  } catch (const Error& e) {
    throw Error(context + ": " + e.what(), e.kind(), e.on_every_rank());
  }
}

}  // namespace dlo

#define DLO_CHECK_KIND(kind, cond, ...)                                    \
  do {                                                                     \
    if (!(cond)) throw ::dlo::Error(::dlo::str(__VA_ARGS__), (kind));      \
  } while (0)
#define DLO_CHECK(cond, ...) DLO_CHECK_KIND(::dlo::ErrorKind::kInput, cond, __VA_ARGS__)
#define DLO_CHECK_IO(cond, ...) DLO_CHECK_KIND(::dlo::ErrorKind::kIo, cond, __VA_ARGS__)

// Internal invariant: a failure is a bug in dlo, not bad input. Always on.
#define DLO_ASSERT(cond, ...)                                                              \
  do {                                                                                     \
    if (!(cond)) ::dlo::detail::assert_fail(#cond, __FILE__, __LINE__, ::dlo::str("" __VA_OPT__(, ) __VA_ARGS__)); \
  } while (0)
