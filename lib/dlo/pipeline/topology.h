// How a batch's ranks are grouped into jobs: data parallelism (each rank its own job), sequence
// parallelism (a group of ranks splits one job's tokens, runner.h's forward_group) and CFG
// parallelism (a guided job's two branches on the two halves of a group, forward_cfg).
//
// A topology holds for a phase of the batch: the world's ranks form groups of `group_size`
// consecutive ranks ([0, P), [P, 2P), ...); the job scheduler hands the phase's jobs to groups as
// it would to ranks. In
// a group of P ranks with CFG parallelism a guided job runs its conditional branch on the first
// P/2 ranks and its unconditional one on the others, each half split along the sequence (SP
// P/2); an unguided job runs on all P along the sequence. Weights stay sharded over the whole
// world, so the topology moves no weights and never changes the frames.
//
// `auto`: a batch with at least as many jobs as ranks is data parallel (every rank busy, no
// exchange). With fewer jobs, a small cost model picks: each job costs its steps divided by the
// group's speedup (TopologyCosts: sp_efficiency per doubling of the SP degree and cfg_efficiency
// for a CFG pair, measured by tools/bench/bench_sequence_parallel.py), the jobs are listed in order onto the
// groups that free up first, and the shortest predicted batch wins, ties going to smaller groups.
// So a single prompt takes every rank. An explicit --sp or --cfg-parallel uses the cost model
// among the topologies it allows, whatever the batch, in one phase. The efficiencies are an input
// per kind of device (TopologyCosts): on a device without measured figures (CUDA, until figures
// measured on a GPU are committed) `auto` keeps what is safe: every rank its own job, or one group
// of all the ranks for a single job, and no tail phase; the reason says so.
//
// The tail (plan_topology): under auto a batch with at least as many jobs as ranks may end in a
// second phase. Its last K jobs (0 < K < ranks, and at least `ranks` jobs before them) wait until
// every earlier job is denoised, and then run on groups chosen for them as a batch of their own
// (fewer jobs than ranks), instead of leaving ranks idle beside the last jobs of a data-parallel
// batch. K is the cost model's: the first phase's list schedule plus the tail's, against data
// parallel throughout; the smallest K that predicts at least kTailGain less wins. The model counts
// denoising only (the text encoder and the VAE decode are not in it).
//
// Pure: no MPI, no torch (tests/pipeline/test_topology.cpp).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace dlo {

struct JobSpec;
struct ModelInfo;

// What the user asked for: --sp N|auto, --cfg-parallel on|off|auto.
struct TopologyRequest {
  int sp = 0;  // ranks along the sequence per branch; 0: auto
  enum class Cfg { kAuto, kOn, kOff } cfg = Cfg::kAuto;
};
// "auto" or a count >= 1; "on", "off" or "auto". Throw dlo::Error (kind input) naming `flag`.
int parse_sp(const std::string& text, const std::string& flag);
TopologyRequest::Cfg parse_cfg_parallel(const std::string& text, const std::string& flag);

// The cost model's figures for one kind of device: each doubling of the SP degree multiplies a
// job's speed by 2 x sp_efficiency, a CFG pair by 2 x cfg_efficiency. Measured by
// tools/bench/bench_sequence_parallel.py (SP 2 and CFG 2 against one rank, in one run).
struct TopologyCosts {
  std::string device = "cpu";
  double sp_efficiency = 0.69;   // CPU: SP 2 ran 1.38x one rank (docs/benchmarks.md)
  double cfg_efficiency = 0.92;  // CPU: CFG 2 ran 1.85x one rank
  bool measured = true;          // false: no figures for this device: auto keeps what is safe
};
// The figures committed for a kind of device: "cpu" (the values above); any other ("cuda"): none
// measured yet.
TopologyCosts topology_costs(const std::string& device_kind);

// What the topology must respect.
struct TopologyLimits {
  int ranks = 1;
  int heads = 1;                      // attention heads: the SP degree's upper bound
  std::vector<std::int64_t> steps;    // per runnable job
  std::vector<bool> guided;           // per runnable job
  std::vector<std::int64_t> tokens;   // per runnable job: the SP degree's upper bound
  std::vector<std::string> names;     // per runnable job, for refusals ("job 'ID'"); may be empty
  bool groups_supported = true;       // false: the device cannot exchange activations
  std::string unsupported_why;        // why not, for the refusal of an explicit request
  TopologyCosts costs;                // of the device the ranks compute on
};

struct Topology {
  int group_size = 1;  // P: ranks per job
  bool cfg = false;    // guided jobs on the two halves of a group
  double predicted = 0;   // the cost model's batch time, in single-rank steps
  double predicted_dp = 0;  // the same with every rank on its own job
  std::string reason;  // for the report: what was chosen and why
  int groups(int ranks) const { return ranks / group_size; }
  // The SP degree of a job: P/2 for a guided job in a CFG group, else P.
  int sp_of(bool guided) const { return cfg && guided ? group_size / 2 : group_size; }
  // "dp", "sp 2", "cfg 2", "cfg 2 x sp 2": how a job of that guidance is computed.
  std::string label(bool guided) const;
};

// The smallest share of a job's tokens a rank along the sequence may hold: below it, a GEMM of
// that few rows can take another kernel path than one rank's GEMM of every row and round
// differently (fp32 MKL on this CPU: shares of <= 3 rows at 1 thread, <= 11 at 2 or 8 threads;
// models/wan_transformer.h computes the ops that round by the whole tensor as the whole). Jobs
// whose shares would be smaller are never split by auto, and an explicit request is refused
// naming the job: the topology never changes a job's frames.
inline constexpr std::int64_t kMinShareTokens = 16;

// The speedup the cost model gives a job on `sp` ranks per branch, `cfg` on two branches' ranks.
double predicted_speedup(int sp, bool cfg, const TopologyCosts& costs = {});

// A tail phase must predict at least this fraction less than data parallel throughout (the
// model's speedups are measured, its list schedule is not: a marginal gain is not worth a phase).
inline constexpr double kTailGain = 0.05;

// The topology for the batch. An explicit request that cannot hold (P not dividing the ranks,
// more ranks along the sequence than heads, a job's tokens giving a rank along the sequence fewer
// than kMinShareTokens, groups on a device without the exchange) is a dlo::Error (kind input)
// naming the flag (and the job); auto only considers topologies that hold.
Topology choose_topology(const TopologyRequest& request, const TopologyLimits& limits);

// One phase of a batch: the runnable jobs [first, first + count), in order, on one topology.
struct TopologyPhase {
  std::int64_t first = 0, count = 0;
  Topology topology;
};
// The batch's phases (one, or a data-parallel phase and a tail; see the top) and, for the report,
// the predicted batch time and why. Errors as choose_topology.
struct TopologyPlan {
  std::vector<TopologyPhase> phases;
  double predicted = 0, predicted_dp = 0;  // in single-rank steps
  std::string reason;
};
TopologyPlan plan_topology(const TopologyRequest& request, const TopologyLimits& limits);

// The limits of `jobs` (valid for `model`: validate_job) on `ranks` ranks of a device with `costs`:
// the fewest attention heads of the model's experts, and each job's steps, guidance, tokens and id.
TopologyLimits topology_limits(const ModelInfo& model, const std::vector<const JobSpec*>& jobs, int ranks,
                               const TopologyCosts& costs);

// Whether `request` can hold for every job of `jobs` on `ranks` ranks, before anything is written
// (the run plans only the jobs it renders, which can only hold where all of them do). Throws as
// choose_topology.
void check_topology(const TopologyRequest& request, const ModelInfo& model, const std::vector<const JobSpec*>& jobs,
                    int ranks);

}  // namespace dlo
