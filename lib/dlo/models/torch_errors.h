// Exceptions as one-line messages, libtorch's included: c10::Error without its stack trace, an
// allocation failure (std::bad_alloc, libtorch's "not enough memory") as "out of memory: ...".
// Every layer that catches a libtorch exception to report it (the engine, the render stages, the
// tools) words it through here. Thread-safe.
#pragma once

#include <exception>
#include <string>

namespace dlo {

std::string describe_exception(const std::exception& e);
bool is_allocation_failure(const std::exception& e);

}  // namespace dlo
