#include "dlo/config/model_info.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "dlo/common/error.h"
#include "dlo/common/file.h"
#include "dlo/common/sha256.h"
#include "dlo/config/wan_tensor_names.h"
#include "dlo/config/wan_vae_names.h"
#include "dlo/io/json_config.h"

#include <nlohmann/json.hpp>

namespace dlo {
namespace {

bool is_dir(const std::string& p) {
  struct stat st;
  return ::stat(p.c_str(), &st) == 0 && S_ISDIR(st.st_mode);
}

bool ends_with(const std::string& s, const char* tail) {
  const std::size_t n = std::strlen(tail);
  return s.size() >= n && s.compare(s.size() - n, n, tail) == 0;
}

// The regular files of `dir` (not its hidden ones: temporaries of writers), sorted.
std::vector<std::string> files_of(const std::string& dir) {
  std::vector<std::string> out;
  DIR* d = ::opendir(dir.c_str());
  DLO_CHECK(d != nullptr, "cannot read the folder '", dir, "': ", std::strerror(errno));
  while (const dirent* e = ::readdir(d)) {
    const std::string name = e->d_name;
    struct stat st;
    if (name.empty() || name[0] == '.' || ::stat((dir + "/" + name).c_str(), &st) != 0 || !S_ISREG(st.st_mode)) continue;
    out.push_back(name);
  }
  ::closedir(d);
  std::sort(out.begin(), out.end());
  return out;
}

// Hashes `n` bytes at `offset` of `fd` (fewer at the end of the file).
void hash_range(Sha256& h, int fd, std::uint64_t offset, std::uint64_t n, const std::string& path) {
  std::string buf(static_cast<std::size_t>(n), '\0');
  std::size_t got = 0;
  while (got < buf.size()) {
    const ssize_t r = ::pread(fd, buf.data() + got, buf.size() - got, static_cast<off_t>(offset + got));
    if (r < 0 && errno == EINTR) continue;
    DLO_CHECK_IO(r >= 0, "reading '", path, "': ", std::strerror(errno));
    if (r == 0) break;
    got += static_cast<std::size_t>(r);
  }
  h.update(buf.data(), got);
}

void hash_file(Sha256& h, const std::string& path) {
  struct stat st;
  DLO_CHECK(::stat(path.c_str(), &st) == 0, "'", path, "': ", std::strerror(errno));
  const auto size = static_cast<std::uint64_t>(st.st_size);
  const std::string head = std::to_string(size) + "\n";
  h.update(head.data(), head.size());
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  DLO_CHECK(fd >= 0, "cannot open '", path, "': ", std::strerror(errno));
  try {
    if (!ends_with(path, ".safetensors") || size < 8) {
      hash_range(h, fd, 0, size, path);
    } else {
      // The header (8-byte length + JSON), then samples of the data section.
      unsigned char len[8] = {0};
      hash_range(h, fd, 0, 8, path);
      DLO_CHECK_IO(::pread(fd, len, 8, 0) == 8, "reading '", path, "': ", std::strerror(errno));
      std::uint64_t header = 0;
      for (int i = 7; i >= 0; --i) header = header << 8 | len[i];
      header = std::min<std::uint64_t>(header, size - 8);
      hash_range(h, fd, 8, header, path);
      const std::uint64_t data = 8 + header, data_size = size - data;
      constexpr std::uint64_t kSamples = 16, kSample = 4096;
      for (std::uint64_t k = 0; k < kSamples && data_size > 0; ++k) {
        const std::uint64_t at = data + (data_size > kSample ? (data_size - kSample) / (kSamples - 1) * k : 0);
        hash_range(h, fd, at, std::min(kSample, data_size), path);
      }
    }
  } catch (...) {
    ::close(fd);
    throw;
  }
  ::close(fd);
}

// model_index.json as diffusers 0.42 writes a WanPipeline: the pipeline class, and the Wan2.2
// fields that change what a folder means (expand_timesteps: TI2V-5B's timestep per token). A
// second expert needs its boundary and the boundary its expert (WanPipeline would never use an
// expert without a boundary, and fails at the boundary without the expert).
struct ModelIndex {
  bool transformer_2 = false;
  std::optional<double> boundary_ratio;
  bool expand_timesteps = false;
};

// A component entry: ["diffusers", "WanTransformer3DModel"], or null / [null, null] for none.
bool component_listed(const JsonConfig& j, const char* key) {
  const auto* v = j.find(key);
  if (v == nullptr || v->is_null()) return false;
  if (v->is_array() && std::all_of(v->begin(), v->end(), [](const auto& e) { return e.is_null(); })) return false;
  return true;
}

ModelIndex check_model_index(const JsonConfig& j) {
  const std::string& f = j.path();
  if (j.has("_class_name")) {
    const std::string cls = j.get_string("_class_name");
    DLO_CHECK(cls == "WanPipeline", f, ": field '_class_name' is '", cls,
              "'; dlo renders diffusers' WanPipeline (Wan text-to-video) folders");
  }
  ModelIndex m;
  if (j.find("transformer") != nullptr)  // (has() reads a null as absent)
    DLO_CHECK(component_listed(j, "transformer"), f, ": field 'transformer' is ", j.dump("transformer"),
              ": dlo needs the (high-noise) transformer; a folder with transformer_2 alone is not supported");
  m.transformer_2 = component_listed(j, "transformer_2");
  if (const auto* b = j.find("boundary_ratio"); b != nullptr && !b->is_null()) {
    DLO_CHECK(b->is_number(), f, ": field 'boundary_ratio' is ", j.dump("boundary_ratio"), ": expected a number");
    const double r = b->get<double>();
    DLO_CHECK(std::isfinite(r) && r >= 0 && r <= 1, f, ": field 'boundary_ratio' is ", j.dump("boundary_ratio"),
              ": expected a number in [0, 1] (the share of num_train_timesteps above which transformer/ runs)");
    m.boundary_ratio = r;
  }
  DLO_CHECK(!m.transformer_2 || m.boundary_ratio, f, ": field 'transformer_2' is ", j.dump("transformer_2"),
            " but 'boundary_ratio' is null: WanPipeline would never run the second expert (set boundary_ratio, "
            "e.g. 0.875 for Wan2.2 T2V-A14B, or remove transformer_2)");
  DLO_CHECK(m.transformer_2 || !m.boundary_ratio, f, ": field 'boundary_ratio' is ", j.dump("boundary_ratio"),
            " but there is no 'transformer_2': the steps below the boundary have no expert to run");
  m.expand_timesteps = j.get_bool("expand_timesteps", false);
  return m;
}

}  // namespace

LoraSpec parse_lora_spec(const std::string& text, const std::string& what) {
  LoraSpec s;
  std::string rest = text;
  for (const auto& [prefix, expert] : {std::pair<const char*, int>{"high=", 0}, {"low=", 1}})
    if (rest.rfind(prefix, 0) == 0) {
      s.expert = expert;
      rest = rest.substr(std::strlen(prefix));
    }
  if (const auto colon = rest.rfind(':'); colon != std::string::npos) {
    const std::string tail = rest.substr(colon + 1);
    char* end = nullptr;
    errno = 0;
    const double v = std::strtod(tail.c_str(), &end);
    if (!tail.empty() && end && *end == '\0' && errno == 0 && std::isfinite(v)) {
      s.strength = v;
      rest = rest.substr(0, colon);
    }
  }
  DLO_CHECK(!rest.empty(), what, ": '", text, "' names no LoRA file (write [high=|low=]PATH[:STRENGTH])");
  s.path = rest;
  return s;
}

std::string lora_spec_text(const LoraSpec& s) {
  char strength[32];
  std::snprintf(strength, sizeof strength, "%.17g", s.strength);
  return str(s.expert == 0 ? "high=" : s.expert == 1 ? "low=" : "", s.path, ":", strength);
}

std::vector<LoraSpec> parse_lora_list(const std::string& text, const std::string& what) {
  std::vector<LoraSpec> out;
  if (text.find_first_not_of(" \t") == std::string::npos) return out;
  std::size_t start = 0;
  while (true) {
    const std::size_t comma = text.find(',', start);
    std::string entry = text.substr(start, comma == std::string::npos ? std::string::npos : comma - start);
    const auto first = entry.find_first_not_of(" \t"), last = entry.find_last_not_of(" \t");
    entry = first == std::string::npos ? std::string() : entry.substr(first, last - first + 1);
    DLO_CHECK(!entry.empty(), what, ": an empty entry in '", text, "' (write PATH[:STRENGTH], separated by commas)");
    out.push_back(parse_lora_spec(entry, what));
    if (comma == std::string::npos) break;
    start = comma + 1;
  }
  return out;
}

std::string lora_list_text(const std::vector<LoraSpec>& specs) {
  std::string s;
  for (const auto& l : specs) s += str(s.empty() ? "" : ", ", lora_spec_text(l));
  return s;
}

std::string file_identity(const std::string& path) {
  Sha256 h;
  hash_file(h, path);
  return h.hex_digest().substr(0, 16);
}

std::string model_identity(const ModelParts& parts) {
  const std::string& dir = parts.dir;
  return with_context(str("model folder '", dir, "'"), [&] {
    Sha256 h;
    const auto add_named = [&](const std::string& name, const std::string& path) {
      h.update(name.data(), name.size() + 1);  // with its NUL: names and contents cannot run together
      hash_file(h, path);
    };
    const auto add = [&](const std::string& rel) { add_named(rel, dir + "/" + rel); };
    // A transformer given as its own weights: its file (by content, not by name or place), or every
    // file of its folder by name. Marked, so it never reads as the folder's transformer/.
    const auto add_given = [&](const std::string& part, const std::string& path) {
      const std::string tag = part + " (given)";
      if (!is_dir(path)) return add_named(tag, path);
      for (const auto& name : files_of(path)) add_named(tag + "/" + name, path + "/" + name);
    };
    add("model_index.json");
    for (const char* part : {"scheduler", "text_encoder", "tokenizer", "transformer", "transformer_2", "vae"}) {
      const std::string& given = std::strcmp(part, "transformer") == 0     ? parts.transformer
                                 : std::strcmp(part, "transformer_2") == 0 ? parts.transformer_2
                                 : std::strcmp(part, "vae") == 0           ? parts.vae_file
                                                                           : std::string();
      if (!given.empty()) {
        add_given(part, given);
        // A VAE given still decodes with the statistics of the folder's vae/config.json, if any.
        if (std::strcmp(part, "vae") == 0 && ::access((dir + "/vae/config.json").c_str(), F_OK) == 0) add("vae/config.json");
        continue;
      }
      // transformer_2/ only where there is one: a Wan2.1 folder's identity is what it always was.
      if (std::strcmp(part, "transformer_2") == 0 && !is_dir(dir + "/" + part)) continue;
      for (const auto& name : files_of(dir + "/" + part)) add(std::string(part) + "/" + name);
    }
    // Fused LoRAs change the weights: each file by content, with where and how strongly it applies.
    for (const auto& l : parts.fused_loras) {
      LoraSpec tag = l;
      tag.path = "fused LoRA";
      add_named(lora_spec_text(tag), l.path);
    }
    return h.hex_digest().substr(0, 16);
  });
}

std::vector<std::string> ModelInfo::expert_weights() const {
  if (two_experts()) return {parts.transformer_weights(), parts.transformer_2_weights()};
  return {parts.transformer_weights()};
}

std::vector<WanTransformerConfig> ModelInfo::expert_configs() const {
  if (two_experts()) return {transformer, *transformer_2};
  return {transformer};
}

std::int64_t ModelInfo::spatial_multiple() const { return vae.scale_factor_spatial * transformer.patch_size[1]; }
std::int64_t ModelInfo::temporal_factor() const { return vae.scale_factor_temporal; }

std::vector<std::int64_t> ModelInfo::latent_shape(std::int64_t frames, std::int64_t height, std::int64_t width) const {
  return {1, transformer.in_channels, (frames - 1) / vae.scale_factor_temporal + 1, height / vae.scale_factor_spatial,
          width / vae.scale_factor_spatial};
}

WanVaeConfig read_vae_config(const ModelParts& parts) {
  const std::string json = parts.vae() + "/config.json";
  if (parts.vae_file.empty()) return WanVaeConfig::from_json(JsonConfig::load(json));
  std::optional<WanVaeConfig> folder;
  if (::access(json.c_str(), F_OK) == 0) folder = WanVaeConfig::from_json(JsonConfig::load(json));
  return infer_wan_vae_config(tensor_shapes(open_wan_vae(parts.vae_file)), folder ? &*folder : nullptr,
                              str("vae weights '", parts.vae_file, "'"));
}

WanTransformerConfig read_expert_config(const ModelParts& parts, bool second) {
  const std::string part = second ? "transformer_2" : "transformer";
  const std::string& given = second ? parts.transformer_2 : parts.transformer;
  const std::string json = parts.folder(part) + "/config.json";
  if (given.empty()) return WanTransformerConfig::from_json(JsonConfig::load(json));
  std::optional<WanTransformerConfig> folder;
  if (::access(json.c_str(), F_OK) == 0) folder = WanTransformerConfig::from_json(JsonConfig::load(json));
  return infer_wan_transformer_config(tensor_shapes(open_wan_transformer(given)), folder ? &*folder : nullptr,
                                      str(part, " weights '", given, "'"));
}

ModelInfo read_model_info(const ModelParts& parts) {
  const std::string& dir = parts.dir;
  return with_context(str("model folder '", dir, "'"), [&] {
    DLO_CHECK(is_dir(dir), "not a folder");
    std::vector<std::string> missing;
    for (const char* part : {"transformer", "vae", "text_encoder", "tokenizer", "scheduler"})
      if (!is_dir(parts.folder(part)) && !(std::strcmp(part, "transformer") == 0 && !parts.transformer.empty()) &&
          !(std::strcmp(part, "vae") == 0 && !parts.vae_file.empty()))
        missing.push_back(part);
    if (!missing.empty()) {
      std::string list;
      for (const auto& m : missing) list += (list.empty() ? "" : ", ") + m + "/";
      DLO_CHECK(false, "lacks ", list, " (a diffusers Wan2.1 text-to-video folder has transformer/, vae/, ",
                "text_encoder/, tokenizer/ and scheduler/)");
    }
    check_regular_file(parts.index());
    const ModelIndex index = check_model_index(JsonConfig::load(parts.index()));
    DLO_CHECK(parts.transformer_2.empty() || index.transformer_2, "the low-noise expert's weights are given ('",
              parts.transformer_2, "'), but the model has one transformer (model_index.json names no transformer_2)");
    ModelInfo info;
    info.parts = parts;
    info.transformer = read_expert_config(parts, false);
    if (index.transformer_2) {
      DLO_CHECK(!parts.transformer_2.empty() || is_dir(parts.folder("transformer_2")),
                "model_index.json names transformer_2 (the low-noise expert) but the folder has no transformer_2/");
      const WanTransformerConfig t2 = read_expert_config(parts, true);
      const WanTransformerConfig& t1 = info.transformer;
      // Both experts denoise the same latents against the same text: what they exchange must agree.
      const auto differ = [&](const char* field, auto a, auto b) {
        DLO_CHECK(a == b, "transformer_2/config.json: field '", field, "' differs from transformer/'s (", b, " vs ", a,
                  "): both experts take the same latents and text");
      };
      differ("in_channels", t1.in_channels, t2.in_channels);
      differ("out_channels", t1.out_channels, t2.out_channels);
      differ("text_dim", t1.text_dim, t2.text_dim);
      for (std::size_t k = 0; k < 3; ++k) differ("patch_size", t1.patch_size[k], t2.patch_size[k]);
      differ("rope_max_seq_len", t1.rope_max_seq_len, t2.rope_max_seq_len);
      info.transformer_2 = t2;
      info.boundary_ratio = index.boundary_ratio;
    }
    info.expand_timesteps = index.expand_timesteps;
    for (const auto& l : parts.fused_loras) {
      const std::string text = lora_spec_text(l);
      DLO_CHECK(l.expert < 0 || index.transformer_2, "the fused LoRA '", text, "' names an expert (high=/low=), but the ",
                "model has one transformer: write it without high= or low=");
      DLO_CHECK(l.expert >= 0 || !index.transformer_2, "the fused LoRA '", text, "': the model has two experts; name the ",
                "one it is for: high=PATH (transformer/, the high-noise steps) or low=PATH (transformer_2/)");
      with_context(str("the fused LoRA '", text, "'"), [&] { check_regular_file(l.path); });
    }
    // WanPipeline's per-token timestep takes every second latent row and column (mask[:, ::2, ::2]):
    // one per token only for the [1, 2, 2] patch; any other would fail in the transformer.
    for (const auto& tc : info.expert_configs()) {
      const auto& p = tc.patch_size;
      DLO_CHECK(!info.expand_timesteps || (p[0] == 1 && p[1] == 2 && p[2] == 2),
                "model_index.json: field 'expand_timesteps' is true, but the transformer's patch_size is [", p[0], ", ",
                p[1], ", ", p[2], "]; WanPipeline's per-token timestep (mask[:, ::2, ::2]) needs [1, 2, 2]");
    }
    info.vae = read_vae_config(parts);
    DLO_CHECK(info.vae.video_channels() == 3, "vae/config.json: field 'out_channels' is ", info.vae.out_channels,
              info.vae.patch() > 1 ? str(" (", info.vae.video_channels(), " channels after unpatchify of patch_size ",
                                         info.vae.patch(), ")")
                                   : std::string(),
              "; dlo writes RGB video (3 channels)");
    info.text_encoder = Umt5Config::from_json(JsonConfig::load(parts.text_encoder() + "/config.json"));
    info.scheduler = NoiseSchedulerConfig::from_json_file(parts.scheduler() + "/scheduler_config.json");
    DLO_CHECK(info.text_encoder.d_model == info.transformer.text_dim, "the text encoder's d_model (",
              info.text_encoder.d_model, ") differs from the transformer's text_dim (", info.transformer.text_dim, ")");
    DLO_CHECK(info.transformer.in_channels == info.vae.z_dim && info.transformer.out_channels == info.vae.z_dim,
              "the transformer's latent channels (in ", info.transformer.in_channels, ", out ",
              info.transformer.out_channels, ") differ from the VAE's z_dim (", info.vae.z_dim, ")",
              parts.vae_file.empty() ? std::string() : str(" of the vae weights '", parts.vae_file, "'"));
    return info;
  });
}

}  // namespace dlo
