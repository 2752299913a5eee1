#include "dlo/app/job_flags.h"

#include <algorithm>

#include "dlo/config/job.h"

namespace dlo {

void add_job_field_flags(cxxopts::Options& options, const std::string& group) {
  auto adder = options.add_options(group);
  for (const auto& f : job_fields()) {
    if (f.flag.empty()) continue;
    std::string help = f.help;
    if (!f.default_text.empty())
      help += " (default: " + std::string(f.from(kFromModel) ? "the model folder's dlo_defaults.json, else " : "") +
              f.default_text + ")";
    help.erase(std::remove(help.begin(), help.end(), '`'), help.end());  // the doc's Markdown
    if (!f.from(kFromBatchFlag)) help += "; one prompt only";
    adder(f.flag, help, cxxopts::value<std::string>());
  }
}

JobFlags job_field_flags(const cxxopts::ParseResult& args) {
  JobFlags flags;
  for (const auto& f : job_fields())
    if (!f.flag.empty() && args.count(f.flag)) flags[f.key] = args[f.flag].as<std::string>();
  return flags;
}

}  // namespace dlo
