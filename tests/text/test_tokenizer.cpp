// dlo/text/tokenizer.h: prompt cleaning, the T5 tokenizer's algorithm on a hand-made SentencePiece
// model (ids computed by hand), folder errors, and the tiny trained tokenizer.
// Equality with transformers on many prompts is in tools/reference/tokenizer_parity.py (parity).
#include <doctest/doctest.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <functional>
#include <sstream>

#include "common/test_util.h"
#include "common/source_tree.h"
#include "dlo/testing/train_tokenizer.h"
#include "dlo/common/error.h"
#include "dlo/text/tokenizer.h"

#include <nlohmann/json.hpp>

using namespace dlo;
using dlo::test::TempDir;
using Ids = std::vector<std::int64_t>;

namespace {

// A SentencePiece ModelProto in protobuf wire format (sentencepiece_model.proto).
struct Proto {
  std::string bytes;
  void varint(std::uint64_t v) {
    while (v >= 0x80) {
      bytes.push_back(static_cast<char>((v & 0x7F) | 0x80));
      v >>= 7;
    }
    bytes.push_back(static_cast<char>(v));
  }
  void tag(int field, int wire) { varint(static_cast<std::uint64_t>(field) << 3 | wire); }
  void field(int f, const std::string& s) {
    tag(f, 2);
    varint(s.size());
    bytes += s;
  }
  void field(int f, std::uint64_t v) {
    tag(f, 0);
    varint(v);
  }
  void field(int f, float x) {
    tag(f, 5);
    char b[4];
    std::memcpy(b, &x, 4);
    bytes.append(b, 4);
  }
};

struct Piece {
  std::string text;
  float score;
  int type;  // 1 normal, 2 unknown, 3 control, 4 user-defined
};

// Unigram model, identity normalisation (no charsmap).
std::string make_model(const std::vector<Piece>& pieces, bool byte_fallback = false) {
  Proto m;
  for (const auto& p : pieces) {
    Proto sp;
    sp.field(1, p.text);
    sp.field(2, p.score);
    sp.field(3, static_cast<std::uint64_t>(p.type));
    m.field(1, sp.bytes);
  }
  Proto trainer;
  trainer.field(3, std::uint64_t{1});  // model_type UNIGRAM
  trainer.field(40, std::uint64_t{2});  // unk_id
  trainer.field(42, std::uint64_t{1});  // eos_id
  trainer.field(43, std::uint64_t{0});  // pad_id
  if (byte_fallback) trainer.field(35, std::uint64_t{1});
  m.field(2, trainer.bytes);
  Proto norm;
  norm.field(1, std::string("identity"));
  m.field(3, norm.bytes);
  return m.bytes;
}

const std::string kMeta = "\xE2\x96\x81";  // U+2581

// Pieces with scores chosen so that segmentations can be worked out by hand.
std::vector<Piece> hand_pieces() {
  return {{"<pad>", 0, 3},      {"</s>", 0, 3},      {"<unk>", 0, 2},  {kMeta, -2, 1},      {"a", -1, 1},
          {"b", -1, 1},         {kMeta + "a", -1.5f, 1}, {"ab", -1.5f, 1}, {kMeta + "ab", -4, 1}, {"x", -1, 1},
          {"xx", -2, 1},        {"<sep>", 0, 4}};
}

void write(const std::string& path, const std::string& bytes) { dlo::test::write_file(path, bytes); }

std::string load_error(const std::string& dir) {
  try {
    T5Tokenizer::load(dir);
  } catch (const Error& e) {
    return e.what();
  }
  return "(no error)";
}

bool contains(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

// The hand-made model as transformers 5 saves it: tokenizer.json alone (tokenizers' format, the
// shape read off a T5 tokenizer that transformers 5.23 re-saved), two extra ids in the vocabulary.
nlohmann::json hand_tokenizer_json() {
  nlohmann::json vocab = nlohmann::json::array(), added = nlohmann::json::array();
  std::int64_t id = 0;
  auto add_token = [&](const std::string& t, std::int64_t i) {
    added.push_back({{"id", i}, {"content", t}, {"single_word", false}, {"lstrip", false}, {"rstrip", false},
                     {"normalized", false}, {"special", true}});
  };
  for (const auto& p : hand_pieces()) {
    vocab.push_back({p.text, p.score});
    if (p.type == 2 || p.type == 3 || p.type == 4) add_token(p.text, id);
    ++id;
  }
  for (const char* e : {"<extra_id_1>", "<extra_id_0>"}) {
    vocab.push_back({e, 0.0});
    add_token(e, id++);
  }
  return {{"version", "1.0"},
          {"truncation", nullptr},
          {"padding", nullptr},
          {"added_tokens", added},
          {"normalizer", nullptr},
          {"pre_tokenizer",
           {{"type", "Sequence"},
            {"pretokenizers",
             {{{"type", "WhitespaceSplit"}},
              {{"type", "Metaspace"}, {"replacement", kMeta}, {"prepend_scheme", "always"}, {"split", true}}}}}},
          {"post_processor",
           {{"type", "TemplateProcessing"},
            {"single", {{{"Sequence", {{"id", "A"}, {"type_id", 0}}}}, {{"SpecialToken", {{"id", "</s>"}, {"type_id", 0}}}}}}}},
          {"decoder", {{"type", "Metaspace"}, {"replacement", kMeta}, {"prepend_scheme", "always"}, {"split", true}}},
          {"model", {{"type", "Unigram"}, {"unk_id", 2}, {"vocab", vocab}, {"byte_fallback", false}}}};
}

}  // namespace

TEST_CASE("html_unescape follows Python's html.unescape (HTML5 rules)") {
  CHECK(html_unescape("a &amp; b &lt;c&gt; &quot;d&quot;") == "a & b <c> \"d\"");
  CHECK(html_unescape("&amp") == "&");         // some names are valid without ';'
  CHECK(html_unescape("&ampx;") == "&x;");     // longest name that is a prefix
  CHECK(html_unescape("&notit;") == "\xC2\xACit;");  // "&not" + "it;"
  CHECK(html_unescape("&notin;") == "\xE2\x88\x89");
  CHECK(html_unescape("&#65;&#x42;&#X43") == "ABC");
  CHECK(html_unescape("&#0;") == "\xEF\xBF\xBD");     // U+FFFD
  CHECK(html_unescape("&#x80;") == "\xE2\x82\xAC");   // cp1252: the euro sign
  CHECK(html_unescape("&#13;") == "\r");
  CHECK(html_unescape("x&#1;y") == "xy");             // invalid code points vanish
  CHECK(html_unescape("&#xD800;&#1114112;") == "\xEF\xBF\xBD\xEF\xBF\xBD");
  CHECK(html_unescape("&#; & amp; &unknownname; &") == "&#; & amp; &unknownname; &");
  CHECK(html_unescape("&amp;amp;") == "&amp;");  // one level per call
  CHECK_THROWS_WITH_AS(html_unescape("bad \xFF byte"), doctest::Contains("not valid UTF-8"), Error);
}

TEST_CASE("prompt_clean is diffusers' prompt_clean without ftfy") {
  // unescape twice, strip, whitespace runs -> ' ', strip (str.strip also removes U+001C..U+001F).
  CHECK(prompt_clean(" \t a&amp;amp;b \xE3\x80\x80 c\x1c ") == "a&b c");
  CHECK(prompt_clean("line\r\nbreak\u00a0here") == "line break here");
  CHECK(prompt_clean("") == "");
  CHECK(prompt_clean("  \n ") == "");
  CHECK(prompt_clean("a&#10;&#10;b") == "a b");  // whitespace made by unescaping is folded too
  CHECK(prompt_clean("zero\xE2\x80\x8Bwidth") == "zero\xE2\x80\x8Bwidth");  // U+200B is not whitespace
  CHECK_THROWS_WITH_AS(prompt_clean("\xC3"), doctest::Contains("prompt is not valid UTF-8"), Error);
}

TEST_CASE("T5 tokenization on a hand-made unigram model: ids worked out by hand") {
  TempDir dir;
  write(dir.file("spiece.model"), make_model(hand_pieces()));
  write(dir.file("tokenizer_config.json"), R"({"extra_ids": 2, "tokenizer_class": "T5Tokenizer"})");
  const auto t = T5Tokenizer::load(dir.path().string());
  // Vocabulary: 12 pieces, then <extra_id_1>, <extra_id_0>.
  CHECK(t.vocab_size() == 14);
  CHECK(t.token_to_id("<extra_id_1>") == 12);
  CHECK(t.token_to_id("<extra_id_0>") == 13);
  CHECK(t.token_to_id("<extra_id_2>") == -1);

  // "ab" -> "▁ab": ▁a + b (-2.5) beats ▁ + ab (-3.5), ▁ab (-4) and ▁ + a + b (-4).
  CHECK(t.encode("ab") == Ids{6, 5});
  // "▁xxx": x+xx, xx+x and x+x+x all score -3; the first best found (start order, then length) wins.
  CHECK(t.encode("xxx") == Ids{3, 9, 10});
  // Unknown characters in a row are one <unk> (fused), also multi-byte ones.
  CHECK(t.encode("aZZb") == Ids{6, 2, 5});
  CHECK(t.encode("a\xE6\xBC\xA2\xF0\x9F\x98\x80" "b") == Ids{6, 2, 5});
  // Special tokens (incl. user-defined pieces and extra ids) are cut out of the raw text first;
  // every other segment gets its own leading ▁.
  CHECK(t.encode("a</s>b<sep>x<extra_id_0>") == Ids{6, 1, 3, 5, 11, 3, 9, 13});
  CHECK(t.encode("<pad><unk></s>") == Ids{0, 2, 1});
  // Whitespace splits words; a literal ▁ starts a piece; a word starting with ▁ gets no second one.
  CHECK(t.encode("  a \t\n b  ") == Ids{6, 3, 5});
  CHECK(t.encode("a" + kMeta + "b") == Ids{6, 3, 5});
  CHECK(t.encode(kMeta + "ab") == Ids{6, 5});
  CHECK(t.encode("") == Ids{});
  CHECK(t.encode(" ") == Ids{});

  // Padding, </s>, truncation (room is kept for </s>).
  auto b = t.encode_padded({"ab", ""}, 4);
  CHECK(b.batch == 2);
  CHECK(b.length == 4);
  CHECK(b.input_ids == Ids{6, 5, 1, 0, 1, 0, 0, 0});
  CHECK(b.attention_mask == Ids{1, 1, 1, 0, 1, 0, 0, 0});
  CHECK(b.seq_lens == Ids{3, 1});
  CHECK(t.encode_padded({"xxx ab"}, 3).input_ids == Ids{3, 9, 1});
  CHECK_THROWS_AS(t.encode_padded({"a"}, 0), Error);
  // The pipeline path cleans first: "  a&amp;b " -> "a&b" ('&' is unknown).
  CHECK(t.encode_prompts({"  a&amp;b "}, 6).input_ids == Ids{6, 2, 5, 1, 0, 0});
}

TEST_CASE("tokenizer.json alone (transformers 5's save_pretrained): the same ids as spiece.model") {
  TempDir dir;
  for (const char* d : {"spm", "json"}) std::filesystem::create_directories(dir.file(d));
  write(dir.file("spm/spiece.model"), make_model(hand_pieces()));
  write(dir.file("spm/tokenizer_config.json"), R"({"extra_ids": 2})");
  write(dir.file("json/tokenizer.json"), hand_tokenizer_json().dump());
  write(dir.file("json/tokenizer_config.json"), R"({"eos_token": "</s>", "extra_ids": 2, "backend": "tokenizers"})");
  const auto spm = T5Tokenizer::load(dir.file("spm"));
  const auto json = T5Tokenizer::load(dir.file("json"));
  CHECK(json.vocab_size() == 14);
  CHECK(json.token_to_id("<extra_id_0>") == 13);
  // The hand-worked cases of the SentencePiece test, and the two paths on each other.
  CHECK(json.encode("ab") == Ids{6, 5});
  CHECK(json.encode("xxx") == Ids{3, 9, 10});
  CHECK(json.encode("aZZb") == Ids{6, 2, 5});
  CHECK(json.encode("a</s>b<sep>x<extra_id_0>") == Ids{6, 1, 3, 5, 11, 3, 9, 13});
  CHECK(json.encode("  a \t\n b  ") == Ids{6, 3, 5});
  for (const char* text : {"", " ", "ab ab", "xxxxx a", "<pad><unk></s>", "b\xE6\xBC\xA2" "a", "a\xE2\x96\x81" "b"})
    CHECK(json.encode(text) == spm.encode(text));
  CHECK(json.encode_padded({"xxx ab"}, 3).input_ids == Ids{3, 9, 1});
}

// N3 (batch probe 2026-12-07): with both files dlo read spiece.model, WanPipeline (transformers 5)
// tokenizer.json; a re-saved tokenizer.json written over an original folder gave other frames.
TEST_CASE("a folder with both spiece.model and tokenizer.json that disagree is read from tokenizer.json") {
  TempDir dir;
  for (const char* d : {"both", "spm"}) std::filesystem::create_directories(dir.file(d));
  write(dir.file("spm/spiece.model"), make_model(hand_pieces()));
  write(dir.file("both/spiece.model"), make_model(hand_pieces()));
  nlohmann::json j = hand_tokenizer_json();
  j["model"]["vocab"][6][1] = -3.0;  // ▁a
  j["model"]["vocab"][7][1] = -0.5;  // ab
  write(dir.file("both/tokenizer.json"), j.dump());
  const auto both = T5Tokenizer::load(dir.file("both"));
  CHECK(both.source() == dir.file("both") + "/tokenizer.json");
  // "▁ab": ▁ + ab (-2.5) beats ▁a + b (-4), ▁ab (-4) and ▁ + a + b (-4) in tokenizer.json's scores;
  // spiece.model's make it ▁a + b (-2.5, the hand-worked case above).
  CHECK(both.encode("ab") == Ids{3, 7});
  CHECK(T5Tokenizer::load(dir.file("spm")).encode("ab") == Ids{6, 5});
  CHECK(T5Tokenizer::load(dir.file("spm")).source() == dir.file("spm") + "/spiece.model");
  // transformers never opens spiece.model beside tokenizer.json: neither does dlo.
  write(dir.file("both/spiece.model"), "not a model");
  CHECK(T5Tokenizer::load(dir.file("both")).encode("ab") == Ids{3, 7});
}

// V4: a corrupt tokenizer.json beside a valid spiece.model was never read (WanPipeline cannot
// load such a folder); now it is read, and refused by name.
TEST_CASE("a corrupt tokenizer.json beside a valid spiece.model is refused naming tokenizer.json") {
  TempDir dir;
  const std::string d = dir.file("m");
  std::filesystem::create_directories(d);
  write(d + "/spiece.model", make_model(hand_pieces()));
  const std::string text = hand_tokenizer_json().dump();
  write(d + "/tokenizer.json", text.substr(0, text.size() / 2));
  CHECK(contains(load_error(d), d + "/tokenizer.json: not valid JSON"));
  write(d + "/tokenizer.json", "");
  CHECK(contains(load_error(d), d + "/tokenizer.json: not valid JSON"));
  nlohmann::json bpe = hand_tokenizer_json();
  bpe["model"]["type"] = "BPE";
  write(d + "/tokenizer.json", bpe.dump());
  CHECK(contains(load_error(d), d + "/tokenizer.json: field 'model.type' is 'BPE'"));
  // Not a regular file (transformers would fall back to spiece.model there): refused by name.
  std::filesystem::remove(d + "/tokenizer.json");
  std::filesystem::create_directories(d + "/tokenizer.json");
  CHECK(contains(load_error(d), "tokenizer.json"));
  std::filesystem::remove(d + "/tokenizer.json");
  std::filesystem::create_symlink(d + "/gone.json", d + "/tokenizer.json");
  CHECK(contains(load_error(d), "tokenizer.json"));
  std::filesystem::remove(d + "/tokenizer.json");
  CHECK(T5Tokenizer::load(d).encode("ab") == Ids{6, 5});  // spiece.model alone
}

// V3: ids beyond the text encoder's embedding were found per job, at encoding (exit 3).
TEST_CASE("a tokenizer with ids at or beyond the text encoder's vocab_size is refused naming the file and the id") {
  TempDir dir;
  write(dir.file("tokenizer.json"), hand_tokenizer_json().dump());  // 14 ids: 0..13
  const auto t = T5Tokenizer::load(dir.path().string());
  t.check_fits_encoder(14);
  t.check_fits_encoder(256384);
  CHECK_THROWS_AS(t.check_fits_encoder(13), Error);  // id 13 has no row
  std::string e;
  try {
    t.check_fits_encoder(12);
  } catch (const Error& x) {
    e = x.what();
    CHECK(x.kind() == ErrorKind::kInput);
  }
  CHECK(e == dir.file("tokenizer.json") + ": token ids reach 13, beyond the text encoder's vocab_size 12 "
             "(text_encoder/config.json): id 12 ('<extra_id_1>') and above have no embedding row, and a prompt "
             "holding one could not be encoded (the tokenizer does not belong to this text encoder)");
}

// Item 8 of issue 46: a changed unknown-piece penalty went unseen, because every tested
// vocabulary held each character of a piece as a piece of its own. A user's tokenizer.json need
// not: tests/data/goldens/tokenizer_unknown_pieces.json holds one such vocabulary as transformers
// saves it, and the ids AutoTokenizer gives (tools/reference/make_tokenizer_goldens.py).
TEST_CASE("pieces holding characters that are not pieces: transformers' ids (the unknown piece's score decides)") {
  std::ifstream in(dlo::test::source_dir() + "/tests/data/goldens/tokenizer_unknown_pieces.json");
  REQUIRE(in.good());
  const nlohmann::json golden = nlohmann::json::parse(in);
  TempDir dir;
  write(dir.file("tokenizer.json"), golden.at("tokenizer_json").dump());
  write(dir.file("tokenizer_config.json"), golden.at("tokenizer_config").dump());
  const auto t = T5Tokenizer::load(dir.path().string());
  CHECK(t.token_to_id("\xC3\xA9") == -1);  // é is no piece, "éc" and "ée" are
  CHECK(t.token_to_id("\xC3\xA9" "c") >= 0);
  std::size_t n = 0, unk = 0;
  for (const auto& c : golden.at("cases")) {
    const std::string text = c.at("text").get<std::string>();
    const Ids want = c.at("ids").get<Ids>();
    CHECK_MESSAGE(t.encode(text) == want, "text '" << text << "'");
    ++n;
    unk += static_cast<std::size_t>(std::count(want.begin(), want.end(), 2));
  }
  CHECK(n >= 300);
  CHECK(unk >= 100);
}

TEST_CASE("tokenizer.json of another shape is refused naming the field") {
  TempDir dir;
  int n = 0;
  auto error_with = [&](const std::function<void(nlohmann::json&)>& edit) {
    const std::string d = dir.file("t" + std::to_string(n++));
    nlohmann::json j = hand_tokenizer_json();
    edit(j);
    std::filesystem::create_directories(d);
    write(d + "/tokenizer.json", j.dump());
    return load_error(d);
  };
  CHECK(contains(error_with([](auto& j) { j["model"]["type"] = "BPE"; }), "field 'model.type' is 'BPE'"));
  CHECK(contains(error_with([](auto& j) { j["model"]["byte_fallback"] = true; }), "field 'model.byte_fallback'"));
  CHECK(contains(error_with([](auto& j) { j["model"]["unk_id"] = 0; }), "field 'model.unk_id' must be 2"));
  CHECK(contains(error_with([](auto& j) { j["model"]["vocab"][3] = "x"; }), "field 'model.vocab[3]'"));
  CHECK(contains(error_with([](auto& j) { j["normalizer"] = {{"type", "NFKC"}}; }), "normaliser 'NFKC'"));
  CHECK(contains(error_with([](auto& j) { j["normalizer"] = {{"type", "Precompiled"}, {"precompiled_charsmap", "%%%%"}}; }),
                 "field 'precompiled_charsmap': not base64"));
  CHECK(contains(error_with([](auto& j) { j["pre_tokenizer"]["pretokenizers"][1]["prepend_scheme"] = "first"; }),
                 "field 'pre_tokenizer' is not T5's"));
  CHECK(contains(error_with([](auto& j) { j["post_processor"]["single"].erase(1); }), "field 'post_processor'"));
  CHECK(contains(error_with([](auto& j) { j["added_tokens"][0]["lstrip"] = true; }),
                 "field 'added_tokens[0]': '<pad>' has lstrip = true"));
  CHECK(contains(error_with([](auto& j) { j["added_tokens"][1]["id"] = 7; }), "is not that entry of model.vocab"));
  CHECK(contains(error_with([](auto& j) { j.erase("pre_tokenizer"); }), "no field 'pre_tokenizer'"));
  const std::string d = dir.file("not_json");
  std::filesystem::create_directories(d);
  write(d + "/tokenizer.json", "{ nope");
  CHECK(contains(load_error(d), "tokenizer.json: not valid JSON"));
}

TEST_CASE("tokenizer folder errors name the folder and say what is supported") {
  TempDir dir;
  CHECK(contains(load_error(dir.file("absent")), "loading tokenizer '" + dir.file("absent") + "': not a directory"));

  std::filesystem::create_directories(dir.file("empty"));
  const std::string empty = load_error(dir.file("empty"));
  CHECK(empty.find("loading tokenizer '" + dir.file("empty") + "'") == 0);
  CHECK(contains(empty, "no tokenizer.json and no spiece.model"));

  std::filesystem::create_directories(dir.file("json_only"));
  write(dir.file("json_only/tokenizer.json"), "{}");
  const std::string json_only = load_error(dir.file("json_only"));
  CHECK(json_only.find("loading tokenizer '" + dir.file("json_only") + "'") == 0);
  CHECK(contains(json_only, "tokenizer.json: no field 'model'"));

  std::filesystem::create_directories(dir.file("garbage"));
  write(dir.file("garbage/spiece.model"), "this is not a model");
  CHECK(contains(load_error(dir.file("garbage")), "spiece.model: not a SentencePiece model: unsupported protobuf wire type"));
  write(dir.file("garbage/spiece.model"), make_model(hand_pieces()).substr(0, 40));
  CHECK(contains(load_error(dir.file("garbage")), "spiece.model: not a SentencePiece model: truncated protobuf"));

  // What SentencePiece itself refuses (the library is not linked; text/tokenizer.cpp, check_spm).
  const auto refused = [&](const std::string& name, std::vector<Piece> pieces, bool byte_fallback = false) {
    std::filesystem::create_directories(dir.file(name));
    write(dir.file(name + "/spiece.model"), make_model(pieces, byte_fallback));
    return load_error(dir.file(name));
  };
  auto twice = hand_pieces();
  twice[9].text = "a";  // "x" becomes a second "a"
  CHECK(contains(refused("twice", twice), "spiece.model: piece 'a' appears twice (ids 4 and 9)"));
  auto no_unk = hand_pieces();
  no_unk[2].type = 3;
  CHECK(contains(refused("no_unk", no_unk), "spiece.model: 0 unknown pieces (type 2); a SentencePiece model has exactly one"));
  auto two_unk = hand_pieces();
  two_unk[10].type = 2;
  CHECK(contains(refused("two_unk", two_unk), "spiece.model: 2 unknown pieces"));
  auto empty_piece = hand_pieces();
  empty_piece[5].text = "";
  CHECK(contains(refused("empty_piece", empty_piece), "spiece.model: piece 5 is empty"));
  auto bad_type = hand_pieces();
  bad_type[6].type = 9;
  CHECK(contains(refused("bad_type", bad_type), "has type 9, not one of SentencePiece's 1-6"));
  CHECK(contains(refused("no_pieces", {}), "spiece.model: no pieces"));
  // Byte pieces: only with byte_fallback, named <0x00>..<0xFF>, all 256 of them (Python
  // sentencepiece: "byte piece <0x41> is found although `byte_fallback` is false", "byte piece zz
  // is invalid", "there are not 256 byte pieces although `byte_fallback` is true").
  auto with_bytes = hand_pieces();
  for (int b = 0; b < 256; ++b) {
    char name[8];
    std::snprintf(name, sizeof name, "<0x%02X>", b);
    with_bytes.push_back({name, 0, 6});
  }
  CHECK(contains(refused("bytes_no_fallback", with_bytes),
                 "spiece.model: piece 12 ('<0x00>') is a byte piece (type 6), but the model's byte_fallback is off"));
  auto short_bytes = with_bytes;
  short_bytes.pop_back();
  CHECK(contains(refused("bytes_255", short_bytes, true),
                 "spiece.model: 255 byte pieces (type 6); a model with byte_fallback has one for each of the 256 bytes"));
  auto bad_name = with_bytes;
  bad_name.back().text = "<0xfF>";
  CHECK(contains(refused("bytes_named", bad_name, true), "spiece.model: byte piece 267 is named '<0xfF>', not <0x00> .. <0xFF>"));
  std::filesystem::create_directories(dir.file("bytes_ok"));
  write(dir.file("bytes_ok/spiece.model"), make_model(with_bytes, true));
  CHECK(T5Tokenizer::load(dir.file("bytes_ok")).token_to_id("<0xFF>") == 267);

  std::filesystem::create_directories(dir.file("not_t5"));
  auto pieces = hand_pieces();
  std::swap(pieces[0], pieces[2]);  // <unk> first: a SentencePiece default layout, not T5's
  write(dir.file("not_t5/spiece.model"), make_model(pieces));
  CHECK(contains(load_error(dir.file("not_t5")), "not a T5 vocabulary: expected <pad> = 0, </s> = 1, <unk> = 2"));

  std::filesystem::create_directories(dir.file("bad_config"));
  write(dir.file("bad_config/spiece.model"), make_model(hand_pieces()));
  write(dir.file("bad_config/tokenizer_config.json"), R"({"extra_ids": "many"})");
  CHECK(contains(load_error(dir.file("bad_config")),
                 dir.file("bad_config/tokenizer_config.json") + ": field 'extra_ids' must be a non-negative integer"));
}

TEST_CASE("the tiny tokenizer: trained here, deterministic, T5 layout, NFKC normalisation") {
  TempDir dir;
  write_tiny_tokenizer(dir.file("a"));
  write_tiny_tokenizer(dir.file("b"));
  auto slurp = [](const std::string& p) {
    std::ifstream in(p, std::ios::binary);
    std::ostringstream ss;
    ss << in.rdbuf();
    return ss.str();
  };
  CHECK(slurp(dir.file("a/spiece.model")) == slurp(dir.file("b/spiece.model")));
  CHECK(contains(slurp(dir.file("a/tokenizer_config.json")), "\"tokenizer_class\": \"T5Tokenizer\""));
  CHECK(contains(slurp(dir.file("a/tokenizer_config.json")), "\"extra_ids\": 100"));
  CHECK(contains(slurp(dir.file("a/special_tokens_map.json")), "<extra_id_99>"));

  const auto t = T5Tokenizer::load(dir.file("a"));
  CHECK(t.vocab_size() == kTinyTokenizerPieces + kTinyTokenizerExtraIds);
  CHECK(t.token_to_id("<pad>") == 0);
  CHECK(t.token_to_id("</s>") == 1);
  CHECK(t.token_to_id("<unk>") == 2);
  CHECK(t.token_to_id("<extra_id_0>") == t.vocab_size() - 1);
  // character_coverage 1: the training text has no unknown characters.
  const Ids all = t.encode(tiny_tokenizer_corpus());
  CHECK(all.size() > 1000);
  CHECK(std::count(all.begin(), all.end(), 2) == 0);
  // nmt_nfkc: compatibility forms normalise to their plain equivalents.
  CHECK(t.encode("\xEF\xAC\x81") == t.encode("fi"));       // U+FB01 ligature
  CHECK(t.encode("\xEF\xBC\xA1") == t.encode("A"));        // U+FF21 full-width A
  CHECK(t.encode("\xE2\x91\xA0") == t.encode("1"));        // U+2460 circled one
  CHECK(t.encode("e\xCC\x81") == t.encode("\xC3\xA9"));    // e + combining acute = é
  // transformers applies the charsmap per grapheme cluster: the first rule matching a prefix of
  // "Ａ + combining acute" (full-width A -> A) replaces the whole cluster, dropping the accent.
  CHECK(t.encode("\xEF\xBC\xA1\xCC\x81") == t.encode("A"));
}
