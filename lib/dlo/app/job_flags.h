// The job fields' command-line flags, made from the job-field table (config/job.h): one
// `--<flag>` per field that has one, its help from the row, its value taken as text so the table's
// own parser reads it (and its errors name the flag). Adding a field to the table adds its flag.
#pragma once

#include <string>

#include <cxxopts.hpp>

#include "dlo/pipeline/manifest.h"

namespace dlo {

// Adds the job fields' flags to `options` under the group `group`.
void add_job_field_flags(cxxopts::Options& options, const std::string& group = "job fields");

// The job-field flags given (field key -> text, as the user wrote it).
JobFlags job_field_flags(const cxxopts::ParseResult& args);

}  // namespace dlo
