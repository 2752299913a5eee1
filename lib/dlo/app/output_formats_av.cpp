// The output formats of dlo-generate: libav's (H.264 MP4, a folder of PNGs, FFV1 MKV) and a
// batch's latents in one parallel HDF5 file.
#include <ATen/ATen.h>

#include "dlo/app/output_formats.h"
#include "dlo/media/latents_h5.h"
#include "dlo/media/video_writer.h"

namespace dlo {
namespace {

VideoOptions video_options(const JobSpec& job, const ModelInfo& model) {
  VideoOptions v;
  v.format = parse_video_format(job.format);
  v.fps = static_cast<int>(job.fps);
  v.crf = static_cast<int>(job.crf);
  v.preset = job.preset;
  v.threads = 1;
  v.tags = {{"comment", job_parameters_text(job, model)}, {"description", job_parameters_json(job, model)}};
  return v;
}

class VideoSink : public FrameSink {
 public:
  VideoSink(const std::string& path, std::int64_t w, std::int64_t h, const VideoOptions& o)
      : writer_(path, static_cast<int>(w), static_cast<int>(h), o) {}
  void add_frame(const std::uint8_t* rgb) override { writer_.add_frame(rgb); }
  void finish() override { writer_.finish(); }

 private:
  VideoWriter writer_;
};

OutputFormat video_format(VideoFormat f) {
  OutputFormat o;
  o.name = video_format_name(f);
  o.extension = video_format_extension(f);
  o.check = [](const JobSpec& job, const ModelInfo& model) { check_video_output(job.output, video_options(job, model)); };
  o.open = [](const JobSpec& job, const ModelInfo& model, std::int64_t w, std::int64_t h, std::int64_t) {
    return std::unique_ptr<FrameSink>(std::make_unique<VideoSink>(job.output, w, h, video_options(job, model)));
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
  return a;
}

}  // namespace

const AppOutputs& app_outputs() {
  static const AppOutputs outputs = make();
  return outputs;
}

}  // namespace dlo
