#include "dlo/models/torch_errors.h"

#include <new>

#include <c10/util/Exception.h>

namespace dlo {
namespace {

bool contains(const std::string& s, const char* part) { return s.find(part) != std::string::npos; }

}  // namespace

bool is_allocation_failure(const std::exception& e) {
  if (dynamic_cast<const std::bad_alloc*>(&e) != nullptr) return true;
  if (dynamic_cast<const c10::OutOfMemoryError*>(&e) != nullptr) return true;
  if (const auto* c = dynamic_cast<const c10::Error*>(&e)) {
    const std::string m = c->what_without_backtrace();
    return contains(m, "not enough memory") || contains(m, "out of memory") || contains(m, "can't allocate") ||
           contains(m, "Cannot allocate");
  }
  return false;
}

std::string describe_exception(const std::exception& e) {
  std::string m;
  if (const auto* c = dynamic_cast<const c10::Error*>(&e)) {
    m = c->what_without_backtrace();
  } else {
    m = e.what();
  }
  if (dynamic_cast<const std::bad_alloc*>(&e) != nullptr) return "out of memory (an allocation failed: " + m + ")";
  if (is_allocation_failure(e)) return "out of memory: " + m;
  return m;
}

}  // namespace dlo
