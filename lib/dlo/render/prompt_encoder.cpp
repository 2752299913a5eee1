#include "dlo/render/prompt_encoder.h"

#include <ATen/ATen.h>

#include "dlo/common/error.h"

namespace dlo {

PromptEncoder::PromptEncoder(const ModelParts& model, at::ScalarType dtype, at::Device device)
    : tokenizer_(T5Tokenizer::load(model.tokenizer())), encoder_(Umt5Encoder::load(model.text_encoder(), dtype)) {
  encoder_.to_device(device);
}

at::Tensor PromptEncoder::encode(const std::string& prompt, std::int64_t max_sequence_length) const {
  const TokenizedBatch b = tokenizer_.encode_prompts({prompt}, max_sequence_length);
  const at::Tensor ids = at::tensor(b.input_ids, at::kLong).view({b.batch, b.length});
  const at::Tensor mask = at::tensor(b.attention_mask, at::kLong).view({b.batch, b.length});
  return encoder_.forward(ids, mask);
}

}  // namespace dlo
