#include "dlo/pipeline/memory_estimate.h"

#include <dirent.h>
#include <sys/stat.h>

#include <algorithm>

#include "dlo/common/bytes.h"
#include "dlo/common/error.h"
#include "dlo/io/safetensors_writer.h"
#include "dlo/io/tensor_view.h"

namespace dlo {
namespace {

std::uint64_t safetensors_bytes_in(const std::string& dir) {
  DIR* d = ::opendir(dir.c_str());
  DLO_CHECK(d != nullptr, "cannot read the folder '", dir, "'");
  std::uint64_t total = 0;
  while (const dirent* e = ::readdir(d)) {
    const std::string name = e->d_name;
    if (name.size() < 12 || name.compare(name.size() - 12, 12, ".safetensors") != 0) continue;
    struct stat st;
    if (::stat((dir + "/" + name).c_str(), &st) == 0) total += static_cast<std::uint64_t>(st.st_size);
  }
  ::closedir(d);
  return total;
}

}  // namespace

MemoryEstimate estimate_memory(const ModelInfo& model, const std::vector<JobSpec>& jobs, int ranks,
                               Strategy strategy, at::ScalarType dtype) {
  MemoryEstimate m;
  const auto& c = model.transformer;
  std::uint64_t block = 0;
  for (const auto& spec : wan_block_specs(c, from_scalar_type(dtype))) block += spec.nbytes();
  m.largest_block = block;
  m.blocks_bytes = block * static_cast<std::uint64_t>(c.num_layers);
  const auto n = static_cast<std::uint64_t>(std::max(1, ranks));
  // Host shards: dlo; mixed keeps some of them on the device instead (this bounds it from above).
  if (strategy == Strategy::kDlo || strategy == Strategy::kMixed) m.kept_per_rank = (m.blocks_bytes + n - 1) / n;
  if (strategy == Strategy::kLayerwise) m.kept_per_rank = m.blocks_bytes;
  if (strategy != Strategy::kResident) m.slots = 2 * block;
  m.text_encoder = safetensors_bytes_in(model.dir + "/text_encoder");
  m.vae = safetensors_bytes_in(model.dir + "/vae");
  const std::uint64_t elem = dtype == at::kFloat ? 4 : 2;
  for (const auto& j : jobs) {
    const auto s = model.latent_shape(j);
    const auto tokens = static_cast<std::uint64_t>(s[2] * (s[3] / c.patch_size[1]) * (s[4] / c.patch_size[2]));
    const std::uint64_t branches = j.guided() ? 2 : 1;
    // Hidden states, the FFN's intermediate and attention's q/k/v/out for every branch.
    const std::uint64_t act = branches * tokens * elem *
                              (4 * static_cast<std::uint64_t>(c.dim()) + static_cast<std::uint64_t>(c.ffn_dim));
    m.activations = std::max(m.activations, act);
    // The decoder's largest stage at full resolution: a few tensors of 4 frames plus the causal
    // caches (2 frames) of its convolutions, fp32.
    const auto dims = model.vae.decoder_dims();
    const std::uint64_t top = static_cast<std::uint64_t>(*std::max_element(dims.begin(), dims.end()) / 2);
    const auto pixels = static_cast<std::uint64_t>(j.height * j.width);
    const std::uint64_t dec = top * pixels * 4 * (4 * 4 + 2 * 6) + static_cast<std::uint64_t>(j.frames) * pixels * 3;
    m.decode_working = std::max(m.decode_working, dec);
  }
  m.host_per_rank = m.kept_per_rank + m.slots + m.activations + m.decode_working;
  m.shared_per_node = m.text_encoder + m.vae + (strategy == Strategy::kResident ? m.blocks_bytes : 0);
  return m;
}

std::string MemoryEstimate::describe() const {
  return str("  transformer blocks   ", human_bytes(blocks_bytes), " (largest ", human_bytes(largest_block), ")\n",
             "  kept per rank        ", human_bytes(kept_per_rank), "\n",
             "  slots per rank       ", human_bytes(slots), "\n",
             "  activations (est.)   ", human_bytes(activations), "\n",
             "  VAE decode (est.)    ", human_bytes(decode_working), "\n",
             "  text encoder         ", human_bytes(text_encoder), " (mmap, shared by a node's ranks)\n",
             "  VAE weights          ", human_bytes(vae), "\n",
             "  private per rank     ", human_bytes(host_per_rank), "; shared per node ", human_bytes(shared_per_node));
}

}  // namespace dlo
