#include "dlo/offload/runner.h"

#include <algorithm>
#include <climits>
#include <cstring>

#include <ATen/ATen.h>
#include <nlohmann/json.hpp>

#include "dlo/common/bytes.h"
#include "dlo/common/error.h"
#include "dlo/common/partition.h"
#include "dlo/dist/exchange_group.h"
#include "dlo/dist/sequence_exchange.h"
#include "dlo/mpi/mpi_world.h"
#include "dlo/models/tensor_view.h"
#include "dlo/models/torch_errors.h"
#include "dlo/models/wan_transformer.h"

namespace dlo {

std::string engine_stats_json(const EngineStats& s) {
  return nlohmann::ordered_json({{"strategy", s.strategy},
                                 {"host_bytes", s.host_bytes},
                                 {"pinned_bytes", s.pinned_bytes},
                                 {"device_shard_bytes", s.device_shard_bytes},
                                 {"slot_bytes", s.slot_bytes},
                                 {"device_bytes", s.device_bytes},
                                 {"bytes_streamed", s.bytes_streamed},
                                 {"h2d_bytes", s.h2d_bytes},
                                 {"bytes_gathered", s.bytes_gathered},
                                 {"blocks_acquired", s.blocks_acquired},
                                 {"exposed_wait_s", s.exposed_wait_s},
                                 {"entry_wait_s", s.entry_wait_s},
                                 {"pack_s", s.pack_s}})
      .dump();
}

EngineStats sum_engine_stats(const std::vector<EngineStats>& all) {
  EngineStats t = all.at(0);
  t.entry_wait_s.clear();  // per engine
  for (std::size_t e = 1; e < all.size(); ++e) {
    const EngineStats& s = all[e];
    t.host_bytes += s.host_bytes;
    t.pinned_bytes += s.pinned_bytes;
    t.device_shard_bytes += s.device_shard_bytes;
    t.slot_bytes = std::max(t.slot_bytes, s.slot_bytes);
    t.device_bytes += s.device_bytes;
    t.blocks_acquired += s.blocks_acquired;
    t.bytes_streamed += s.bytes_streamed;
    t.h2d_bytes += s.h2d_bytes;
    t.bytes_gathered += s.bytes_gathered;
    t.exposed_wait_s += s.exposed_wait_s;
    t.pack_s += s.pack_s;
    if (s.strategy != t.strategy) t.strategy += "+" + s.strategy;
  }
  return t;
}

OffloadStack::OffloadStack(std::shared_ptr<const Checkpoint> ck, const std::vector<std::vector<std::string>>& blocks,
                           const std::function<PackedAs(const std::string&)>& packed_dtype, int ranks)
    : plan_(std::make_unique<StackPlan>(std::move(ck), blocks, packed_dtype, ranks)) {}

void OffloadStack::ghost(const std::vector<BlockEngine*>& pass) {
  if (pass.empty())
    engine_->traverse(nullptr);
  else
    BlockEngine::traverse_together(pass, -1, nullptr);
}

void OffloadStack::start(EngineOptions options, std::unique_ptr<Collective> collective) {
  collective_ = std::move(collective);
  if (collective_) options.collective = collective_.get();
  engine_ = std::make_unique<BlockEngine>(*plan_, options);
}

namespace {

std::vector<std::vector<std::string>> wan_blocks(const WanTransformerConfig& c, const WanDtypes& d) {
  const auto names = wan_block_names(c, d);
  std::vector<std::vector<std::string>> blocks;
  for (std::int64_t i = 0; i < c.num_layers; ++i) {
    std::vector<std::string> b;
    for (const auto& n : names) b.push_back("blocks." + std::to_string(i) + "." + n);
    blocks.push_back(std::move(b));
  }
  return blocks;
}

}  // namespace

// Blocks are packed in the dtype the model keeps each tensor in: no conversion per block (a
// narrower storage is cast by the model's linear seam as it computes), with the model's edits
// (fused LoRAs) made as each rank packs its range.
WanOffloadRunner::WanOffloadRunner(const WanTransformer& model, int ranks)
    : OffloadStack(model.weights().shared(), wan_blocks(model.config(), model.dtypes()),
                   [&model](const std::string& full) {
                     const WanDtypes& d = model.dtypes();
                     return PackedAs(from_scalar_type(d.stored(full)), from_scalar_type(d.via(full)), model.edits());
                   },
                   ranks),
      model_(model) {}

std::vector<at::Tensor> WanOffloadRunner::forward(const std::vector<WanBranchInputs>& branches,
                                                  const std::function<void(std::int64_t)>& before_block,
                                                  const std::vector<BlockEngine*>& pass) {
  const auto& c = model_.config();
  std::vector<WanForwardState> states;
  try {
    for (const auto& b : branches)
      states.push_back(model_.begin(b.hidden_states, b.timestep, b.encoder_hidden_states, b.adapters));
  } catch (const std::exception& e) {
    ghost(pass);  // the other ranks are in this pass's gathers: join them without computing
    throw BlockComputeError(str("the transformer's input embeddings: ", describe_exception(e)));
  }
  traverse([&](std::int64_t i, const std::vector<at::Tensor>& w) {
    if (before_block) before_block(i);
    const WanBlockWeights bw = WanBlockWeights::bind(w, c, i);
    for (auto& s : states) {
      s.h = wan_block_forward(bw, s, s.h, c);
      token_rows_ += s.h.size(1);
    }
  }, pass);
  try {
    std::vector<at::Tensor> out;
    for (const auto& s : states) out.push_back(model_.end(s));
    return out;
  } catch (const std::exception& e) {
    throw BlockComputeError(str("the transformer's output head: ", describe_exception(e)));
  }
}

void WanOffloadRunner::traverse(const std::function<void(std::int64_t, const std::vector<at::Tensor>&)>& compute,
                                const std::vector<BlockEngine*>& pass) {
  if (pass.empty()) {
    engine().traverse(compute);
    return;
  }
  const auto me = std::find(pass.begin(), pass.end(), &engine());
  DLO_ASSERT(me != pass.end(), "the pass's engines do not include this runner's");
  BlockEngine::traverse_together(pass, static_cast<int>(me - pass.begin()), compute);
}

namespace {

// Every rank of `group` learns whether any failed (two small exchanges: the messages' lengths,
// then the messages): "" when none did, else this rank's own failure, or the first failed rank's
// message naming it (and any others that failed), so the record of the job says why whichever
// rank of the group writes it. Messages are cut at 2000 bytes.
// On CUDA the messages travel through the device (the group's only transport there): two small
// copies that wait for the group's stream.
std::string group_failure(const ExchangeGroup& group, const std::string& mine) {
  const std::string text = mine.substr(0, 2000);
  const auto on_host = [](std::vector<at::Tensor> v) {
    for (auto& t : v) t = t.to(at::kCPU);
    return v;
  };
  const auto lens =
      on_host(gather_all(group, at::tensor({static_cast<int>(text.size())}, at::kInt).to(group.device())));
  int longest = 0;
  std::vector<int> failed;
  for (std::size_t r = 0; r < lens.size(); ++r) {
    const int n = lens[r].item<int>();
    longest = std::max(longest, n);
    if (n > 0) failed.push_back(static_cast<int>(r));
  }
  if (failed.empty()) return "";
  at::Tensor bytes = at::zeros({longest}, at::kByte);
  std::memcpy(bytes.data_ptr(), text.data(), text.size());
  const auto all = on_host(gather_all(group, bytes.to(group.device())));
  if (!mine.empty()) return mine;
  const int first = failed.front();
  const std::string why(static_cast<const char*>(all[static_cast<std::size_t>(first)].data_ptr()),
                        static_cast<std::size_t>(lens[static_cast<std::size_t>(first)].item<int>()));
  std::string others;
  for (std::size_t i = 1; i < failed.size(); ++i)
    others += str(i == 1 ? "" : ", ", group.world_ranks()[static_cast<std::size_t>(failed[i])]);
  return str("rank ", group.world_ranks()[static_cast<std::size_t>(first)], " of this job's group: ", why,
             others.empty() ? std::string() : str(" (rank(s) ", others, " failed too)"));
}

}  // namespace

std::vector<at::Tensor> WanOffloadRunner::forward_group(const ExchangeGroup& group, const std::vector<WanBranchInputs>& branches,
                                                        const std::vector<BlockEngine*>& pass,
                                                        const std::function<void(std::int64_t)>& before_block,
                                                        const std::string& inputs_failed) {
  if (group.size() == 1 && inputs_failed.empty()) return forward(branches, before_block, pass);
  const auto& c = model_.config();
  const int me = group.rank();
  std::vector<WanForwardState> full, rows;
  Partition tokens, heads;
  std::string failure = inputs_failed;  // this rank's; the group agrees on failures before and after the blocks
  if (failure.empty()) {
    try {
      for (const auto& b : branches)
        full.push_back(model_.begin(b.hidden_states, b.timestep, b.encoder_hidden_states, b.adapters));
      DLO_CHECK(!full.empty(), "no branch to compute");
      heads = Partition::even(c.num_attention_heads, group.size(), "sequence parallelism over the attention heads");
      tokens = Partition::even(full[0].h.size(1), group.size(), "sequence parallelism over the tokens");
      for (const auto& f : full) rows.push_back(wan_state_rows(f, tokens.offset[me], tokens.size[me]));
      // One MPI call carries at most INT_MAX bytes in all (offsets are ints): the largest buffer
      // of any rank, from the partitions every rank knows, so all refuse alike.
      const auto& h = full[0].h;
      const std::uint64_t whole = static_cast<std::uint64_t>(h.numel()) * h.element_size();  // [B, L, D]: every exchange's largest
      DLO_CHECK(whole <= group.max_exchange_bytes(), "sequence parallelism: ", whole,
                " bytes of hidden states exceed one exchange of this transport (", group.max_exchange_bytes(), " bytes)");
    } catch (const std::exception& e) {
      failure = str("the transformer's input embeddings: ", describe_exception(e));
    }
  }
  if (const std::string why = group_failure(group, failure); !why.empty()) {
    ghost(pass);  // no rank of the group exchanges: they join the pass's gathers only
    throw BlockComputeError(why);
  }
  // A rank whose computation fails in a block still takes part in every exchange of the pass
  // (with zeros of the shapes its partners expect), so the group stays in step and learns of it
  // after the blocks.
  const std::int64_t batch = rows[0].h.size(0), head_dim = c.attention_head_dim;
  const at::TensorOptions opt = rows[0].h.options();
  const int per_block = 4 * static_cast<int>(rows.size());  // q, k, v to heads; attention back
  traverse([&](std::int64_t i, const std::vector<at::Tensor>& w) {
    int done = 0;
    const auto to_heads = [&](const at::Tensor& t) {
      at::Tensor r = seq_to_heads(group, t, tokens, heads);
      ++done;
      return r;
    };
    const auto to_tokens = [&](const at::Tensor& t) {
      at::Tensor r = heads_to_seq(group, t, tokens, heads);
      ++done;
      return r;
    };
    if (failure.empty()) {
      try {
        if (before_block) before_block(i);
        const WanBlockWeights bw = WanBlockWeights::bind(w, c, i);
        for (auto& s : rows) {
          const WanBlockModulation mod = wan_block_modulation(bw, s);
          const WanSelfAttnInputs in = wan_block_self_attn_inputs(bw, s, mod, s.h, c);
          const at::Tensor q = to_heads(in.q), k = to_heads(in.k), v = to_heads(in.v);
          s.h = wan_block_finish(bw, s, mod, s.h, to_tokens(wan_self_attention({q, k, v})), c);
          token_rows_ += s.h.size(1);
        }
        return;
      } catch (const Error& e) {
        if (e.kind() == ErrorKind::kTransfer) throw;  // the exchange itself: the group is out of step
        failure = str("block ", i, ": ", describe_exception(e));
      } catch (const std::exception& e) {
        failure = str("block ", i, ": ", describe_exception(e));
      }
    }
    try {
      while (done < per_block) {
        if (done % 4 < 3)
          to_heads(at::zeros({batch, tokens.size[me], c.num_attention_heads, head_dim}, opt));
        else
          to_tokens(at::zeros({batch, tokens.total(), heads.size[me], head_dim}, opt));
      }
    } catch (const std::exception& e) {
      // Out of step with the group (it waits for an exchange this rank cannot make): end every rank.
      MpiWorld::abort(str("sequence parallelism, block ", i, ": after ", failure, ", joining the group's exchanges failed: ",
                          describe_exception(e)));
    }
  }, pass);
  if (const std::string why = group_failure(group, failure); !why.empty()) throw BlockComputeError(why);
  std::vector<at::Tensor> out;
  for (std::size_t k = 0; k < full.size(); ++k) {
    full[k].h = gather_tokens(group, rows[k].h, tokens);  // a failure here is the group's: it propagates
    try {
      if (failure.empty()) out.push_back(model_.end(full[k]));
    } catch (const std::exception& e) {
      failure = str("the transformer's output head: ", describe_exception(e));
    }
  }
  if (const std::string why = group_failure(group, failure); !why.empty()) throw BlockComputeError(why);
  return out;
}

std::vector<at::Tensor> WanOffloadRunner::forward_cfg(const ExchangeGroup& partners, const ExchangeGroup* sp,
                                                      const std::vector<WanBranchInputs>& branches,
                                                      const std::vector<BlockEngine*>& pass,
                                                      const std::function<void(std::int64_t)>& before_block,
                                                      const std::string& inputs_failed) {
  DLO_ASSERT(static_cast<int>(branches.size()) == partners.size(), branches.size(), " branches for ", partners.size(),
             " CFG partners");
  const std::vector<WanBranchInputs> mine = {branches[static_cast<std::size_t>(partners.rank())]};
  std::vector<at::Tensor> out;
  std::string failure;
  try {
    if (sp != nullptr) {
      out = forward_group(*sp, mine, pass, before_block, inputs_failed);
    } else if (!inputs_failed.empty()) {
      ghost(pass);
      failure = inputs_failed;
    } else {
      out = forward(mine, before_block, pass);
    }
  } catch (const BlockComputeError& e) {
    failure = e.what();  // the partner learns of it, instead of waiting for a prediction
  }
  if (const std::string why = group_failure(partners, failure); !why.empty()) throw BlockComputeError(why);
  return gather_all(partners, out.at(0));  // a failure here is the partners': it propagates
}

}  // namespace dlo
