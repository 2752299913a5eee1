// WanPipeline's prompt encoding: prompt_clean, the T5 tokenizer (512 tokens, padded), the UMT5
// encoder, and the trim to the prompt's real tokens with zero rows after them.
#pragma once

#include <cstdint>
#include <string>

#include <ATen/core/Tensor.h>

#include "dlo/config/model_info.h"
#include "dlo/models/umt5.h"
#include "dlo/text/tokenizer.h"

namespace dlo {

class PromptEncoder {
 public:
  // Loads the model's tokenizer and text encoder. On the CPU the weights stay the
  // checkpoint's mmap pages where the dtype allows (one copy per node however many ranks encode);
  // on a CUDA `device` they are copied there and the encoder runs there (on the calling thread's
  // current stream). Throws dlo::Error naming the folder.
  PromptEncoder(const ModelParts& model, at::ScalarType dtype, at::Device device = at::kCPU);

  // _get_t5_prompt_embeds for one prompt: [1, max_sequence_length, d_model] in the encoder's dtype,
  // on the encoder's device. Throws dlo::Error for a prompt that is not valid UTF-8. Thread-compatible.
  at::Tensor encode(const std::string& prompt, std::int64_t max_sequence_length = 512) const;

 private:
  T5Tokenizer tokenizer_;
  Umt5Encoder encoder_;
};

}  // namespace dlo
