#include "dlo/pipeline/results.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>

#include <nlohmann/json.hpp>

#include "dlo/common/error.h"
#include "dlo/common/file.h"
#include "dlo/common/sha256.h"

namespace dlo {

using ojson = nlohmann::ordered_json;

std::string job_fingerprint(const JobSpec& job, const ModelInfo& model, const std::string& model_identity,
                            const std::string& dtypes) {
  // What the video is, not where it is: a folder of videos moved or copied keeps its fingerprints
  // (plan_resume checks the location itself), and the MP4 bytes, which carry it, do not depend on
  // the output folder.
  ojson fields = ojson::parse(job_output_fields_json(job, model));
  fields.erase("output");
  ojson j = {{"fingerprint_version", 3}, {"job", fields}, {"dtypes", dtypes}, {"model", model_identity}};
  // A job's own LoRAs by content too (the field gives their paths): only where it has some, so
  // other jobs' fingerprints stay what they were.
  if (!job.loras.empty()) {
    ojson files = ojson::array();
    for (const LoraSpec& l : parse_lora_list(job.loras, "loras")) files.push_back(file_identity(l.path));
    j["lora_files"] = files;
  }
  const std::string text = j.dump();
  return sha256_hex(text.data(), text.size()).substr(0, 16);
}

const char* job_status_name(JobStatus status) { return status == JobStatus::kOk ? "ok" : "failed"; }

JobStatus parse_job_status(const std::string& name) {
  if (name == "ok") return JobStatus::kOk;
  DLO_CHECK_KIND(ErrorKind::kInternal, name == "failed", "job status '", name, "' is not ok or failed");
  return JobStatus::kFailed;
}

std::string result_line(const JobResult& r) {
  ojson j = {{"id", r.id},
            {"index", r.index},
            {"status", job_status_name(r.status)},
            {"error", r.error},
            {"rank", r.rank},
            {"ranks", r.ranks.empty() ? std::vector<int>{r.rank} : r.ranks},
            {"parallel", r.parallel},
            {"output", r.output},
            {"output_bytes", r.output_bytes},
            {"fingerprint", r.fingerprint},
            {"frames_sha256", r.frames_sha256},
            {"frames", r.frames},
            {"height", r.height},
            {"width", r.width},
            {"timings", {{"text_s", r.text_s},
                         {"denoise_s", r.denoise_s},
                         {"decode_s", r.decode_s},
                         {"encode_s", r.encode_s},
                         {"step_s", r.step_s}}},
            {"memory", {{"rss_peak_kb", r.rss_peak_kb}, {"allocator_reserved_peak_bytes", r.allocator_reserved_peak_bytes}}},
            {"parameters", r.parameters_json.empty() ? ojson::object() : ojson::parse(r.parameters_json)},
            {"recovered", r.recovered}};
  return j.dump();
}

JobResult result_from_line(const std::string& line) {
  try {
    const ojson j = ojson::parse(line);
    JobResult r;
    r.id = j.at("id");
    r.index = j.at("index");
    r.status = parse_job_status(j.at("status").get<std::string>());
    r.error = j.at("error");
    r.rank = j.at("rank");
    r.ranks = j.value("ranks", std::vector<int>{r.rank});  // absent in lines of earlier versions
    r.parallel = j.value("parallel", std::string("dp"));
    r.output = j.at("output");
    r.output_bytes = j.value("output_bytes", std::int64_t{-1});  // absent in lines of earlier versions
    r.fingerprint = j.at("fingerprint");
    r.frames_sha256 = j.at("frames_sha256");
    r.frames = j.at("frames");
    r.height = j.at("height");
    r.width = j.at("width");
    const auto& t = j.at("timings");
    r.text_s = t.at("text_s");
    r.denoise_s = t.at("denoise_s");
    r.decode_s = t.at("decode_s");
    r.encode_s = t.at("encode_s");
    r.step_s = t.at("step_s").get<std::vector<double>>();
    r.rss_peak_kb = j.at("memory").at("rss_peak_kb");
    // Lines written before 0.1.0's GPU work name it device_peak_bytes.
    const auto& m = j.at("memory");
    r.allocator_reserved_peak_bytes = m.value("allocator_reserved_peak_bytes", m.value("device_peak_bytes", std::int64_t{-1}));
    r.parameters_json = j.at("parameters").dump();
    r.recovered = j.value("recovered", false);
    return r;
  } catch (const ojson::exception& e) {
    throw Error(str("not a job result line: ", e.what()), ErrorKind::kInternal);
  }
}

std::map<std::string, PastResult> read_results(const std::string& path) {
  std::map<std::string, PastResult> out;
  struct stat st;
  if (::stat(path.c_str(), &st) != 0 && errno == ENOENT) return out;
  const std::string text = read_file(path);
  std::size_t pos = 0;
  while (pos < text.size()) {
    const std::size_t nl = text.find('\n', pos);
    if (nl == std::string::npos) break;  // a cut last line: the job is not recorded
    const std::string line = text.substr(pos, nl - pos);
    pos = nl + 1;
    try {
      const ojson j = ojson::parse(line);
      out[j.at("id").get<std::string>()] = {parse_job_status(j.at("status").get<std::string>()), j.at("fingerprint"),
                                            j.at("output"), j.value("output_bytes", std::int64_t{-1})};
    } catch (const ojson::exception&) {
      // Not a record (hand-edited, foreign): skipped; the job is redone.
    } catch (const Error&) {
      // A status that is neither ok nor failed: the same.
    }
  }
  return out;
}

ResultsLog::ResultsLog(const std::string& path) : path_(resolve_output_path(path)) {
  fd_ = ::open(path_.c_str(), O_RDWR | O_APPEND | O_CREAT | O_CLOEXEC, 0644);
  DLO_CHECK_IO(fd_ >= 0, "cannot open '", path_, "' for appending: ", std::strerror(errno));
  // A line cut by a crash ends here, so that it cannot swallow the next record.
  struct stat st;
  char last = '\n';
  if (::fstat(fd_, &st) == 0 && st.st_size > 0 && ::pread(fd_, &last, 1, st.st_size - 1) == 1 && last != '\n')
    DLO_CHECK_IO(::write(fd_, "\n", 1) == 1, "appending to '", path_, "': ", std::strerror(errno));
}

ResultsLog::~ResultsLog() {
  if (fd_ >= 0) ::close(fd_);
}

void ResultsLog::append(const std::string& line) {
  const std::string text = line + "\n";
  // One write: with O_APPEND the line lands whole after what is there; a short write (disk full)
  // is an error and is cut back, so no partial line stays before the next one.
  struct stat st;
  DLO_CHECK_IO(::fstat(fd_, &st) == 0, "'", path_, "': ", std::strerror(errno));
  const ssize_t n = ::write(fd_, text.data(), text.size());
  if (n != static_cast<ssize_t>(text.size())) {
    const int e = errno;
    if (::ftruncate(fd_, st.st_size) != 0) {
      // Nothing more to do: the reader skips a cut last line.
    }
    DLO_CHECK_IO(false, "appending to '", path_, "': ", n < 0 ? std::strerror(e) : "short write (disk full?)");
  }
  DLO_CHECK_IO(::fdatasync(fd_) == 0 || errno == EINVAL, "syncing '", path_, "': ", std::strerror(errno));
}

}  // namespace dlo
