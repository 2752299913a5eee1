// The Wan text pipeline's tokenizer: diffusers' prompt cleaning plus transformers' T5Tokenizer
// (T5TokenizerFast), on a SentencePiece unigram model (`tokenizer/tokenizer.json`, or the same
// model in `tokenizer/spiece.model`).
//
// What is equal to transformers 5.x, and how:
//  * prompt_clean() is diffusers' pipeline_wan.prompt_clean *without ftfy* (diffusers skips
//    ftfy.fix_text when ftfy is not installed, as in the project venv): html.unescape twice,
//    strip, every run of Unicode whitespace -> one space, strip. Where ftfy is installed,
//    diffusers also runs ftfy.fix_text (mojibake repair, NFC, ...), which dlo does not.
//  * Special tokens (<pad>, </s>, <unk>, <extra_id_N>, and the model's control / user-defined
//    pieces) are cut out of the raw text first, leftmost-longest, as tokenizers' AddedVocabulary
//    does. Between them the text goes through transformers' pipeline, reimplemented on the data of
//    spiece.model (which libsentencepiece loads and validates): the Precompiled normaliser (the
//    model's precompiled charsmap applied per grapheme cluster, as spm_precompiled does it),
//    WhitespaceSplit, Metaspace(replacement U+2581, prepend_scheme="always", split=True), and the
//    Unigram Viterbi of tokenizers (f64 scores, first-best on ties, unknown characters fused into
//    one <unk>, unknown score = min score - 10).
//    SentencePiece's own Encode() differs from transformers on ties and on some combining
//    sequences, which is why it is not used for encoding. Residual risk: the grapheme break data
//    (text_tables.cpp) is the venv `regex` package's Unicode version, not necessarily that of the
//    Rust unicode-segmentation crate inside tokenizers; they differ only for newly encoded
//    characters.
//  * The vocabulary is the SentencePiece pieces followed by the `extra_ids` sentinels in reverse
//    (<extra_id_{n-1}> ... <extra_id_0>), as transformers' T5 converter builds it.
//
// Supported tokenizer folders: `tokenizer.json` as transformers 5's save_pretrained writes a T5
// tokenizer (the same pipeline serialised by tokenizers: Unigram vocabulary with scores,
// Precompiled charsmap in base64, WhitespaceSplit + Metaspace, "$A </s>", added tokens); or,
// without tokenizer.json, `spiece.model`; either with optional `tokenizer_config.json`
// (extra_ids, additional_special_tokens, eos/pad/unk tokens) and `special_tokens_map.json`. A
// tokenizer.json of any other shape (BPE, byte fallback, another normaliser or pre-tokeniser,
// stripping added tokens) is refused naming the field.
// With both files, tokenizer.json is read and spiece.model is not opened, as transformers 5.23
// does (TokenizersBackend.convert_to_native_format: T5Tokenizer takes the vocabulary, charsmap
// and added tokens from tokenizer.json whenever it is a file, and converts spiece.model only
// without it): a folder whose re-saved tokenizer.json was written over an original spiece.model
// gives WanPipeline's ids, whatever the stale spiece.model holds. A tokenizer.json that cannot be
// read is an error naming it, never a reason to fall back to spiece.model (transformers fails on
// it too; where it is not a regular file, a FIFO or a directory, transformers would take
// spiece.model and dlo refuses the folder).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace dlo {

// Python's html.unescape() on UTF-8 text (HTML5 named references, numeric references with the
// HTML5 replacement rules). Throws dlo::Error if `text` is not valid UTF-8.
std::string html_unescape(const std::string& text);

// diffusers' pipeline_wan.prompt_clean() without ftfy (see above). Throws dlo::Error if `text`
// is not valid UTF-8.
std::string prompt_clean(const std::string& text);

// One tokenized batch, row-major [batch, length].
struct TokenizedBatch {
  std::int64_t batch = 0, length = 0;
  std::vector<std::int64_t> input_ids;       // pad id (0) after the real tokens
  std::vector<std::int64_t> attention_mask;  // 1 for real tokens (incl. </s>), 0 for padding
  std::vector<std::int64_t> seq_lens;        // real tokens per row
};

class T5Tokenizer {
 public:
  // Loads a transformers T5 tokenizer folder (tokenizer.json when there is one, else
  // spiece.model: above). Throws dlo::Error naming the folder, file and field when neither file is
  // there, or the file read is unreadable, not a unigram model, not of the supported shape
  // (above), or lacks the T5 ids pad=0, </s>=1, <unk>=2.
  static T5Tokenizer load(const std::string& dir);

  T5Tokenizer(T5Tokenizer&&) noexcept;
  T5Tokenizer& operator=(T5Tokenizer&&) noexcept;
  ~T5Tokenizer();

  // tokenizer(text, add_special_tokens=False).input_ids: no cleaning, no </s>.
  std::vector<std::int64_t> encode(const std::string& text) const;

  // tokenizer(texts, padding="max_length", max_length=max_length, truncation=True,
  // add_special_tokens=True): ids truncated to max_length - 1, then </s>, then padding.
  TokenizedBatch encode_padded(const std::vector<std::string>& texts, std::int64_t max_length) const;

  // What WanPipeline._get_t5_prompt_embeds feeds the text encoder: prompt_clean() each prompt,
  // then encode_padded(). max_sequence_length is 512 in the pipeline's __call__.
  TokenizedBatch encode_prompts(const std::vector<std::string>& prompts, std::int64_t max_sequence_length = 512) const;

  std::int64_t vocab_size() const;  // len(tokenizer): pieces + extra ids
  std::int64_t pad_id() const { return 0; }
  std::int64_t eos_id() const { return 1; }
  std::int64_t unk_id() const { return 2; }
  // The id of `token` (a piece or an added token), or -1.
  std::int64_t token_to_id(const std::string& token) const;
  const std::string& dir() const;
  // The file the vocabulary was read from: dir()/tokenizer.json or dir()/spiece.model.
  const std::string& source() const;

  // Throws dlo::Error (input) naming source(), the first id at or beyond `encoder_vocab_size` (the
  // text encoder's vocab_size, the rows of its embedding) and that size, when the vocabulary has
  // such ids: a prompt reaching one would index past the embedding (transformers fails there at
  // encoding). For the model folder's check before any job.
  void check_fits_encoder(std::int64_t encoder_vocab_size) const;

  // Thread-safety: const methods may be called from several threads at once.
  struct Impl;

 private:
  explicit T5Tokenizer(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace dlo
