// Sequence and CFG parallelism's exchanges over a group of ranks (ExchangeGroup: MPI on the CPU,
// NCCL on CUDA; tensors on the group's device): the data movement of models/wan_transformer.h's
// sequence-parallel seam, with uneven token and head partitions (all-to-all-v: no padding). Group
// rank r holds tokens tokens.part(r) and, between the two exchanges of self-attention, heads
// heads.part(r). Collective over the group: every rank calls the same exchanges in the same
// order. An exchange that does not finish in time ends every rank (exchange_group.h). On CUDA the
// results are ordered on the current stream (nothing here synchronises with the host).
#pragma once

#include <vector>

#include <ATen/core/Tensor.h>

#include "dlo/common/partition.h"

namespace dlo {

class ExchangeGroup;

// x [B, s_r, H, d] (this rank's tokens, every head) -> [B, L, H_r, d] (every token, this rank's
// heads), tokens in order.
at::Tensor seq_to_heads(const ExchangeGroup& group, const at::Tensor& x, const Partition& tokens, const Partition& heads);
// The inverse: o [B, L, H_r, d] -> [B, s_r, H, d], heads in order.
at::Tensor heads_to_seq(const ExchangeGroup& group, const at::Tensor& o, const Partition& tokens, const Partition& heads);
// h [B, s_r, ...] -> [B, L, ...] on every rank of the group: the one gather before the output head.
at::Tensor gather_tokens(const ExchangeGroup& group, const at::Tensor& h, const Partition& tokens);
// Every rank's `t` (the same shape and dtype on every rank of the group), in group rank order:
// CFG parallelism's exchange of the branches' predictions.
std::vector<at::Tensor> gather_all(const ExchangeGroup& group, const at::Tensor& t);

}  // namespace dlo
