#include "dlo/testing/make_model.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>

#include <nlohmann/json.hpp>

#include "dlo/common/bytes.h"
#include "dlo/common/error.h"
#include "dlo/common/file.h"
#include "dlo/common/memory.h"
#include "dlo/testing/random_weights.h"
#include "dlo/testing/train_tokenizer.h"

namespace dlo {
namespace fs = std::filesystem;

namespace {

// Whole or absent, every byte checked, synced before the rename (dlo/common/file.h).

const std::vector<std::string>& known_components() {
  static const std::vector<std::string> k{"transformer", "transformer_2", "scheduler", "vae", "text_encoder", "tokenizer"};
  return k;
}

// Memory a random checkpoint write needs at its peak: the writer's buffer for the largest tensor,
// plus the fp32 tensor drawn for it and its conversion (random_weights.cpp).
std::uint64_t write_peak_bytes(const std::vector<TensorSpec>& specs) {
  std::uint64_t peak = 0;
  for (const auto& s : specs) {
    const std::uint64_t n = s.nbytes();
    const std::uint64_t numel = n / dtype_size(s.dtype);
    peak = std::max(peak, n + numel * 4 + n);
  }
  return peak;
}

// diffusers' UniPCMultistepScheduler config of the Wan2.1 T2V repos (wan-spec 3.6); the converted
// Wan2.2 TI2V-5B repo has flow_shift 5.0.
std::string unipc_scheduler_json(double flow_shift) {
  nlohmann::ordered_json j = {{"_class_name", "UniPCMultistepScheduler"},
                              {"_diffusers_version", "0.42.1"},
                              {"beta_end", 0.02},
                              {"beta_schedule", "linear"},
                              {"beta_start", 0.0001},
                              {"disable_corrector", nlohmann::json::array()},
                              {"dynamic_thresholding_ratio", 0.995},
                              {"final_sigmas_type", "zero"},
                              {"flow_shift", flow_shift},
                              {"lower_order_final", true},
                              {"num_train_timesteps", 1000},
                              {"predict_x0", true},
                              {"prediction_type", "flow_prediction"},
                              {"rescale_betas_zero_snr", false},
                              {"sample_max_value", 1.0},
                              {"solver_order", 2},
                              {"solver_p", nullptr},
                              {"solver_type", "bh2"},
                              {"steps_offset", 0},
                              {"thresholding", false},
                              {"timestep_spacing", "linspace"},
                              {"trained_betas", nullptr},
                              {"use_beta_sigmas", false},
                              {"use_exponential_sigmas", false},
                              {"use_flow_sigmas", true},
                              {"use_karras_sigmas", false}};
  return j.dump(2) + "\n";
}

}  // namespace

WriteResult write_random_wan_transformer(const std::string& dir, const WanTransformerConfig& c, DType dtype,
                                         std::uint64_t seed, std::uint64_t shard_bytes) {
  c.validate("transformer config");
  make_folders(dir);
  WriteOptions w;
  w.base_name = "diffusion_pytorch_model";
  w.max_shard_bytes = shard_bytes;
  w.metadata = {{"format", "pt"}};
  const double inv_sqrt_d = 1.0 / std::sqrt(static_cast<double>(c.dim()));
  auto init = [&](const TensorSpec& s) -> RandomInit {
    // As diffusers initialises the modulation tables: randn / sqrt(D).
    if (s.name.find("scale_shift_table") != std::string::npos) return {0.0, inv_sqrt_d};
    return default_init(s);
  };
  auto r = write_random_checkpoint(dir, wan_transformer_specs(c, dtype), init, seed, w);
  write_file_atomic(dir + "/config.json", c.to_json());
  return r;
}

WriteResult write_random_wan_vae(const std::string& dir, const WanVaeConfig& c, DType dtype, std::uint64_t seed,
                                 std::uint64_t shard_bytes) {
  c.validate("vae config");
  make_folders(dir);
  WriteOptions w;
  w.base_name = "diffusion_pytorch_model";
  w.max_shard_bytes = shard_bytes;
  w.metadata = {{"format", "pt"}};
  auto init = [](const TensorSpec& s) -> RandomInit {
    auto ends_with = [&](const std::string& suffix) {
      return s.name.size() >= suffix.size() && s.name.compare(s.name.size() - suffix.size(), suffix.size(), suffix) == 0;
    };
    if (ends_with(".gamma")) return {1.0, 0.1};  // [C, 1, 1, 1]: not a conv weight despite its rank
    if (ends_with("conv_out.weight")) return default_init(s, 0.5);
    return default_init(s);
  };
  auto r = write_random_checkpoint(dir, wan_vae_specs(c, dtype), init, seed, w);
  write_file_atomic(dir + "/config.json", c.to_json());
  return r;
}

void check_make_model(const std::string& dir, const MakeModelOptions& o) {
  DLO_CHECK(!o.components.empty(), "no components to write");
  for (std::size_t i = 0; i < o.components.size(); ++i) {
    const auto& comp = o.components[i];
    DLO_CHECK(std::find(known_components().begin(), known_components().end(), comp) != known_components().end(),
              "unknown component '", comp, "' (transformer, transformer_2, scheduler, vae, text_encoder, tokenizer)");
    DLO_CHECK(std::find(o.components.begin(), o.components.begin() + static_cast<std::ptrdiff_t>(i), comp) ==
                  o.components.begin() + static_cast<std::ptrdiff_t>(i),
              "component '", comp, "' is listed twice");
  }
  auto has = [&](const char* c) { return std::find(o.components.begin(), o.components.end(), c) != o.components.end(); };
  if (has("transformer")) o.transformer.validate("transformer config");
  if (has("transformer_2")) {
    DLO_CHECK(has("transformer"), "component 'transformer_2' (the low-noise expert) needs 'transformer' too");
    DLO_CHECK(std::isfinite(o.boundary_ratio) && o.boundary_ratio >= 0 && o.boundary_ratio <= 1,
              "boundary_ratio must be in [0, 1], got ", o.boundary_ratio);
  }
  if (has("vae")) o.vae.validate("vae config");
  DLO_CHECK(std::isfinite(o.flow_shift) && o.flow_shift > 0, "flow_shift must be positive, got ", o.flow_shift);
  if (has("text_encoder")) o.text_encoder.validate("text encoder config");
  // WanPipeline feeds the VAE's latents to the transformer and its output back to the VAE.
  if (has("transformer") && has("vae") && !o.channels_follow_vae)
    DLO_CHECK(o.transformer.in_channels == o.vae.z_dim && o.transformer.out_channels == o.vae.z_dim,
              "the transformer's in_channels/out_channels (", o.transformer.in_channels, "/",
              o.transformer.out_channels, ") must equal the VAE's z_dim (", o.vae.z_dim,
              "): WanPipeline passes the VAE's latents through the transformer");
  check_output_folder(dir);
  // The peak memory of the write, against what the process can get.
  std::uint64_t peak = 0;
  if (has("transformer")) peak = std::max(peak, write_peak_bytes(wan_transformer_specs(o.transformer, o.dtype)));
  if (has("vae")) peak = std::max(peak, write_peak_bytes(wan_vae_specs(o.vae, o.vae_dtype)));
  if (has("text_encoder")) peak = std::max(peak, write_peak_bytes(umt5_encoder_specs(o.text_encoder, o.dtype)));
  const std::uint64_t avail = available_memory_bytes();
  DLO_CHECK(avail == 0 || peak <= avail, "out of memory: writing these components needs about ", human_bytes(peak),
            " (the largest tensor, drawn in fp32 and converted), but only ", human_bytes(avail), " is available");
}

MakeModelResult make_model(const std::string& dir, const MakeModelOptions& options) {
  MakeModelOptions o = options;
  auto has_comp = [&](const char* c) { return std::find(o.components.begin(), o.components.end(), c) != o.components.end(); };
  if (has_comp("transformer") && has_comp("vae") && o.channels_follow_vae)
    o.transformer.in_channels = o.transformer.out_channels = o.vae.z_dim;
  // Everything that can be refused is refused before the first byte is written.
  check_make_model(dir, o);
  MakeModelResult result;
  nlohmann::ordered_json index = {{"_class_name", "WanPipeline"}, {"_diffusers_version", "0.42.1"}};
  auto has = [&](const char* c) { return std::find(o.components.begin(), o.components.end(), c) != o.components.end(); };
  if (has("text_encoder") && has("transformer"))
    DLO_CHECK(o.text_encoder.d_model == o.transformer.text_dim, "the text encoder's d_model (", o.text_encoder.d_model,
              ") must equal the transformer's text_dim (", o.transformer.text_dim, ")");
  if (has("text_encoder") && has("tokenizer"))
    DLO_CHECK(o.text_encoder.vocab_size >= kTinyTokenizerPieces + kTinyTokenizerExtraIds, "the text encoder's vocab_size (",
              o.text_encoder.vocab_size, ") is below the tokenizer's ", kTinyTokenizerPieces + kTinyTokenizerExtraIds);
  make_folders(dir);
  for (const auto& comp : o.components) {
    const std::string sub = (fs::path(dir) / comp).string();
    if (comp == "transformer") {
      result.bytes += write_random_wan_transformer(sub, o.transformer, o.dtype, o.seed, o.shard_bytes).total_bytes;
      index["transformer"] = {"diffusers", "WanTransformer3DModel"};
    } else if (comp == "transformer_2") {
      result.bytes +=
          write_random_wan_transformer(sub, o.transformer, o.dtype, o.seed + kSecondExpertSeed, o.shard_bytes).total_bytes;
      index["transformer_2"] = {"diffusers", "WanTransformer3DModel"};
      index["boundary_ratio"] = o.boundary_ratio;
    } else if (comp == "scheduler") {
      make_folders(sub);
      write_file_atomic(sub + "/scheduler_config.json", unipc_scheduler_json(o.flow_shift));
      index["scheduler"] = {"diffusers", "UniPCMultistepScheduler"};
    } else if (comp == "text_encoder") {
      result.bytes += write_random_umt5_encoder(sub, o.text_encoder, o.dtype, o.seed, o.shard_bytes).total_bytes;
      index["text_encoder"] = {"transformers", "UMT5EncoderModel"};
    } else if (comp == "tokenizer") {
      write_tiny_tokenizer(sub);
      index["tokenizer"] = {"transformers", "T5TokenizerFast"};
    } else if (comp == "vae") {
      result.bytes += write_random_wan_vae(sub, o.vae, o.vae_dtype, o.seed, o.shard_bytes).total_bytes;
      index["vae"] = {"diffusers", "AutoencoderKLWan"};
    } else {
      DLO_CHECK(false, "unknown component '", comp, "' (transformer, transformer_2, scheduler, vae, text_encoder, tokenizer)");
    }
    result.written.push_back(sub);
  }
  if (o.expand_timesteps) index["expand_timesteps"] = true;
  write_file_atomic((fs::path(dir) / "model_index.json").string(), index.dump(2) + "\n");
  return result;
}

WriteResult write_random_umt5_encoder(const std::string& dir, const Umt5Config& c, DType dtype, std::uint64_t seed,
                                      std::uint64_t shard_bytes) {
  c.validate("text encoder config");
  make_folders(dir);
  WriteOptions w;
  w.base_name = "model";
  w.max_shard_bytes = shard_bytes;
  w.metadata = {{"format", "pt"}};
  const double D = static_cast<double>(c.d_model);
  auto ends_with = [](const std::string& s, const char* suffix) {
    const std::size_t n = std::strlen(suffix);
    return s.size() >= n && s.compare(s.size() - n, n, suffix) == 0;
  };
  // transformers' UMT5PreTrainedModel._init_weights (initializer_factor 1), except the norms.
  auto init = [&](const TensorSpec& s) -> RandomInit {
    if (s.name == "shared.weight") return {0.0, 1.0};
    if (ends_with(s.name, ".q.weight")) return {0.0, 1.0 / std::sqrt(D * static_cast<double>(c.d_kv))};
    if (ends_with(s.name, ".k.weight") || ends_with(s.name, ".v.weight")) return {0.0, 1.0 / std::sqrt(D)};
    if (ends_with(s.name, ".o.weight")) return {0.0, 1.0 / std::sqrt(static_cast<double>(c.inner_dim()))};
    if (ends_with(s.name, "relative_attention_bias.weight")) return {0.0, 1.0 / std::sqrt(D)};
    if (ends_with(s.name, ".wo.weight")) return {0.0, 1.0 / std::sqrt(static_cast<double>(c.d_ff))};
    if (s.name.find(".wi") != std::string::npos) return {0.0, 1.0 / std::sqrt(D)};
    return default_init(s);  // layer norms: 1 + N(0, 0.02^2)
  };
  auto r = write_random_checkpoint(dir, umt5_encoder_specs(c, dtype), init, seed, w);
  const char* name = dtype == DType::F32 ? "float32" : dtype == DType::F16 ? "float16" : "bfloat16";
  write_file_atomic(dir + "/config.json", c.to_json(name));
  return r;
}

}  // namespace dlo
