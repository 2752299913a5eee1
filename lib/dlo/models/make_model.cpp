#include "dlo/models/make_model.h"

#include <cmath>
#include <filesystem>
#include <fstream>

#include <nlohmann/json.hpp>

#include "dlo/common/error.h"
#include "dlo/models/random_weights.h"

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

MakeModelResult make_model(const std::string& dir, const MakeModelOptions& o) {
  MakeModelResult result;
  nlohmann::ordered_json index = {{"_class_name", "WanPipeline"}, {"_diffusers_version", "0.42.1"}};
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
    } else {
      DLO_CHECK(false, "unknown component '", comp, "' (transformer, scheduler)");
    }
    result.written.push_back(sub);
  }
  write_text((fs::path(dir) / "model_index.json").string(), index.dump(2) + "\n");
  return result;
}

}  // namespace dlo
