// The precompiled header of every target that uses libtorch (CMake: DLO_PCH, target dlo_torch_pch):
// parsing ATen's headers is most of the compile time of such a translation unit, so they are
// parsed once per build. Nothing here is a dependency of the code: every file still includes what
// it uses (a build with -DDLO_PCH=OFF proves it).
#include <algorithm>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <ATen/ATen.h>
#include <c10/util/Exception.h>
#include <cxxopts.hpp>
#include <nlohmann/json.hpp>
