// The groups of ranks of one phase of a batch (pipeline/topology.h): which group this rank is in,
// its leader, the communicators its steps exchange activations on, and how the group's reports
// become one report for the job scheduler, whose "ranks" are the groups.
//
// Without groups (group size 1) every rank is its own group and leader, and no communicator is
// made. A group's first rank (its leader) holds the group's jobs as a rank does in data
// parallelism and reports for the group; the others mirror them.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include <c10/core/Device.h>

#include "dlo/dist/exchange_group.h"
#include "dlo/mpi/mpi_world.h"
#include "dlo/pipeline/job_scheduler.h"
#include "dlo/pipeline/topology.h"
#include "dlo/render/stages.h"

namespace dlo {

class PhaseGroups {
 public:
  // `world` must outlive this.
  explicit PhaseGroups(const MpiWorld& world) : world_(world) {}

  // Collective: the groups of phase `phase` of `plan`. The ranks first compare what each is about
  // to start (the phase, its jobs, the group size, CFG): a rank that disagrees ends every rank with
  // both views (an internal error), before any group collective. The previous phase's groups are
  // released first. The communicators are made on `device`'s network (MPI on the CPU, NCCL on CUDA).
  void form(const TopologyPlan& plan, std::size_t phase, c10::Device device);

  const Topology& topology() const { return topo_; }
  int slot() const { return slot_; }      // this rank's group: the scheduler's rank
  bool leader() const { return world_.rank() == leader_; }
  int leader_rank() const { return leader_; }
  // The group's ranks (empty without groups).
  const std::vector<int>& ranks() const { return ranks_; }
  // Whether an assignment is this rank's group's.
  bool ours(const JobAssignment& a) const;
  // The rank of the group that decodes and records the job at scheduler position `position`
  // (every rank of the group holds its final latents): the group's ranks in turn, so that the
  // decodes, which run beside the group's next job, do not all queue on one rank.
  int decoder_of(std::int64_t position) const;
  // The communicators of this rank's group for denoise_step.
  StepGroups step_groups() const;
  // Stamps a job's result with the ranks that compute it and how (`guided`: the job uses guidance).
  void stamp(JobResult& result, bool guided) const;

  // The scheduler's reports, one per group, from every rank's report (in rank order): the
  // leader's, with a stop and pending results from any member, asking for a job only while every
  // member does (no member's VAE behind). Without groups: `reports` as they are.
  std::vector<RankReport> group_reports(const std::vector<RankReport>& reports) const;

  // Bytes this rank sent on every group it was in, over all phases so far.
  std::uint64_t bytes_sent() const;

 private:
  void release();

  const MpiWorld& world_;
  Topology topo_;
  int slot_ = 0, leader_ = 0;
  std::vector<int> ranks_;
  std::uint64_t earlier_bytes_ = 0;
  std::unique_ptr<ExchangeNetwork> net_;                     // declared first: outlives the groups
  std::unique_ptr<ExchangeGroup> group_, half_, partners_;  // the group, its CFG half, the CFG partners
};

}  // namespace dlo
