#include "dlo/config/model_info.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "dlo/common/error.h"
#include "dlo/common/file.h"
#include "dlo/common/sha256.h"
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
// fields that change what a folder means. A folder of the two-expert A14B (transformer_2 and
// boundary_ratio) or of TI2V-5B (expand_timesteps) would otherwise render with transformer/ alone
// and one timestep per sample: a wrong video without an error. They are refused by name until
// this build runs them.
void check_model_index(const JsonConfig& j) {
  const std::string& f = j.path();
  if (j.has("_class_name")) {
    const std::string cls = j.get_string("_class_name");
    DLO_CHECK(cls == "WanPipeline", f, ": field '_class_name' is '", cls,
              "'; dlo renders diffusers' WanPipeline (Wan text-to-video) folders");
  }
  if (const auto* t2 = j.find("transformer_2")) {
    const bool absent = t2->is_null() || (t2->is_array() && std::all_of(t2->begin(), t2->end(),
                                                                        [](const auto& v) { return v.is_null(); }));
    DLO_CHECK(absent, f, ": field 'transformer_2' is ", j.dump("transformer_2"),
              ": a second expert (Wan2.2 A14B, which switches experts at boundary_ratio); two-expert models are "
              "not supported by this build");
  }
  DLO_CHECK(!j.has("boundary_ratio"), f, ": field 'boundary_ratio' is ", j.dump("boundary_ratio"),
            " (the step at which Wan2.2 A14B switches to transformer_2); two-expert models are not supported by "
            "this build");
  DLO_CHECK(!j.get_bool("expand_timesteps", false), f,
            ": field 'expand_timesteps' is true (Wan2.2 TI2V-5B: a timestep per token); not supported by this build");
}

}  // namespace

std::string model_identity(const std::string& dir) {
  return with_context(str("model folder '", dir, "'"), [&] {
    Sha256 h;
    const auto add = [&](const std::string& rel) {
      h.update(rel.data(), rel.size() + 1);  // with its NUL: names and contents cannot run together
      hash_file(h, dir + "/" + rel);
    };
    add("model_index.json");
    for (const char* part : {"scheduler", "text_encoder", "tokenizer", "transformer", "vae"})
      for (const auto& name : files_of(dir + "/" + part)) add(std::string(part) + "/" + name);
    return h.hex_digest().substr(0, 16);
  });
}

std::int64_t ModelInfo::spatial_multiple() const { return vae.scale_factor_spatial * transformer.patch_size[1]; }
std::int64_t ModelInfo::temporal_factor() const { return vae.scale_factor_temporal; }

std::vector<std::int64_t> ModelInfo::latent_shape(std::int64_t frames, std::int64_t height, std::int64_t width) const {
  return {1, transformer.in_channels, (frames - 1) / vae.scale_factor_temporal + 1, height / vae.scale_factor_spatial,
          width / vae.scale_factor_spatial};
}

ModelInfo read_model_info(const std::string& dir) {
  return with_context(str("model folder '", dir, "'"), [&] {
    DLO_CHECK(is_dir(dir), "not a folder");
    std::vector<std::string> missing;
    for (const char* part : {"transformer", "vae", "text_encoder", "tokenizer", "scheduler"})
      if (!is_dir(dir + "/" + part)) missing.push_back(part);
    if (!missing.empty()) {
      std::string list;
      for (const auto& m : missing) list += (list.empty() ? "" : ", ") + m + "/";
      DLO_CHECK(false, "lacks ", list, " (a diffusers Wan2.1 text-to-video folder has transformer/, vae/, ",
                "text_encoder/, tokenizer/ and scheduler/)");
    }
    check_regular_file(dir + "/model_index.json");
    check_model_index(JsonConfig::load(dir + "/model_index.json"));
    ModelInfo info;
    info.dir = dir;
    info.transformer = WanTransformerConfig::from_json(JsonConfig::load(dir + "/transformer/config.json"));
    info.vae = WanVaeConfig::from_json(JsonConfig::load(dir + "/vae/config.json"));
    info.text_encoder = Umt5Config::from_json(JsonConfig::load(dir + "/text_encoder/config.json"));
    info.scheduler = NoiseSchedulerConfig::from_json_file(dir + "/scheduler/scheduler_config.json");
    DLO_CHECK(info.text_encoder.d_model == info.transformer.text_dim, "the text encoder's d_model (",
              info.text_encoder.d_model, ") differs from the transformer's text_dim (", info.transformer.text_dim, ")");
    DLO_CHECK(info.transformer.in_channels == info.vae.z_dim && info.transformer.out_channels == info.vae.z_dim,
              "the transformer's latent channels (in ", info.transformer.in_channels, ", out ",
              info.transformer.out_channels, ") differ from the VAE's z_dim (", info.vae.z_dim, ")");
    return info;
  });
}

}  // namespace dlo
