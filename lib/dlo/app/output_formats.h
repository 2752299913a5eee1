// What an app can write: its output formats (a video file, a folder of frames, raw frames) and
// where a batch keeps its latents. The pipeline knows none of this: it sees format names and their
// default extensions (OutputFormatNames, for the job table and the manifest) and a FrameSink per
// job. The table is the app's, chosen by CMake: dlo_app_av (libav: mp4, png, ffv1; latents in
// HDF5) or dlo_app_bare (frames as .safetensors; no libav, no HDF5) defines app_outputs(), and an
// executable links exactly one of them.
//
// Thread-safety: the table is immutable; check/open are thread-safe (open runs on a worker thread).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include <ATen/core/Tensor.h>

#include "dlo/config/job.h"
#include "dlo/pipeline/batch_plan.h"
#include "dlo/render/stages.h"

namespace dlo {

class MpiWorld;

struct OutputFormat {
  std::string name;       // the job field `format`'s value
  std::string extension;  // of a job's default output ("<id><extension>"); "" for a folder
  // Checks before any work that `job`'s output can be written in this format (the format's
  // options, the path) and that what it would replace is an output dlo wrote (never a manifest,
  // weights or someone's video). Throws dlo::Error naming the path or the option.
  std::function<void(const JobSpec& job, const ModelInfo& model)> check;
  // The sink of a job's frames (worker thread); its metadata records the job and its fingerprint.
  // Throws dlo::Error (the job then fails).
  std::function<std::unique_ptr<FrameSink>(const BatchJob& job, const ModelInfo& model, std::int64_t width,
                                           std::int64_t height, std::int64_t frames)>
      open;
  // The job an existing output at `path` records in its own metadata, when it is dlo's and whole
  // (every frame its metadata announces is there); nullopt otherwise. Resume reads it for a job
  // results.jsonl has no line for (its run stopped between writing the video and recording it).
  // `with_frames_sha256`: its frames' hash is wanted too (for the recovered job's results line):
  // from the metadata, or where the metadata has none and the format is lossless, from the
  // decoded frames.
  std::function<std::optional<RecordedJob>(const std::string& path, bool with_frames_sha256)> recorded;
};

// The final latents of a batch's jobs, all ranks writing one store.
class BatchLatents {
 public:
  virtual ~BatchLatents() = default;
  // Entry `position` (in the jobs the store was opened with) gets `latents` (any rank, any time).
  virtual void write(std::size_t position, const at::Tensor& latents) = 0;
};

struct AppOutputs {
  std::string build;                   // "dlo-generate" or "dlo-generate-bare", for messages
  std::vector<OutputFormat> formats;   // the first is the default
  // --save-latents for a batch: the file name it takes ("FILE.h5") and, collectively, the store
  // for `jobs`. Empty/null in a build without one: why not is `no_latents_store`.
  std::string latents_suffix;
  std::function<std::unique_ptr<BatchLatents>(const MpiWorld& world, const std::string& path, const ModelInfo& model,
                                              const std::vector<BatchJob>& jobs, const std::string& dtypes)>
      open_latents;
  // Rank 0, before the plan: the entries of an existing latents file, for resume (an empty index
  // when there is none yet). Throws dlo::Error for a file open_latents would refuse.
  std::function<LatentsIndex(const std::string& path)> read_latents;
  std::string no_latents_store;

  OutputFormatNames names() const;
  // The format named `name`; dlo::Error naming the choices otherwise.
  const OutputFormat& format(const std::string& name) const;
};

// This build's outputs (defined by dlo_app_av or dlo_app_bare).
const AppOutputs& app_outputs();

}  // namespace dlo
