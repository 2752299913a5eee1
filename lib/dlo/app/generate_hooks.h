// What a build of dlo-generate adds around the library, chosen when it is linked (as its output
// formats are, app/output_formats.h): nothing in the tools that ship (generate_hooks_none.cpp);
// fault injection in the tests' build, dlo-generate-testhooks (tests/apps/generate_testhooks.cpp:
// its flags, a BatchWork decorator that fails a job or slows its decode, a transfer that fails).
// So the shipped --help shows no test hook, and the tests drive the same main.
#pragma once

#include <memory>

#include <cxxopts.hpp>

#include "dlo/render/batch_work.h"
#include "dlo/render/generate.h"

namespace dlo {

class MpiWorld;

class GenerateHooks {
 public:
  virtual ~GenerateHooks() = default;
  // Adds this build's flags to dlo-generate's table.
  virtual void add_flags(cxxopts::Options& opts) const = 0;
  // With the flags parsed, on every rank, before anything is planned: may change the run options.
  // Throws dlo::Error naming a flag for a bad value.
  virtual void apply(const cxxopts::ParseResult& args, const MpiWorld& world, GenerateOptions& options) const = 0;
  // The work generate() drives (make_model_work's, perhaps wrapped); may wrap `callbacks`.
  virtual std::unique_ptr<BatchWork> work(const cxxopts::ParseResult& args, const MpiWorld& world, const ModelInfo& model,
                                          const GenerateOptions& options, GenerateCallbacks& callbacks) const = 0;
};

// This build's hooks (exactly one definition is linked).
const GenerateHooks& generate_hooks();

}  // namespace dlo
