#include "component.h"

#include <chrono>

#include <ATen/ATen.h>

#include "dlo/common/memory.h"

#include "dlo/common/error.h"
#include "dlo/models/umt5.h"
#include "dlo/config/model_info.h"
#include "dlo/models/wan_transformer.h"
#include "dlo/models/wan_vae.h"
#include "dlo/text/tokenizer.h"

namespace dlo {

const at::Tensor& require_input(const TensorMap& inputs, const std::string& key, const std::string& component) {
  auto it = inputs.find(key);
  DLO_CHECK(it != inputs.end(), component, ": inputs lack '", key, "'");
  return it->second;
}

std::vector<std::string> component_names() { return {"transformer", "transformer_2", "vae", "vae_encoder", "text_encoder", "tokenizer"}; }

namespace {

// Prompts for the tokenizer / text encoder: options.prompt, or the inputs "text" (uint8, the
// UTF-8 prompts one after another) + "text_lengths" (int64 [B], bytes per prompt).
std::vector<std::string> prompts_from(const TensorMap& inputs, const ForwardOptions& options, const std::string& comp) {
  if (options.has_prompt || !options.prompt.empty()) return {options.prompt};
  if (!inputs.count("text")) return {};
  const at::Tensor text = require_input(inputs, "text", comp).contiguous();
  const at::Tensor lens = require_input(inputs, "text_lengths", comp).to(at::kLong).contiguous();
  DLO_CHECK(text.scalar_type() == at::kByte && text.dim() == 1, comp, ": input 'text' must be uint8 [bytes]");
  DLO_CHECK(lens.dim() == 1 && lens.size(0) > 0, comp, ": input 'text_lengths' must be int64 [B], B > 0");
  std::vector<std::string> prompts;
  std::int64_t off = 0;
  for (std::int64_t i = 0; i < lens.size(0); ++i) {
    const std::int64_t n = lens[i].item<std::int64_t>();
    DLO_CHECK(n >= 0 && off + n <= text.numel(), comp, ": 'text_lengths' exceed the ", text.numel(), " bytes of 'text'");
    prompts.emplace_back(reinterpret_cast<const char*>(text.data_ptr<std::uint8_t>()) + off, n);
    off += n;
  }
  return prompts;
}

at::Tensor to_tensor(const std::vector<std::int64_t>& v, std::int64_t rows, std::int64_t cols) {
  return at::tensor(v, at::kLong).view({rows, cols});
}

}  // namespace

TensorMap run_component(const std::string& model_dir, const std::string& component, const TensorMap& inputs,
                        const ForwardOptions& options) {
  const ModelParts parts{model_dir, "", "", options.vae};
  const std::string dir = parts.folder(component);
  ForwardStats scratch;
  ForwardStats& stats = options.stats != nullptr ? *options.stats : scratch;
  // Times `fn` options.repeat times (at least once), recording memory around the passes.
  auto timed = [&](auto&& fn) {
    stats.rss_after_load_kb = read_process_memory().rss_kb;
    reset_peak_rss();
    at::Tensor out;
    for (int i = 0; i < std::max(1, options.repeat); ++i) {
      const auto t0 = std::chrono::steady_clock::now();
      out = fn();
      stats.forward_seconds.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
    }
    stats.peak_rss_kb = read_process_memory().hwm_kb;
    return out;
  };
  stats.rss_before_load_kb = read_process_memory().rss_kb;
  if (component == "transformer" || component == "transformer_2") {
    auto model = WanTransformer::load(dir, options.dtype);
    const at::Tensor& x = require_input(inputs, "hidden_states", component);
    const at::Tensor& t = require_input(inputs, "timestep", component);
    const at::Tensor& ctx = require_input(inputs, "encoder_hidden_states", component);
    at::Tensor out = with_context("transformer forward", [&] { return timed([&] { return model.forward(x, t, ctx); }); });
    return {{"output", out}};
  }
  if (component == "vae") {
    // latents: normalised, as the transformer outputs them. Like WanPipeline: de-normalise with
    // the config's latents_mean/std, then vae.decode(); "output" is the video in [-1, 1].
    auto model = WanVae::load(parts.vae_weights(), read_vae_config(parts), options.dtype);
    for (const auto& w : model.config().warnings) stats.warnings.push_back(w);
    const at::Tensor& x = require_input(inputs, "latents", component);
    at::Tensor out = with_context("vae decode", [&] { return timed([&] { return model.decode(model.denormalize(x)); }); });
    return {{"output", out}};
  }
  if (component == "vae_encoder") {
    // video [B, 3, F, H, W] in [-1, 1], as WanImageToVideoPipeline's condition video: "latents" is
    // vae.encode(video).latent_dist.mode() (= "output"), "latents_normalized" the pipeline's
    // (latents - latents_mean) * (1 / latents_std) of it.
    auto model = WanVae::load(parts.vae_weights(), read_vae_config(parts), options.dtype, WanVaeParts::kEncoder);
    for (const auto& w : model.config().warnings) stats.warnings.push_back(w);
    const at::Tensor& x = require_input(inputs, "video", component);
    at::Tensor latents = with_context("vae encode", [&] { return timed([&] { return model.encode(x); }); });
    return {{"output", latents}, {"latents", latents}, {"latents_normalized", model.normalize(latents)}};
  }
  if (component == "text_encoder" || component == "tokenizer") {
    // Like WanPipeline._get_t5_prompt_embeds: prompts are cleaned (unless input "clean" is 0),
    // tokenized to max_sequence_length (input, default 512); "output" is last_hidden_state with
    // the rows past each prompt's tokens zeroed. Or give input_ids (+ attention_mask) directly.
    // (last_hidden_state has only max(seq_lens) rows when compact.)
    TensorMap out;
    at::Tensor ids, mask;
    const auto prompts = prompts_from(inputs, options, component);
    if (!prompts.empty() || component == "tokenizer") {
      DLO_CHECK(!prompts.empty(), component, ": give --prompt or the inputs 'text' + 'text_lengths'");
      const auto tok = T5Tokenizer::load(parts.tokenizer());
      const std::int64_t max_len =
          inputs.count("max_sequence_length") ? inputs.at("max_sequence_length").item<std::int64_t>() : 512;
      const bool clean = !inputs.count("clean") || inputs.at("clean").item<std::int64_t>() != 0;
      const auto b = clean ? tok.encode_prompts(prompts, max_len) : tok.encode_padded(prompts, max_len);
      out["input_ids"] = ids = to_tensor(b.input_ids, b.batch, b.length);
      out["attention_mask"] = mask = to_tensor(b.attention_mask, b.batch, b.length);
      if (component == "tokenizer") {
        out["output"] = ids;
        return out;
      }
    } else {
      ids = require_input(inputs, "input_ids", component);
      if (inputs.count("attention_mask")) mask = inputs.at("attention_mask");
    }
    auto model = Umt5Encoder::load(dir, options.dtype);
    // Input "compact" = 1: the blocks see only the real tokens (Umt5Encoder::begin; not bitwise).
    const bool compact = inputs.count("compact") && inputs.at("compact").item<std::int64_t>() != 0;
    at::Tensor last;
    out["output"] = with_context("text encoder forward", [&] {
      return timed([&] {
        Umt5ForwardState s = model.begin(ids, mask, compact);
        for (std::int64_t i = 0; i < model.config().num_layers; ++i)
          s.h = umt5_block_forward(model.block(i), s, s.h, model.config());
        last = model.final_norm(s);
        return trim_and_zero_pad(last, s.seq_lens, s.output_length);
      });
    });
    out["last_hidden_state"] = last;
    return out;
  }
  DLO_CHECK(false, "unknown component '", component, "'");
}

}  // namespace dlo
