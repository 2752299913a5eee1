#include "dlo/models/make_model.h"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>

#include <nlohmann/json.hpp>

#include "dlo/common/error.h"
#include "dlo/models/random_weights.h"
#include "dlo/text/tokenizer.h"

namespace dlo {
namespace fs = std::filesystem;

namespace {

void write_text(const std::string& path, const std::string& text) {
  std::ofstream out(path, std::ios::binary);
  DLO_CHECK(out, "cannot write '", path, "'");
  out << text;
  DLO_CHECK(out.good(), "writing '", path, "' failed");
}

// diffusers' UniPCMultistepScheduler config of the Wan2.1 T2V repos (wan-spec 3.6).
std::string unipc_scheduler_json() {
  nlohmann::ordered_json j = {{"_class_name", "UniPCMultistepScheduler"},
                              {"_diffusers_version", "0.42.1"},
                              {"beta_end", 0.02},
                              {"beta_schedule", "linear"},
                              {"beta_start", 0.0001},
                              {"disable_corrector", nlohmann::json::array()},
                              {"dynamic_thresholding_ratio", 0.995},
                              {"final_sigmas_type", "zero"},
                              {"flow_shift", 3.0},
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
  fs::create_directories(dir);
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
  write_text(dir + "/config.json", c.to_json());
  return r;
}

WriteResult write_random_wan_vae(const std::string& dir, const WanVaeConfig& c, DType dtype, std::uint64_t seed,
                                 std::uint64_t shard_bytes) {
  c.validate("vae config");
  fs::create_directories(dir);
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
  write_text(dir + "/config.json", c.to_json());
  return r;
}

MakeModelResult make_model(const std::string& dir, const MakeModelOptions& o) {
  MakeModelResult result;
  nlohmann::ordered_json index = {{"_class_name", "WanPipeline"}, {"_diffusers_version", "0.42.1"}};
  auto has = [&](const char* c) { return std::find(o.components.begin(), o.components.end(), c) != o.components.end(); };
  if (has("text_encoder") && has("transformer"))
    DLO_CHECK(o.text_encoder.d_model == o.transformer.text_dim, "the text encoder's d_model (", o.text_encoder.d_model,
              ") must equal the transformer's text_dim (", o.transformer.text_dim, ")");
  if (has("text_encoder") && has("tokenizer"))
    DLO_CHECK(o.text_encoder.vocab_size >= kTinyTokenizerPieces + kTinyTokenizerExtraIds, "the text encoder's vocab_size (",
              o.text_encoder.vocab_size, ") is below the tokenizer's ", kTinyTokenizerPieces + kTinyTokenizerExtraIds);
  fs::create_directories(dir);
  for (const auto& comp : o.components) {
    const std::string sub = (fs::path(dir) / comp).string();
    if (comp == "transformer") {
      result.bytes += write_random_wan_transformer(sub, o.transformer, o.dtype, o.seed, o.shard_bytes).total_bytes;
      index["transformer"] = {"diffusers", "WanTransformer3DModel"};
    } else if (comp == "scheduler") {
      fs::create_directories(sub);
      write_text(sub + "/scheduler_config.json", unipc_scheduler_json());
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
      DLO_CHECK(false, "unknown component '", comp, "' (transformer, scheduler, vae, text_encoder, tokenizer)");
    }
    result.written.push_back(sub);
  }
  write_text((fs::path(dir) / "model_index.json").string(), index.dump(2) + "\n");
  return result;
}

}  // namespace dlo
