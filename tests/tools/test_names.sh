#!/usr/bin/env bash
# doctest case names become CTest test names, and CTest reads a ';' in a name as a list separator:
# such a case is split into names that match no case, and it runs nothing (three did, unseen, until
# a full run reported them as failing). No TEST_CASE name may hold one.
#   test_names.sh SOURCE_DIR
set -euo pipefail
cd "${1:?source dir}"
if grep -rnE 'TEST_CASE\("[^"]*;' tests/; then
  echo "FAIL: the TEST_CASE names above hold ';' (write ',' instead)"
  exit 1
fi
echo "ok: no TEST_CASE name holds ';'"
