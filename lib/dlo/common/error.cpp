#include "dlo/common/error.h"

#include <cstdio>
#include <cstdlib>

namespace dlo::detail {

void assert_fail(const char* expr, const char* file, int line, const std::string& msg) {
  std::fprintf(stderr, "dlo internal error: %s:%d: assertion '%s' failed%s%s\n", file, line, expr,
               msg.empty() ? "" : ": ", msg.c_str());
  std::fflush(stderr);
  std::abort();
}

}  // namespace dlo::detail

namespace dlo {

const char* error_kind_name(ErrorKind kind) {
  switch (kind) {
    case ErrorKind::kInput: return "input";
    case ErrorKind::kIo: return "io";
    case ErrorKind::kInternal: return "internal";
    case ErrorKind::kTransfer: return "transfer";
  }
  return "internal";
}

}  // namespace dlo
