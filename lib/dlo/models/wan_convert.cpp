#include "dlo/models/wan_convert.h"

#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <optional>

#include <ATen/ATen.h>

#include "dlo/common/error.h"
#include "dlo/common/file.h"
#include "dlo/common/text.h"
#include "dlo/config/wan_tensor_names.h"
#include "dlo/io/json_config.h"
#include "dlo/models/tensor_view.h"

namespace dlo {

WanConvertResult convert_wan_transformer(const std::string& src, const std::string& dst_dir, LinearStorage storage,
                                         at::ScalarType compute, WriteOptions options) {
  const Checkpoint ck = open_wan_transformer(src);
  std::optional<WanTransformerConfig> folder;
  const std::string json = src + "/config.json";
  std::error_code ec;
  if (std::filesystem::is_directory(src, ec) && ::access(json.c_str(), F_OK) == 0) folder = WanTransformerConfig::from_json(JsonConfig::load(json));
  WanConvertResult r;
  r.config = infer_wan_transformer_config(tensor_shapes(ck), folder ? &*folder : nullptr, str("transformer '", src, "'"));
  r.dtypes = resolve_wan_dtypes(storage, compute, ck, "--storage-dtype");
  check_writes_elsewhere(ck, dst_dir);
  std::vector<TensorSpec> specs;
  std::vector<const TensorInfo*> infos;
  for (const auto& f : ck.files())  // file order: the source is read sequentially
    for (const auto& t : f->header().tensors) {
      specs.push_back({t.name, from_scalar_type(r.dtypes.stored(t.name)), t.shape});
      infos.push_back(&ck.at(t.name));
    }
  options.metadata["format"] = "pt";
  r.written = write_safetensors_dir(
      dst_dir, specs,
      [&](std::size_t i, const TensorSpec& spec, std::byte* out) {
        const at::Tensor kept = r.dtypes.keep(spec.name, tensor_view(ck, *infos[i])).contiguous();
        std::memcpy(out, kept.data_ptr(), spec.nbytes());
      },
      options);
  write_file_atomic(dst_dir + "/config.json", r.config.to_json() + "\n");
  return r;
}

}  // namespace dlo
