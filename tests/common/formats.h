// The output formats of dlo-generate as the job table sees them (app/output_formats_av.cpp), for
// tests of the torch-free layers that cannot link the app.
#pragma once

#include "dlo/config/job.h"

namespace dlo::test {

inline const OutputFormatNames kVideoFormats = {{"mp4", ".mp4"}, {"png", ""}, {"ffv1", ".mkv"}};

}  // namespace dlo::test
