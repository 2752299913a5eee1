// dlo-forward's distributed path: Wan transformer forward passes on every rank through the
// offload engine, with per-rank measurements gathered to rank 0.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include <ATen/core/Tensor.h>

#include "dlo/config/model_info.h"
#include "dlo/dist/device.h"
#include "dlo/models/wan_transformer.h"
#include "dlo/offload/strategy.h"

namespace dlo {

class MpiWorld;

struct TransformerJobOptions {
  ModelParts model;                      // the model folder (and any transformer weights given instead of its own),
                                         // its fused_loras merged into the weights (those for this expert)
  // LoRAs applied unfused beside the weights on every rank (a job's `loras`: wan_job_adapters).
  std::vector<LoraSpec> loras;
  std::string expert = "transformer";    // transformer, or transformer_2 (Wan2.2 A14B's low-noise expert)
  at::ScalarType dtype = at::kFloat;
  LinearStorage storage = LinearStorage::kAuto;  // the blocks' Linears (--storage-dtype)
  StrategyRequest offload;               // default auto
  DeviceRequest device;                  // default auto
  // Bytes of device memory each rank may use (auto's budget; mixed: how many blocks stay on the
  // device). Unset: the device's free memory (CPU: the host's, as the page cache).
  std::optional<std::uint64_t> device_budget;
  // This rank's host as NCCL sees it (NCCL_HOSTID, read by the app); empty: the hostname. Ranks
  // sharing a GPU are refused unless their host ids differ (the one-GPU NCCL test).
  std::string host_id;
  std::int64_t passes = 1;               // forward passes of this rank (same inputs each time)
  std::vector<std::int64_t> rank_passes; // if set: passes per rank (overrides `passes`), e.g. {2, 0, 1}
  bool guidance = false;                 // also run the negative context (input negative_encoder_hidden_states)
  // Sequence parallelism: the ranks form groups of `sp` consecutive ranks (the last one smaller
  // when sp does not divide the ranks); a group computes one forward (Ulysses, every rank its
  // share of the tokens; WanOffloadRunner::forward_group) and random inputs are seeded per group.
  // CPU only for now; not with rank_passes; sp <= heads and <= tokens.
  int sp = 1;
  // CFG parallelism (with guidance): the conditional branch on one half of each group of 2 x sp
  // consecutive ranks, the unconditional on the other, predictions exchanged (forward_cfg). The
  // ranks must be a multiple of 2 x sp.
  bool cfg_parallel = false;
  bool keep_page_cache = false;
  // Instead of inputs: random latents [1, C_in, F, H, W] and text contexts [1, L, text_dim], seeded
  // by `random_seed` + rank (so every rank renders something different). Empty: use the inputs.
  std::vector<std::int64_t> random_latent;  // {F, H, W, L}
  std::uint64_t random_seed = 0;
  std::int64_t fail_at_block = -1;       // test hook: this rank's transfer of that block throws
  int fail_rank = -1;                    // ... on this rank only (-1: every rank)
  // Test hook (the GPU soak): random pauses of 0..jitter_us microseconds before each transfer the
  // engine requests and before each block computes (so before its exchanges), seeded per rank.
  std::int64_t jitter_us = 0;
  // Called on the one rank that writes (the lowest rank with passes > 0; see
  // TransformerJobResult::writer_rank) with its outputs, after its wave and before the closing
  // gather of the report, so a rank that is stuck at the end cannot keep the output from being
  // written. An exception from it lands in TransformerJobResult::output_error (that rank only).
  std::function<void(const std::map<std::string, at::Tensor>&)> write_output;
  // Test hook: called on every rank with "loaded" (before the start-up check) and "report"
  // (before the closing gather), e.g. to stop one rank there.
  std::function<void(const char* phase)> test_hook;
};

struct TransformerJobResult {
  std::map<std::string, at::Tensor> outputs;  // this rank's last pass: "output" (+ "output_negative")
  int writer_rank = 0;                        // the rank that called write_output (same on all ranks)
  std::string output_error;                   // writer rank: what write_output threw; else empty
  std::string choice;                         // "offload: dlo (reason)" for the log
  std::string report_json;                    // rank 0: every rank's measurements; others: empty
};

// Collective: every rank calls it. Throws dlo::Error for bad input found before the wave starts,
// the same on every rank (MpiWorld::check_all): a missing or mismatched input (batch sizes, a
// 0-dim timestep), a checkpoint that does not fit its config, a run whose estimated memory
// exceeds what is available (the message gives the figure), pass counts where no rank computes.
// A failure inside the wave ends every rank through MpiWorld::abort (the others would otherwise
// wait in a gather); every collective waits at most world.timeout_s().
TransformerJobResult run_transformer_job(const MpiWorld& world, const std::map<std::string, at::Tensor>& inputs,
                                         const TransformerJobOptions& options);

}  // namespace dlo
