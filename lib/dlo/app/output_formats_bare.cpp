// The output format of dlo-generate-bare, which travels to bare GPU machines and links neither
// libav nor HDF5: each job's frames as FILE.safetensors (tensor "frames", uint8 [frames, height,
// width, 3], the job's parameters as metadata, as --save-latents writes latents).
#include <sys/stat.h>

#include <cstring>
#include <optional>

#include "dlo/app/output_formats.h"
#include "dlo/common/error.h"
#include "dlo/common/file.h"
#include "dlo/io/safetensors.h"
#include "dlo/io/safetensors_writer.h"

namespace dlo {
namespace {

constexpr const char* kNoEncoder =
    "this build (dlo-generate-bare) has no video encoder and no HDF5: it writes frames as FILE.safetensors";

bool ends_with(const std::string& s, const std::string& tail) {
  return s.size() >= tail.size() && s.compare(s.size() - tail.size(), tail.size(), tail) == 0;
}

// The frames of one job, kept in memory and written as one tensor by finish() (a temporary renamed
// into place).
class FramesSink : public FrameSink {
 public:
  FramesSink(std::string path, std::int64_t w, std::int64_t h, std::int64_t frames, std::string parameters_json)
      : path_(std::move(path)), w_(w), h_(h), frames_(frames), parameters_(std::move(parameters_json)) {
    bytes_.reserve(static_cast<std::size_t>(frames * h * w * 3));
  }
  void add_frame(const std::uint8_t* rgb) override { bytes_.insert(bytes_.end(), rgb, rgb + w_ * h_ * 3); }
  void finish(const std::string& frames_sha256) override {
    const auto frame = static_cast<std::size_t>(w_ * h_ * 3);
    DLO_CHECK_KIND(ErrorKind::kInternal, bytes_.size() == frame * static_cast<std::size_t>(frames_), "'", path_, "': ",
                   bytes_.size() / frame, " frames decoded, ", frames_, " expected");
    write_safetensors_file(
        path_, {TensorSpec{"frames", DType::U8, {frames_, h_, w_, 3}}},
        [&](std::size_t, const TensorSpec& spec, std::byte* out) { std::memcpy(out, bytes_.data(), spec.nbytes()); },
        {{"format", "pt"}, {"dlo_job", with_frames_sha256(parameters_, frames_sha256)}});
  }

 private:
  std::string path_;
  std::int64_t w_, h_, frames_;
  std::string parameters_;
  std::vector<std::uint8_t> bytes_;
};

AppOutputs make() {
  AppOutputs a;
  a.build = "dlo-generate-bare";
  OutputFormat f;
  f.name = "safetensors";
  f.extension = ".safetensors";
  f.check = [](const JobSpec& job, const ModelInfo&) {
    DLO_CHECK(ends_with(job.output, ".safetensors"), "'", job.output, "' is not a .safetensors file: ", kNoEncoder,
              " (uint8 [frames, height, width, 3])");
    check_output_path(job.output);
    // An existing file is replaced only if dlo wrote it (its metadata holds the job): never a
    // model's weights. One that cannot be read is a damaged (cut) output: nothing to lose.
    struct stat st;
    const std::string target = resolve_output_path(job.output);
    if (::stat(target.c_str(), &st) == 0 && S_ISREG(st.st_mode) && st.st_size > 0) {
      std::optional<Checkpoint> c;
      try {
        c.emplace(Checkpoint::open(target));
      } catch (const Error&) {
      }
      DLO_CHECK(!c || (c->metadata().count("dlo_job") && read_recorded_job(c->metadata().at("dlo_job"))), "'", job.output,
                "' exists and is not frames dlo wrote (no dlo job in its metadata): dlo replaces only its own outputs; ",
                "choose another output or remove it");
    }
  };
  f.open = [](const BatchJob& job, const ModelInfo& model, std::int64_t w, std::int64_t h, std::int64_t frames) {
    return std::unique_ptr<FrameSink>(std::make_unique<FramesSink>(job.spec.output, w, h, frames,
                                                                   job_parameters_json(job.spec, model, job.fingerprint)));
  };
  // Whole when the reader accepts it (every tensor within the file) and "frames" has the count
  // the metadata announces.
  f.recorded = [](const std::string& path, bool) -> std::optional<RecordedJob> {
    try {
      const Checkpoint c = Checkpoint::open(resolve_output_path(path));
      const auto meta = c.metadata().find("dlo_job");
      if (meta == c.metadata().end()) return std::nullopt;
      const auto job = read_recorded_job(meta->second);
      const TensorInfo* t = c.find("frames");
      if (job && t != nullptr && !t->shape.empty() && t->shape[0] == job->frames) return job;
      return std::nullopt;
    } catch (const Error&) {
      return std::nullopt;
    }
  };
  a.formats.push_back(std::move(f));
  // The video formats of dlo-generate, known here only to be refused by name before any work.
  for (const char* name : {"mp4", "png", "ffv1"}) {
    OutputFormat v;
    v.name = name;
    v.extension = std::string(name) == "png" ? "" : std::string(".") + (std::string(name) == "ffv1" ? "mkv" : "mp4");
    v.check = [name](const JobSpec&, const ModelInfo&) { DLO_CHECK(false, "format '", name, "': ", kNoEncoder); };
    v.open = [name](const BatchJob&, const ModelInfo&, std::int64_t, std::int64_t, std::int64_t) -> std::unique_ptr<FrameSink> {
      DLO_CHECK(false, "format '", name, "': ", kNoEncoder);
    };
    a.formats.push_back(std::move(v));
  }
  a.no_latents_store = str("a batch keeps its latents in one HDF5 file; ", kNoEncoder);
  return a;
}

}  // namespace

const AppOutputs& app_outputs() {
  static const AppOutputs outputs = make();
  return outputs;
}

}  // namespace dlo
