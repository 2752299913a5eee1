#include "dlo/render/phase_groups.h"

#include <algorithm>

#include "dlo/common/error.h"
#include "dlo/mpi/mpi_world.h"

namespace dlo {

void PhaseGroups::release() {
  for (const auto* g : {group_.get(), half_.get(), partners_.get()})
    if (g != nullptr) earlier_bytes_ += g->bytes_sent();
  partners_.reset();
  half_.reset();
  group_.reset();
  ranks_.clear();
}

void PhaseGroups::form(const TopologyPlan& plan, std::size_t phase, c10::Device device) {
  release();
  const int me = world_.rank();
  const TopologyPhase& ph = plan.phases[phase];
  topo_ = ph.topology;
  std::vector<std::int64_t> mine = {static_cast<std::int64_t>(phase), ph.first, ph.count, topo_.group_size,
                                    topo_.cfg ? 1 : 0};
  const std::size_t n = mine.size();
  const std::vector<std::int64_t> all = world_.allgather(mine, "agreeing on the topology");
  for (int r = 0; r < world_.size(); ++r)
    DLO_CHECK_KIND(ErrorKind::kInternal,
                   std::equal(mine.begin(), mine.end(), all.begin() + static_cast<std::ptrdiff_t>(r * n)), "rank ", r,
                   " starts phase ", all[r * n], " (jobs ", all[r * n + 1], " + ", all[r * n + 2], ") with groups of ",
                   all[r * n + 3], " rank(s) (CFG ", all[r * n + 4], "), rank ", me, " phase ", mine[0], " (jobs ",
                   mine[1], " + ", mine[2], ") with groups of ", mine[3], " (CFG ", mine[4], ")");
  const int P = topo_.group_size;
  slot_ = me / P;
  leader_ = slot_ * P;
  if (P == 1) return;
  // Collective: every rank makes the network once (on CUDA, one NCCL communicator for activations).
  if (!net_) net_ = make_exchange_network(world_, device);
  group_ = net_->split(slot_, "job groups");
  if (topo_.cfg) {
    const int half = P / 2, at = me - leader_;
    half_ = net_->split(slot_ * 2 + at / half, "job groups' CFG halves");
    partners_ = net_->split(slot_ * half + at % half, "CFG partners");
  }
  for (int r = leader_; r < leader_ + P; ++r) ranks_.push_back(r);
}

bool PhaseGroups::ours(const JobAssignment& a) const {
  return std::find(a.ranks.begin(), a.ranks.end(), slot_) != a.ranks.end();
}

int PhaseGroups::decoder_of(std::int64_t position) const {
  return ranks_.empty() ? world_.rank() : ranks_[static_cast<std::size_t>(position % topo_.group_size)];
}

StepGroups PhaseGroups::step_groups() const {
  StepGroups g;
  g.group = group_.get();
  g.half = half_ && half_->size() > 1 ? half_.get() : nullptr;
  g.partners = partners_.get();
  return g;
}

void PhaseGroups::stamp(JobResult& result, bool guided) const {
  if (ranks_.empty()) return;
  result.ranks = ranks_;
  result.parallel = topo_.label(guided);
}

std::vector<RankReport> PhaseGroups::group_reports(const std::vector<RankReport>& reports) const {
  const int P = topo_.group_size;
  if (P == 1) return reports;
  std::vector<RankReport> groups;
  for (int g = 0; g < topo_.groups(world_.size()); ++g) {
    RankReport r = reports[static_cast<std::size_t>(g * P)];
    for (int m = 1; m < P; ++m) {
      const RankReport& member = reports[static_cast<std::size_t>(g * P + m)];
      r.stop = r.stop || member.stop;
      r.pending_results += member.pending_results;
      r.wants_job = r.wants_job && member.wants_job;
    }
    groups.push_back(r);
  }
  return groups;
}

std::uint64_t PhaseGroups::bytes_sent() const {
  std::uint64_t b = earlier_bytes_;
  for (const auto* g : {group_.get(), half_.get(), partners_.get()})
    if (g != nullptr) b += g->bytes_sent();
  return b;
}

}  // namespace dlo
