// Errors: dlo::Error for bad input, configuration and environment; DLO_ASSERT for bugs.
//
// DLO_CHECK(cond, parts...) throws dlo::Error whose message is the parts streamed together
// (the TORCH_CHECK pattern). Callers add context as the error travels up with
// dlo::with_context(), so a user sees "loading X: tensor 'y': end offset 9 beyond file size 8".
#pragma once

#include <sstream>
#include <stdexcept>
#include <string>
#include <utility>

namespace dlo {

// Bad input, configuration or environment: the user can fix it. Carries a message only.
class Error : public std::runtime_error {
 public:
  explicit Error(const std::string& what) : std::runtime_error(what) {}
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

// Runs fn(); if it throws dlo::Error, rethrows it with "context: " in front of the message.
template <typename Fn>
decltype(auto) with_context(const std::string& context, Fn&& fn) {
  try {
    return std::forward<Fn>(fn)();
  } catch (const Error& e) {
    throw Error(context + ": " + e.what());
  }
}

}  // namespace dlo

#define DLO_CHECK(cond, ...)                                    \
  do {                                                          \
    if (!(cond)) throw ::dlo::Error(::dlo::str(__VA_ARGS__));   \
  } while (0)

// Internal invariant: a failure is a bug in dlo, not bad input. Always on.
#define DLO_ASSERT(cond, ...)                                                              \
  do {                                                                                     \
    if (!(cond)) ::dlo::detail::assert_fail(#cond, __FILE__, __LINE__, ::dlo::str("" __VA_OPT__(, ) __VA_ARGS__)); \
  } while (0)
