// A batch's record of what it did: results.jsonl, one JSON line per finished or failed job,
// appended (and synced) as results arrive, and read back to resume a batch.
//
// A line is whole or absent: each is written with one append and synced, and a reader ignores a
// last line without its newline (a crash mid-write). The last line of a job id wins.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "dlo/config/job.h"

namespace dlo {

// A job's outcome: "ok" or "failed" in results.jsonl.
enum class JobStatus { kOk, kFailed };
const char* job_status_name(JobStatus status);
// The status named `name`; throws dlo::Error (internal) for any other text.
JobStatus parse_job_status(const std::string& name);

// What happened to one job: its results.jsonl line.
struct JobResult {
  std::string id;
  std::int64_t index = -1;    // in the batch
  JobStatus status = JobStatus::kOk;
  std::string error;          // failed: why
  int rank = 0;                // the rank that decoded and wrote it (its group's first)
  std::vector<int> ranks;      // every rank that denoised it (empty: `rank` alone)
  std::string parallel = "dp"; // how: dp, sp N, cfg 2, cfg 2 x sp N (pipeline/topology.h)
  std::string output;
  std::int64_t output_bytes = -1;  // the output's size when written (a folder: its files'); -1: unknown
  std::string fingerprint;    // job_fingerprint()
  std::string frames_sha256;  // of the uint8 frames, in order
  std::int64_t frames = 0, height = 0, width = 0;
  double text_s = 0, denoise_s = 0, decode_s = 0, encode_s = 0;  // encode: the writer's share of decode
  std::vector<double> step_s;
  std::int64_t rss_peak_kb = -1, allocator_reserved_peak_bytes = -1;  // the second: CUDA's caching allocator, process peak so far
  std::string parameters_json;  // job_parameters_json()
  // Recorded by a later run from the output's own metadata (the run that rendered it stopped
  // before recording it): no timings or memory; frames_sha256 as the output records it, or as its
  // lossless frames decode (MKV); "" for an MP4 or .safetensors an earlier dlo wrote without it.
  bool recovered = false;

  bool ok() const { return status == JobStatus::kOk; }
};

// The fingerprint of everything that decides a job's output bytes: 16 hex digits of a sha256 over
// the fields the job table marks as deciding the frames or the video file (with their effective
// values: the folder's scheduler and shift where the job sets none, no negative prompt without
// guidance), the compute dtypes, and `model_identity`
// (model_identity(): what the model folder holds, not where it is). Not the output's location: it
// says what a video is (the MP4 carries it), and plan_resume checks where it is. A job whose
// fingerprint changed renders a different video.
std::string job_fingerprint(const JobSpec& job, const ModelInfo& model, const std::string& model_identity,
                            const std::string& dtypes);

// One line of results.jsonl for `result` (no newline), and back. result_from_line throws
// dlo::Error for a line that is not such a record.
std::string result_line(const JobResult& result);
JobResult result_from_line(const std::string& line);

// What an earlier run recorded for each job id: the last line's status, fingerprint and output.
struct PastResult {
  JobStatus status = JobStatus::kFailed;
  std::string fingerprint, output;
  std::int64_t output_bytes = -1;  // -1: not recorded (lines of earlier versions)
};
// Reads `path` (absent: empty). Lines that do not parse (a cut last line) are skipped. Throws
// dlo::Error naming the file for an unreadable one.
std::map<std::string, PastResult> read_results(const std::string& path);

// results.jsonl opened for appending. Not thread-safe; one writer (rank 0).
class ResultsLog {
 public:
  // Opens (creates) `path` for appending. Throws dlo::Error naming the file.
  explicit ResultsLog(const std::string& path);
  ~ResultsLog();
  ResultsLog(const ResultsLog&) = delete;
  ResultsLog& operator=(const ResultsLog&) = delete;
  // Appends `line` + '\n' with one write and syncs it. Throws dlo::Error (disk full, ...).
  void append(const std::string& line);
  const std::string& path() const { return path_; }

 private:
  std::string path_;
  int fd_ = -1;
};

}  // namespace dlo
