// doctest for test files that use ATen. Include this instead of <doctest/doctest.h>, first.
// c10 defines glog-style CHECK, CHECK_EQ, ... macros that abort instead of counting a failure;
// they are removed here so doctest's macros are the ones in effect.
// Note: doctest cannot print c10::ScalarType (ADL finds c10::toString); compare dtype names.
#pragma once

#include <ATen/ATen.h>

#undef CHECK
#undef CHECK_EQ
#undef CHECK_NE
#undef CHECK_LE
#undef CHECK_LT
#undef CHECK_GE
#undef CHECK_GT
#ifdef DOCTEST_LIBRARY_INCLUDED
#error "include common/doctest_torch.h before <doctest/doctest.h>"
#endif
#include <doctest/doctest.h>

