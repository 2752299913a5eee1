// dlo-generate's command line: its flag table, the run options its flags give, and the plan rank 0
// makes of a --prompt or a --jobs invocation before any weight is read. apps/dlo-generate/main.cpp
// joins them to the collective start-up (the same error on every rank) and to dlo::generate.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include <cxxopts.hpp>

#include "dlo/app/output_formats.h"
#include "dlo/common/folder_lock.h"
#include "dlo/pipeline/batch_plan.h"
#include "dlo/render/generate.h"

namespace dlo {

class MpiWorld;

// Every flag of dlo-generate (`outputs.build` names the tool): the run flags and one flag per job
// field (app/job_flags.h). A build's hooks (generate_hooks.h) may add more.
cxxopts::Options generate_flag_table(const AppOutputs& outputs);

// The integer value of `flag` (given as text); a dlo::Error naming the flag when it is not one.
std::int64_t integer_flag(const cxxopts::ParseResult& args, const std::string& flag);

// The run options the flags give, the same on every rank (the manifest's sp and cfg_parallel keys
// are applied later, where the flags do not say). Errors name the flag.
// `storage_key`: the manifest's storage_dtype ("": none), used where --storage-dtype is not given.
GenerateOptions generate_options_from_flags(const cxxopts::ParseResult& args, const std::string& storage_key = "");

// The topology flags given (--sp, --cfg-parallel), for batch_topology_request. Errors name the flag.
TopologyFlags topology_flags(const cxxopts::ParseResult& args);

// --model with --transformer / --transformer-2 / --vae (canonical paths). Errors name the flag.
ModelParts model_parts_from_flags(const cxxopts::ParseResult& args);

// Rank 0: the plan of one --prompt job (the model's defaults, then the flags; a seed drawn when
// none is given), every check made before any weight is read (its topology on `ranks` ranks
// included). `dtypes` is dtypes_label(options).
BatchPlan prompt_plan_from_flags(const cxxopts::ParseResult& args, const JobFlags& flags, const AppOutputs& outputs,
                                 const std::string& dtypes, int ranks);

// Rank 0: the plan of a --jobs batch (manifest, flags over it, checks, resume from results.jsonl)
// and the checks of its --save-latents file. The output folder's lock is taken into `lock`, and
// the latents file's ("FILE.h5.lock" beside it) into `latents_lock`; the caller holds them until
// every result is written. The topology is checked for every job on `ranks` ranks before the
// output folder is made.
BatchPlan batch_plan_from_flags(const cxxopts::ParseResult& args, JobFlags flags, const AppOutputs& outputs,
                                const std::string& dtypes, int ranks, std::optional<FolderLock>& lock,
                                std::optional<FolderLock>& latents_lock);

// Collective (plan_render): --dry-run's report on rank 0, each job with the ranks it starts on, the
// topology's reason and the memory estimate per rank.
void print_dry_run(const MpiWorld& world, const ModelInfo& model, const BatchPlan& plan, const GenerateOptions& options);

}  // namespace dlo
