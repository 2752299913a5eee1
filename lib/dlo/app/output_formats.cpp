#include "dlo/app/output_formats.h"

#include "dlo/common/error.h"

namespace dlo {

OutputFormatNames AppOutputs::names() const {
  OutputFormatNames out;
  for (const auto& f : formats) out.push_back({f.name, f.extension});
  return out;
}

const OutputFormat& AppOutputs::format(const std::string& name) const {
  std::vector<std::string> names;
  for (const auto& f : formats) {
    if (f.name == name) return f;
    names.push_back(f.name);
  }
  DLO_CHECK(false, "'", name, "' is not ", choice_list(names));
}

}  // namespace dlo
