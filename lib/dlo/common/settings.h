// What every tool shares between its flags and the library: settings parsed strictly, thread
// counts bounded by the cores there are, and the exit codes. The library reads no environment:
// apps pass the text of a variable (or nullptr) to these functions.
//
// Thread-safety: all functions are thread-safe.
#pragma once

#include <string>

#include "dlo/common/error.h"

namespace dlo {

// The exit codes of every tool.
enum ExitCode : int {
  kExitOk = 0,
  kExitFailed = 1,          // anything else: a fault during the work, an I/O error writing results
  kExitBadInput = 2,        // bad invocation or input, detected before the work started
  kExitSomeJobsFailed = 3,  // a batch finished, some of its jobs failed
};

// The exit code of an error of `kind`: kExitBadInput for input, kExitFailed otherwise.
inline int exit_code_of(ErrorKind kind) { return kind == ErrorKind::kInput ? kExitBadInput : kExitFailed; }

// A duration in seconds from a setting's text, e.g. the value of DLO_GATHER_TIMEOUT_S: nullptr
// (unset) gives `default_s`; otherwise the whole text must be a finite number > 0 ("30", "2.5").
// Throws dlo::Error naming `name` and the text for anything else ("abc", "", "-1", "0", "5s").
// Also refused: more than kMaxSecondsSetting.
double parse_seconds_setting(const char* text, const std::string& name, double default_s);
inline constexpr double kMaxSecondsSetting = 1e8;  // about three years

// How long every collective waits for a rank before ending them all, unless DLO_GATHER_TIMEOUT_S
// says otherwise: the one default (MpiWorld, the engine, the collectives start from it).
inline constexpr double kDefaultGatherTimeoutS = 600;
// DLO_GATHER_TIMEOUT_S's value (its text, or nullptr when unset) by parse_seconds_setting.
double gather_timeout_setting(const char* text);

// The cores this process may run on (its CPU affinity mask), at least 1.
int available_cores();

// The thread count to use for a request of `requested` threads per process (0: the library's
// default). Above available_cores() it is lowered to that count and `note` (if not null) gets a
// sentence saying so, naming `what` (e.g. "--threads"); otherwise `note` is cleared. Throws
// dlo::Error for a negative request.
int bound_threads(int requested, const std::string& what, std::string* note);

}  // namespace dlo
