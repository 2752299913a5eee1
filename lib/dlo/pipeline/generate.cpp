#include "dlo/pipeline/generate.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <mutex>
#include <optional>
#include <thread>

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <nlohmann/json.hpp>

#include "dlo/common/error.h"
#include "dlo/common/memory.h"
#include "dlo/common/sha256.h"
#include "dlo/dist/collective.h"
#include "dlo/dist/device.h"
#include "dlo/dist/mpi_world.h"
#include "dlo/io/safetensors_writer.h"
#include "dlo/io/tensor_view.h"
#include "dlo/models/wan_transformer.h"
#include "dlo/models/wan_vae.h"
#include "dlo/offload/runner.h"
#include "dlo/offload/strategy.h"
#include "dlo/pipeline/prompt_encoder.h"

namespace dlo {
namespace {

using Clock = std::chrono::steady_clock;
using json = nlohmann::ordered_json;

double since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

// One job on its rank, from assignment to its result.
struct Work {
  std::int64_t index = -1;
  const JobSpec* job = nullptr;
  JobResult result;
  at::Tensor context, negative_context;  // [1, 512, text_dim], transformer dtype, on the device
  at::Tensor latents;                    // [1, C, F, h, w] on the device
  std::unique_ptr<NoiseScheduler> scheduler;
  std::atomic<bool> ready{false};        // prepared by the worker (prompts encoded, or failed)
  std::int64_t steps_done = 0;

  bool failed() const { return result.status != "ok"; }
  std::int64_t steps_left() const { return job->steps - steps_done; }
};

// The rank's background thread: prepares jobs (text) and finishes them (decode, write). Tasks run
// in the order posted. The models it needs are loaded on first use and kept.
class Worker {
 public:
  Worker() : thread_([this] { loop(); }) {}
  ~Worker() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      quit_ = true;
    }
    cv_.notify_all();
    thread_.join();
  }
  Worker(const Worker&) = delete;
  Worker& operator=(const Worker&) = delete;

  void post(std::function<void()> task) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      tasks_.push_back(std::move(task));
    }
    cv_.notify_all();
  }
  // Blocks until every posted task has run.
  void drain() {
    std::unique_lock<std::mutex> lock(mu_);
    idle_cv_.wait(lock, [this] { return tasks_.empty() && !running_; });
  }
  // Results of finished jobs, taken by the main thread.
  void push_result(JobResult r) {
    std::lock_guard<std::mutex> lock(mu_);
    results_.push_back(std::move(r));
  }
  std::vector<JobResult> take_results() {
    std::lock_guard<std::mutex> lock(mu_);
    std::vector<JobResult> out(std::make_move_iterator(results_.begin()), std::make_move_iterator(results_.end()));
    results_.clear();
    return out;
  }

  std::optional<PromptEncoder> text;  // worker thread only
  std::optional<WanVae> vae;          // worker thread only

 private:
  void loop() {
    std::unique_lock<std::mutex> lock(mu_);
    for (;;) {
      cv_.wait(lock, [this] { return quit_ || !tasks_.empty(); });
      if (tasks_.empty()) return;
      auto task = std::move(tasks_.front());
      tasks_.pop_front();
      running_ = true;
      lock.unlock();
      task();  // tasks catch their own errors
      lock.lock();
      running_ = false;
      if (tasks_.empty()) idle_cv_.notify_all();
    }
  }

  std::mutex mu_;
  std::condition_variable cv_, idle_cv_;
  std::deque<std::function<void()>> tasks_;
  std::deque<JobResult> results_;
  bool running_ = false, quit_ = false;
  std::thread thread_;
};

std::string describe(const std::vector<FieldError>& errors, const JobSpec& job, std::int64_t index) {
  std::string s = str("job ", index, " ('", job.id, "'):");
  for (const auto& e : errors) s += str("\n  ", e.field, ": ", e.message);
  return s;
}

// Worker: the job's prompts through the text encoder, its latents and scheduler.
void prepare(Work& w, Worker& worker, const ModelInfo& model, const GenerateOptions& o, c10::Device device) {
  const auto t0 = Clock::now();
  try {
    with_context(str("job '", w.job->id, "': encoding the prompt"), [&] {
      if (!worker.text) worker.text.emplace(model.dir, o.dtype);
      w.context = worker.text->encode(w.job->prompt).to(device, o.dtype);
      if (w.job->guided()) w.negative_context = worker.text->encode(w.job->negative_prompt).to(device, o.dtype);
    });
    w.scheduler = make_noise_scheduler(job_scheduler_config(*w.job, model));
    w.scheduler->set_timesteps(w.job->steps);
    w.latents = initial_latents(model.latent_shape(*w.job), w.job->seed).to(device);
  } catch (const std::exception& e) {
    w.result.status = "failed";
    w.result.error = e.what();
  }
  w.result.text_s = since(t0);
  w.ready.store(true, std::memory_order_release);
}

// One denoising step of WanPipeline's loop, the transformer's blocks coming from the engine.
void denoise_step(Work& w, WanOffloadRunner& runner, const GenerateOptions& o) {
  const std::int64_t i = w.scheduler->step_index();
  const at::Tensor x = w.latents.to(o.dtype);
  const at::Tensor t = w.scheduler->timesteps()[i].to(x.device()).expand({x.size(0)});
  std::vector<WanBranchInputs> branches{{x, t, w.context}};
  if (w.job->guided()) branches.push_back({x, t, w.negative_context});
  DLO_CHECK(!(w.index == o.fail_job && i + 1 == o.fail_step), "injected failure (test hook)");
  const std::vector<at::Tensor> out = runner.forward(branches);
  at::Tensor noise = out[0];
  if (w.job->guided()) noise = out[1] + w.job->guidance * (out[0] - out[1]);
  w.latents = w.scheduler->step(noise, w.latents);
}

void save_latents_safetensors(const JobSpec& job, const ModelInfo& model, const at::Tensor& latents) {
  const at::Tensor lat = latents.to(at::kCPU).contiguous();
  std::vector<std::int64_t> shape(lat.sizes().begin(), lat.sizes().end());
  write_safetensors_file(
      job.save_latents, {TensorSpec{"latents", from_scalar_type(lat.scalar_type()), shape}},
      [&](std::size_t, const TensorSpec& spec, std::byte* out) { std::memcpy(out, lat.data_ptr(), spec.nbytes()); },
      {{"format", "pt"}, {"dlo_job", job_parameters_json(job, model)}});
}

// Worker: keep the latents, decode them chunk by chunk into uint8 frames, the sink and the hash.
void finish(Work& w, Worker& worker, const ModelInfo& model, const GenerateOptions& o, const GenerateCallbacks& cb) {
  const auto t0 = Clock::now();
  try {
    with_context(str("job '", w.job->id, "'"), [&] {
      if (cb.save_latents)
        cb.save_latents(*w.job, w.index, w.latents);
      else if (!w.job->save_latents.empty())
        save_latents_safetensors(*w.job, model, w.latents);
      if (!worker.vae) worker.vae.emplace(WanVae::load(model.dir + "/vae", o.vae_dtype));
      const WanVae& vae = *worker.vae;
      const at::Tensor z = vae.denormalize(w.latents.to(at::kCPU));
      w.latents = at::Tensor();
      const std::int64_t frames = vae.config().output_frames(z.size(2));
      const std::int64_t height = z.size(3) * vae.config().scale_factor_spatial;
      const std::int64_t width = z.size(4) * vae.config().scale_factor_spatial;
      double sink_s = 0;
      auto timed = [&](auto&& fn) {
        const auto s0 = Clock::now();
        fn();
        sink_s += since(s0);
      };
      std::unique_ptr<FrameSink> sink;
      if (cb.open_sink) timed([&] { sink = cb.open_sink(*w.job, width, height, frames); });
      Sha256 sha;
      const auto frame_bytes = static_cast<std::size_t>(height * width * 3);
      vae.decode_frames(z, [&](std::int64_t, const at::Tensor& chunk) {
        const at::Tensor u8 = frames_to_uint8(chunk);
        for (std::int64_t f = 0; f < u8.size(0); ++f) {
          const std::uint8_t* p = u8[f].data_ptr<std::uint8_t>();
          sha.update(p, frame_bytes);
          if (sink) timed([&] { sink->add_frame(p); });
        }
      });
      if (sink) timed([&] { sink->finish(); });
      w.result.frames_sha256 = sha.hex_digest();
      w.result.frames = frames;
      w.result.height = height;
      w.result.width = width;
      w.result.encode_s = sink_s;
    });
  } catch (const std::exception& e) {
    w.result.status = "failed";
    w.result.error = e.what();
  }
  w.result.decode_s = since(t0);
  w.result.rss_peak_kb = read_process_memory().hwm_kb;
}

// The per-pass exchange: a few numbers per rank.
enum Field : std::size_t { kWants, kStop, kBusy, kResults, kJob, kStep, kFields };

}  // namespace

at::Tensor initial_latents(const std::vector<std::int64_t>& shape, std::uint64_t seed) {
  at::Generator gen = at::make_generator<at::CPUGeneratorImpl>(seed);
  return at::randn(shape, gen, at::TensorOptions().dtype(at::kFloat));
}

at::Tensor frames_to_uint8(const at::Tensor& chunk) {
  DLO_ASSERT(chunk.dim() == 5 && chunk.size(0) == 1 && chunk.size(1) == 3, "chunk ", chunk.sizes());
  // [1, 3, n, H, W] -> [n, 3, H, W] as postprocess_video permutes; elementwise ops do not care.
  const at::Tensor x = (chunk[0].permute({1, 0, 2, 3}) * 0.5 + 0.5).clamp(0, 1);
  return (x.to(at::kFloat) * 255).to(at::kByte).permute({0, 2, 3, 1}).contiguous().to(at::kCPU);
}

std::string dtypes_label(const GenerateOptions& o) {
  return str(compute_dtype_name(o.dtype), "/", compute_dtype_name(o.vae_dtype));
}

std::string report_json(const GenerateReport& report) {
  json j = {{"choice", report.choice}, {"stopped", report.stopped}, {"jobs", json::array()}};
  for (const auto& r : report.jobs) j["jobs"].push_back(json::parse(result_line(r)));
  j["ranks"] = report.ranks_json.empty() ? json::array() : json::parse(report.ranks_json);
  return j.dump(2);
}

GenerateReport generate(const MpiWorld& world, const ModelInfo& model, const std::vector<JobSpec>& jobs,
                        const GenerateOptions& o, const GenerateCallbacks& cb) {
  auto phase = [&](const char* name) {
    if (cb.on_phase) cb.on_phase(name);
  };
  const int me = world.rank(), ranks = world.size();
  const auto total = static_cast<std::int64_t>(jobs.size());
  const std::string dtypes = dtypes_label(o);
  const ProcessMemory at_start = read_process_memory();
  const auto wall_t0 = Clock::now();

  // Checks, then this rank's first job's prompts, before any block weight is packed.
  std::string error;
  c10::Device device = c10::kCPU;
  std::optional<WanTransformer> transformer;
  std::unique_ptr<WanOffloadRunner> runner;
  // Two workers, so a decode (seconds) never holds up the next job's prompts (a fraction of that).
  Worker text_worker, decode_worker;
  std::unique_ptr<Work> current, next;
  auto assign = [&](std::int64_t index) {
    auto w = std::make_unique<Work>();
    w->index = index;
    w->job = &jobs[static_cast<std::size_t>(index)];
    w->result.id = w->job->id;
    w->result.index = index;
    w->result.rank = me;
    w->result.output = w->job->output;
    w->result.parameters_json = job_parameters_json(*w->job, model);
    w->result.fingerprint = job_fingerprint(*w->job, model, dtypes);
    Work* raw = w.get();
    text_worker.post([raw, &text_worker, &model, &o, device] { prepare(*raw, text_worker, model, o, device); });
    return w;
  };
  try {
    device = pick_device(o.device, world, "device");
  } catch (const Error& e) {
    error = e.what();
  }
  world.check_all(error, "start-up check (device)");
  // Two ranks on one GPU: refused now, before anything is loaded (NCCL would refuse them later).
  const DeviceSharing sharing = device_sharing(world, device, o.host_id);
  check_exclusive_devices(world, device, sharing);
  try {
    for (std::int64_t i = 0; i < total; ++i) {
      const auto errors = validate_job(jobs[static_cast<std::size_t>(i)], model);
      DLO_CHECK(errors.empty(), describe(errors, jobs[static_cast<std::size_t>(i)], i));
    }
    transformer.emplace(WanTransformer::load(model.dir + "/transformer", o.dtype, /*load_blocks=*/false));
    transformer->to_device(device);
    runner = std::make_unique<WanOffloadRunner>(*transformer, ranks);
  } catch (const Error& e) {
    error = e.what();
  }
  world.check_all(error);
  // The first jobs go to ranks 0..N-1; their prompts are encoded before the engine's slots exist.
  std::int64_t next_job = std::min<std::int64_t>(ranks, total);
  if (me < total) {
    phase("text");
    next = assign(me);
    text_worker.drain();
  }
  (void)agree_wave(world, 0, runner->plan().fingerprint());  // same block layout everywhere

  // The strategy, from budgets every rank agreed on, for the largest job's working memory.
  std::uint64_t working = 0;
  const auto& c = transformer->config();
  for (const auto& j : jobs) {
    const auto shape = model.latent_shape(j);
    working = std::max(working, wan_forward_working_bytes(c, shape[2], shape[3], shape[4], /*text tokens, as PromptEncoder pads*/ 512,
                                                          j.guided() ? 2 : 1, o.dtype));
  }
  const StrategyChoice choice =
      agree_strategy(world, o.offload, runner->plan(), working, device, sharing, o.device_budget);
  GenerateReport report;
  report.choice = str("offload: ", strategy_name(choice.strategy), " (", choice.reason, "); device ", device.str(), "; ",
                      ranks, " rank(s)");

  // The engine. A failure here would strand the other ranks in a gather.
  try {
    std::unique_ptr<Collective> collective;
    if (is_sharded(choice.strategy) && ranks > 1)
      collective = device.is_cuda() ? make_nccl_collective(world, device.index()) : make_mpi_collective(world);
    EngineOptions eo;
    eo.strategy = choice.strategy;
    eo.device_blocks = choice.device_blocks;
    eo.gather_timeout_s = world.timeout_s();
    eo.device = device;
    eo.keep_page_cache = o.keep_page_cache;
    runner->start(eo, std::move(collective));
  } catch (const std::exception& e) {
    MpiWorld::abort(str(world.tag(), " setting up the offload engine: ", e.what()));
  }
  // Ranks finish packing their shards at different times; the gathers' timeout counts from here.
  world.barrier("engine start (every rank packed its shards)");

  // The wave.
  phase("denoise");
  const auto blocks = static_cast<std::uint64_t>(runner->plan().num_blocks());
  std::vector<std::string> pending;  // this rank's result lines not yet at rank 0
  std::int64_t done = 0, failed = 0, traversals = 0, ghosts = 0, idle = 0;
  double sync_s = 0, text_est_s = 0, step_est_s = 0;
  std::vector<std::int64_t> rank_job(static_cast<std::size_t>(ranks), -1), rank_step(rank_job.size(), 0);
  std::vector<std::int64_t> remaining_steps(static_cast<std::size_t>(total));
  for (std::int64_t i = 0; i < total; ++i) remaining_steps[static_cast<std::size_t>(i)] = jobs[static_cast<std::size_t>(i)].steps;
  auto record = [&](JobResult r) {
    if (r.status != "ok") r.error = str("job ", r.index, " ('", r.id, "'): ", r.error);
    pending.push_back(result_line(r));
    if (me != 0) report.jobs.push_back(std::move(r));
  };
  // Results of all ranks to rank 0 (collective; called by every rank when any has some).
  auto collect = [&](const char* phase_name) {
    std::string mine;
    for (const auto& l : pending) mine += l + "\n";
    pending.clear();
    const auto all = world.gather_strings(mine, 0, phase_name);
    if (me != 0) return;
    for (const auto& text : all) {
      std::size_t pos = 0;
      while (pos < text.size()) {
        const std::size_t nl = text.find('\n', pos);
        JobResult r = result_from_line(text.substr(pos, nl - pos));
        pos = nl + 1;
        (r.status == "ok" ? done : failed) += 1;
        remaining_steps[static_cast<std::size_t>(r.index)] = 0;
        if (cb.on_result) cb.on_result(r);
        report.jobs.push_back(std::move(r));
      }
    }
  };
  for (std::int64_t pass = 0;; ++pass) {
    // This rank's state at the boundary.
    for (auto& r : decode_worker.take_results()) record(std::move(r));
    if (!current && next && next->ready.load(std::memory_order_acquire)) {
      current = std::move(next);
      text_est_s = current->result.text_s;
      if (current->failed()) {  // its prompts could not be encoded
        record(current->result);
        current.reset();
      }
    }
    // Ask for the next job early enough that its prompts are encoded when this one ends: at once
    // while more jobs wait than there are ranks; near the end only when this job is about to end,
    // so the last jobs go to whichever rank frees up first.
    const bool wants =
        !next && (!current || total - next_job > ranks ||
                  (step_est_s > 0 ? static_cast<double>(current->steps_left()) * step_est_s <= text_est_s + step_est_s
                                  : current->steps_left() <= 1));
    std::vector<std::int64_t> status(kFields, 0);
    status[kWants] = wants;
    status[kStop] = cb.stop_requested && cb.stop_requested();
    status[kBusy] = current || next;
    status[kResults] = static_cast<std::int64_t>(pending.size());
    status[kJob] = current ? current->index : -1;
    status[kStep] = current ? current->steps_done : 0;
    const auto s0 = Clock::now();
    const std::vector<std::int64_t> all = world.allgather(status, "pass boundary");
    sync_s += since(s0);
    auto at = [&](int r, Field f) { return all[static_cast<std::size_t>(r) * kFields + f]; };

    bool any_results = false, stop = false, busy = false, anyone_computes = false;
    for (int r = 0; r < ranks; ++r) {
      any_results |= at(r, kResults) > 0;
      anyone_computes |= at(r, kJob) >= 0;
      stop |= at(r, kStop) != 0;
      busy |= at(r, kBusy) != 0;
      rank_job[static_cast<std::size_t>(r)] = at(r, kJob);
      rank_step[static_cast<std::size_t>(r)] = at(r, kStep);
    }
    if (any_results) collect("collecting results");
    if (stop) {
      report.stopped = true;
      break;
    }
    // Next jobs, in rank order, to the ranks that asked: every rank computes the same.
    bool assigned = false;
    for (int r = 0; r < ranks && next_job < total; ++r) {
      if (!at(r, kWants)) continue;
      if (r == me) next = assign(next_job);
      ++next_job;
      assigned = true;
    }
    if (!busy && !assigned && next_job >= total) break;  // nothing left to denoise anywhere

    if (me == 0 && cb.on_progress) {
      ProgressEvent ev{pass, total, done, failed, rank_job, rank_step, -1};
      if (step_est_s > 0) {
        double steps_left = 0;
        for (std::int64_t i = 0; i < total; ++i) steps_left += static_cast<double>(remaining_steps[static_cast<std::size_t>(i)]);
        for (int r = 0; r < ranks; ++r)
          if (at(r, kJob) >= 0) steps_left -= static_cast<double>(at(r, kStep));
        ev.eta_s = steps_left * step_est_s / ranks;
      }
      cb.on_progress(ev);
    }

    if (!anyone_computes) {
      // Every rank waits for its next job's prompts: no traversal (it would stream weights for
      // nothing); wait a little for this rank's worker, then meet again.
      const auto until = Clock::now() + std::chrono::milliseconds(20);
      while (next && !next->ready.load(std::memory_order_acquire) && Clock::now() < until)
        std::this_thread::sleep_for(std::chrono::microseconds(200));
      if (!next) std::this_thread::sleep_for(std::chrono::milliseconds(2));
      continue;
    }

    // One traversal: a step of this rank's job, or a ghost pass.
    const auto t0 = Clock::now();
    const bool compute = current != nullptr;
    const std::uint64_t acquired0 = runner->engine().stats().blocks_acquired;
    try {
      if (compute) {
        denoise_step(*current, *runner, o);
        if (device.is_cuda()) (void)current->latents.flatten()[0].item<float>();  // the step's time is real
        current->result.allocator_reserved_peak_bytes = device_memory(device).allocator_reserved_peak;
      } else {
        runner->ghost();
      }
    } catch (const std::exception& e) {
      // A failure of the job's own computation fails the job; the rank keeps joining the
      // gathers. A failure inside a transfer leaves the collective out of step: that ends every rank.
      const std::uint64_t acquired = runner->engine().stats().blocks_acquired - acquired0;
      if (!compute || (acquired != 0 && acquired != blocks))
        MpiWorld::abort(str(world.tag(), " pass ", pass, ": ", e.what()));
      if (acquired == 0) runner->ghost();
      current->result.status = "failed";
      current->result.error = str("denoising step ", current->steps_done + 1, ": ", e.what());
    }
    ++traversals;
    if (!compute) {
      ++ghosts;
      if (next_job < total || next) ++idle;  // work existed, this rank was not ready for it
      continue;
    }
    const double s = since(t0);
    if (current->failed()) {
      record(current->result);
      current.reset();
      continue;
    }
    ++current->steps_done;
    current->result.step_s.push_back(s);
    current->result.denoise_s += s;
    step_est_s = step_est_s == 0 ? s : 0.8 * step_est_s + 0.2 * s;
    if (cb.on_step) cb.on_step({current->job->id, current->index, current->steps_done, current->job->steps, s});
    if (current->steps_left() == 0) {
      Work* raw = current.release();
      decode_worker.post([raw, &decode_worker, &model, &o, &cb] {
        std::unique_ptr<Work> w(raw);
        finish(*w, decode_worker, model, o, cb);
        decode_worker.push_result(std::move(w->result));
      });
    }
  }
  const EngineStats es = runner->engine().stats();
  const double wave_s = since(wall_t0);
  runner.reset();  // frees the slots (and shards) before the last decodes need memory
  transformer.reset();

  // What the worker still holds: decodes finish (their latents are complete); after a stop, a
  // job being denoised or prepared is left for the rerun.
  phase("decode");
  text_worker.drain();
  decode_worker.drain();
  for (auto& r : decode_worker.take_results()) record(std::move(r));
  current.reset();
  next.reset();
  collect("collecting the last results");

  const ProcessMemory end = read_process_memory();
  const DeviceMemory dm = device_memory(device);
  json mine = {{"rank", me},
               {"host", world.host()},
               {"local_rank", world.local_rank()},
               {"device", device.str()},
               {"traversals", traversals},
               {"ghost_traversals", ghosts},
               {"idle_traversals", idle},
               {"boundary_wait_s", sync_s},
               {"wave_s", wave_s},
               {"working_bytes_estimate", working},
               {"device_blocks", choice.device_blocks},
               {"device_total_bytes", dm.total},
               {"device_used_bytes_at_end", dm.used},
               {"allocator_reserved_peak_bytes", dm.allocator_reserved_peak},
               {"allocator_allocated_peak_bytes", dm.allocator_allocated_peak},
               {"rss_kb_at_start", at_start.rss_kb},
               {"rss_kb", end.rss_kb},
               {"rss_peak_kb", end.hwm_kb}};
  mine.update(json::parse(engine_stats_json(es)));
  const auto all = world.gather_strings(mine.dump(), 0, "collecting rank facts");
  if (me == 0) {
    json arr = json::array();
    for (const auto& s : all) arr.push_back(json::parse(s));
    report.ranks_json = arr.dump(2);
    std::sort(report.jobs.begin(), report.jobs.end(),
              [](const JobResult& a, const JobResult& b) { return a.index < b.index; });
  }
  return report;
}

}  // namespace dlo
