// dlo::Error's kinds (LevelDB's Status categories) and the checked arithmetic of memory figures.
#include <doctest/doctest.h>

#include <cstdint>

#include "dlo/common/bytes.h"
#include "dlo/common/checked.h"
#include "dlo/common/error.h"
#include "dlo/common/settings.h"

TEST_CASE("errors carry their kind, and with_context keeps it and the every-rank mark") {
  CHECK(dlo::Error("x").kind() == dlo::ErrorKind::kInput);
  CHECK_FALSE(dlo::Error("x").on_every_rank());
  try {
    dlo::with_context("writing 'a.mp4'", [] { DLO_CHECK_IO(false, "No space left on device"); });
    FAIL("no throw");
  } catch (const dlo::Error& e) {
    CHECK(std::string(e.what()) == "writing 'a.mp4': No space left on device");
    CHECK(e.kind() == dlo::ErrorKind::kIo);
  }
  try {
    dlo::with_context("outer", [] { throw dlo::Error("agreed", dlo::ErrorKind::kTransfer, true); });
  } catch (const dlo::Error& e) {
    CHECK(e.kind() == dlo::ErrorKind::kTransfer);
    CHECK(e.on_every_rank());
    CHECK(std::string(e.what()) == "outer: agreed");
  }
  CHECK(std::string(dlo::error_kind_name(dlo::ErrorKind::kInternal)) == "internal");
}

TEST_CASE("the exit code follows the kind: input 2, everything else 1") {
  CHECK(dlo::exit_code_of(dlo::ErrorKind::kInput) == 2);
  CHECK(dlo::exit_code_of(dlo::ErrorKind::kIo) == 1);
  CHECK(dlo::exit_code_of(dlo::ErrorKind::kInternal) == 1);
  CHECK(dlo::exit_code_of(dlo::ErrorKind::kTransfer) == 1);
}

TEST_CASE("checked arithmetic saturates instead of wrapping (a 2^40 x 2^40 video is not 0 bytes)") {
  const std::uint64_t big = std::uint64_t{1} << 40;
  CHECK(big * big == 0);  // what the unchecked product gave: it passed --dry-run
  CHECK(dlo::sat_mul(big, big) == dlo::kSaturated);
  CHECK(dlo::sat_add(dlo::kSaturated, 1) == dlo::kSaturated);
  CHECK(dlo::sat_add(2, 3) == 5);
  CHECK(dlo::sat_mul(1u << 20, 1u << 20) == std::uint64_t{1} << 40);
  CHECK(dlo::sat_product({std::int64_t{1} << 40, std::int64_t{1} << 40, 3}) == dlo::kSaturated);
  CHECK(dlo::sat_product({4, -1, 5}) == 0);
  CHECK(dlo::with_margin(100) == 110);
  CHECK(dlo::with_margin(dlo::kSaturated) == dlo::kSaturated);
  CHECK(dlo::human_bytes(dlo::kSaturated) == "more than 16 EiB");
  CHECK(dlo::human_bytes(1536) == "1.50 KiB");
}
