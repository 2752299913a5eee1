// A model folder with its configs and no weights, written from the config structs alone
// (torch-free): enough for read_model_info, manifests and plans, whose tests then need no model.
#pragma once

#include <filesystem>
#include <string>

#include "common/test_util.h"
#include "dlo/config/noise_scheduler_config.h"
#include "dlo/config/umt5_config.h"
#include "dlo/config/wan_transformer_config.h"
#include "dlo/config/wan_vae_config.h"

namespace dlo::test {

// The parts fit together (the transformer's channels are the VAE's z_dim, its text_dim the text
// encoder's d_model), as dlo-checkpoint make writes them.
inline void write_config_only_model(const std::string& dir,
                                    WanTransformerConfig t = WanTransformerConfig::preset("wan-test"),
                                    WanVaeConfig v = WanVaeConfig::preset("wan2.1-vae-small")) {
  Umt5Config te = Umt5Config::preset("umt5-test");
  t.in_channels = t.out_channels = v.z_dim;
  te.d_model = t.text_dim;
  for (const char* part : {"transformer", "vae", "text_encoder", "tokenizer", "scheduler"})
    std::filesystem::create_directories(dir + "/" + part);
  write_file(dir + "/model_index.json", "{\"_class_name\": \"WanPipeline\"}\n");
  write_file(dir + "/transformer/config.json", t.to_json());
  write_file(dir + "/vae/config.json", v.to_json());
  write_file(dir + "/text_encoder/config.json", te.to_json());
  write_file(dir + "/scheduler/scheduler_config.json", NoiseSchedulerConfig{}.to_json());
}

}  // namespace dlo::test
