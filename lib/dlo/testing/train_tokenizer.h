// A tiny tokenizer for random-weight models and tests (dlo-checkpoint make, the demo model).
#pragma once

#include <cstdint>
#include <string>

namespace dlo {

// Pieces of the tiny SentencePiece model and the T5 sentinels after them: a text encoder for it
// needs vocab_size >= kTinyTokenizerPieces + kTinyTokenizerExtraIds.
inline constexpr std::int64_t kTinyTokenizerPieces = 512;
inline constexpr std::int64_t kTinyTokenizerExtraIds = 100;

// Trains a unigram SentencePiece model (nmt_nfkc normalisation, ids pad 0, </s> 1, <unk> 2, no
// <s>) on a built-in English text of a few KB and writes `dir`/spiece.model,
// tokenizer_config.json and special_tokens_map.json, which transformers' T5Tokenizer /
// T5TokenizerFast load. Deterministic (one training thread). Throws dlo::Error on failure.
void write_tiny_tokenizer(const std::string& dir);

// The built-in training text (UTF-8, one sentence per line).
const std::string& tiny_tokenizer_corpus();

}  // namespace dlo
