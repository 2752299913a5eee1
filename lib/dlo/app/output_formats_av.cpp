// The output formats of dlo-generate: libav's (H.264 MP4, a folder of PNGs, FFV1 MKV) and a
// batch's latents in one parallel HDF5 file.
#include <ATen/ATen.h>

#include "dlo/app/output_formats.h"
#include "dlo/common/error.h"
#include "dlo/common/sha256.h"
#include "dlo/media/latents_h5.h"
#include "dlo/media/video_writer.h"

namespace dlo {
namespace {

VideoOptions video_options(const JobSpec& job, const ModelInfo& model, const std::string& fingerprint = "") {
  VideoOptions v;
  v.format = parse_video_format(job.format);
  v.fps = static_cast<int>(job.fps);
  v.crf = static_cast<int>(job.crf);
  v.preset = job.preset;
  v.threads = 1;
  v.tags = {{"comment", job_parameters_text(job, model)}, {"description", job_parameters_json(job, model, fingerprint)}};
  return v;
}

// The value of tag `name` ("" without one).
std::string tag(const std::vector<std::pair<std::string, std::string>>& tags, const std::string& name) {
  for (const auto& [k, t] : tags)
    if (k == name) return t;
  return "";
}

// The job's parameters in the "description" tag; the frames' hash joins them at the end (MP4,
// PNG: recovery reads it there; an MKV's tags precede its frames, so recovery hashes its lossless
// frames instead).
class VideoSink : public FrameSink {
 public:
  VideoSink(const std::string& path, std::int64_t w, std::int64_t h, const VideoOptions& o)
      : writer_(path, static_cast<int>(w), static_cast<int>(h), o), description_(tag(o.tags, "description")) {}
  void add_frame(const std::uint8_t* rgb) override { writer_.add_frame(rgb); }
  void finish(const std::string& frames_sha256) override {
    writer_.finish({{"description", with_frames_sha256(description_, frames_sha256)}});
  }

 private:
  VideoWriter writer_;
  std::string description_;
};

// An existing MP4/MKV is replaced only if dlo wrote it (its "description" tag holds the job); a
// damaged one (the container's signature, unreadable) may be, as nothing is lost. A PNG folder is
// replaced only if it holds nothing but frames and metadata.json (check_video_output).
void check_replaceable(const std::string& path, VideoFormat f) {
  if (f == VideoFormat::kPng) return;
  const ExistingVideo e = probe_video(path, f);
  DLO_CHECK(e.kind != ExistingVideo::kForeign, "'", path, "' exists and is not ", f == VideoFormat::kMp4 ? "an MP4" : "a Matroska",
            " file: dlo replaces only the videos it wrote; choose another output or remove it");
  DLO_CHECK(e.kind != ExistingVideo::kReadable || read_recorded_job(tag(e.tags, "description")), "'", path,
            "' exists and is a video dlo did not write (no dlo job in its metadata): dlo replaces only the videos it ",
            "wrote; choose another output or remove it");
}

OutputFormat video_format(VideoFormat f) {
  OutputFormat o;
  o.name = video_format_name(f);
  o.extension = video_format_extension(f);
  o.check = [f](const JobSpec& job, const ModelInfo& model) {
    check_video_output(job.output, video_options(job, model));
    check_replaceable(job.output, f);
  };
  o.open = [](const BatchJob& job, const ModelInfo& model, std::int64_t w, std::int64_t h, std::int64_t) {
    return std::unique_ptr<FrameSink>(
        std::make_unique<VideoSink>(job.spec.output, w, h, video_options(job.spec, model, job.fingerprint)));
  };
  o.recorded = [f](const std::string& path, bool with_frames_sha256) -> std::optional<RecordedJob> {
    const ExistingVideo e = probe_video(path, f);
    if (e.kind != ExistingVideo::kReadable) return std::nullopt;
    auto job = read_recorded_job(tag(e.tags, "description"));
    if (!job || job->frames != e.frames) return std::nullopt;
    if (with_frames_sha256 && job->frames_sha256.empty() && f != VideoFormat::kMp4) {
      // FFV1 and PNG give back the exact frames.
      const DecodedVideo v = read_video(path);
      Sha256 sha;
      sha.update(v.rgb.data(), v.rgb.size());
      job->frames_sha256 = sha.hex_digest();
    }
    return job;
  };
  return o;
}

class H5Latents : public BatchLatents {
 public:
  H5Latents(const MpiWorld& world, const std::string& path, const std::vector<LatentsEntry>& entries)
      : file_(world, path, entries) {}
  void write(std::size_t position, const at::Tensor& latents) override {
    const at::Tensor f = latents.to(at::kCPU, at::kFloat).contiguous();
    file_.write(position, f.data_ptr<float>());
  }

 private:
  LatentsFile file_;
};

AppOutputs make() {
  AppOutputs a;
  a.build = "dlo-generate";
  for (VideoFormat f : {VideoFormat::kMp4, VideoFormat::kPng, VideoFormat::kFfv1}) a.formats.push_back(video_format(f));
  a.latents_suffix = ".h5";
  a.open_latents = [](const MpiWorld& world, const std::string& path, const ModelInfo& model,
                      const std::vector<BatchJob>& jobs, const std::string&) {
    std::vector<LatentsEntry> entries;
    for (const auto& j : jobs)
      entries.push_back({j.spec.id, model.latent_shape(j.spec.frames, j.spec.height, j.spec.width),
                         {{"parameters_json", job_parameters_json(j.spec, model)}}, j.fingerprint});
    return std::unique_ptr<BatchLatents>(std::make_unique<H5Latents>(world, path, entries));
  };
  a.read_latents = [](const std::string& path) {
    LatentsIndex index{path, {}};
    for (const auto& [name, e] : read_latents_entries(path)) index.entries[name] = {e.fingerprint, e.complete};
    return index;
  };
  return a;
}

}  // namespace

const AppOutputs& app_outputs() {
  static const AppOutputs outputs = make();
  return outputs;
}

}  // namespace dlo
