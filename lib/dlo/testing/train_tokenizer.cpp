// A tiny T5 tokenizer, trained here with SentencePiece, so random-weight models need no download.
#include <filesystem>
#include <fstream>
#include <string>
#include <unordered_map>
#include <vector>

#include <sentencepiece_trainer.h>
#include <nlohmann/json.hpp>

#include "dlo/common/error.h"
#include "dlo/common/file.h"
#include "dlo/testing/train_tokenizer.h"
#include "dlo/text/tokenizer.h"

namespace dlo {

namespace fs = std::filesystem;

namespace {

// Varied English prose in the style of video prompts, with punctuation, digits and some
// non-ASCII text (accents, typographic quotes and dashes, a few CJK characters and symbols).
constexpr const char* kCorpus = R"CORPUS(A red fox runs through a snowy forest at dawn, its breath rising in small white clouds.
Close-up of a hummingbird hovering beside a purple flower; the wings blur while the body stays perfectly still.
An astronaut floats inside the space station, turning slowly as a pen drifts past the window.
Two dogs play tug-of-war on a sunny beach. Waves crash behind them and seagulls call overhead!
The camera pans across a busy night market in Taipei: steam, neon signs, and people laughing.
A cat, sitting on a windowsill, watches raindrops race each other down the glass.
Time-lapse of clouds rolling over mountain peaks, shadows sweeping across green valleys below.
A chef flips a pancake high into the air and catches it — perfectly — in a cast-iron pan.
Slow motion: a drop of milk splashes into a cup of coffee, forming a tiny crown.
"Look at that!" shouts a child, pointing at a hot-air balloon drifting over the fields.
An old man reads a newspaper on a park bench while pigeons gather around his shoes.
Aerial view of a winding river cutting through autumn woods in orange, red and gold.
The city skyline at dusk; lights flicker on one by one as the sky fades from pink to deep blue.
A robot waters the plants in a greenhouse, moving carefully between rows of tomatoes.
Underwater shot of a sea turtle gliding past a coral reef full of bright, tiny fish.
A young woman dances in the rain under a streetlamp, her yellow umbrella spinning.
Fireworks burst over the harbor at midnight; their reflections shimmer on the dark water.
A vintage car drives along a coastal road — cliffs on one side, the ocean on the other.
Macro shot of a spider weaving its web at sunrise, dew drops glowing like pearls.
A panda eats bamboo in a quiet grove, chewing slowly and looking at the camera.
Children build a sandcastle with towers, walls and a moat; then the tide rolls in...
A train rushes through a tunnel and bursts into bright daylight among green hills.
Snow falls gently on a small village; smoke curls from chimneys and windows glow warm.
A skateboarder jumps over a bench, lands smoothly, and rolls away down the street.
Portrait of an elderly woman knitting a scarf by the fireplace, smiling softly.
Lightning splits the sky above a wheat field as a storm approaches from the west.
A barista pours latte art: a heart, then a leaf, then a swan with a long neck.
Horses gallop across an open plain, manes flying, dust rising behind their hooves.
A paper boat floats down a gutter stream after heavy rain in a quiet neighbourhood.
Neon-lit cyberpunk alley with holograms, wet pavement, and a lone figure in a long coat.
A jellyfish pulses through deep blue water, its tentacles trailing like silk ribbons.
The clock strikes twelve; an owl blinks twice and flies off into the moonlit night.
Café scene in Paris: a waiter carries croissants and espresso to a table by the window.
Naïve sketches come to life, leaping off the page of a child's notebook.
Über-realistic rendering of a mountain lake — crystal clear, mirror-smooth, at 5 a.m.
She said, “this is the best day ever,” and laughed while the confetti fell.
He whispered ‘goodbye’ and stepped onto the train; the doors closed behind him.
In Kyoto, a geisha walks past wooden houses; lanterns glow softly in the evening.
A sign reads “東京 → 大阪” above a busy platform as a bullet train arrives.
Temperature: 23°C; wind: 15 km/h; humidity: 60% — a perfect spring afternoon.
Price tag shows €12.50, £10 or $14 for a bouquet of tulips at the flower stall.
Résumé, façade, jalapeño and crème brûlée are words borrowed into English.
A mathematician writes x² + y² = r² on a blackboard, then draws a circle around it.
The score was 3–2 after extra time, and the crowd went wild (really wild)!
Is it a bird? Is it a plane? No — it is a kite shaped like a dragon.
Count down: 10, 9, 8, 7, 6, 5, 4, 3, 2, 1... lift-off! The rocket climbs into the sky.
Email the results to team@example.com or visit https://example.org/videos?id=42 today.
Steps: (1) boil water; (2) add pasta; (3) stir for 9 minutes; (4) drain & serve.
Hashtags like #sunset #travel and @mentions fill the screen of a scrolling phone.
A watercolor painting of a lighthouse slowly comes to life as waves start to move.
Cinematic, 4K, shallow depth of field, golden hour lighting, soft film grain.
Low-angle shot of a giant redwood tree; sunlight streams through the canopy.
The violinist closes her eyes and plays; the notes seem to float in the air.
A snail crawls across a leaf, leaving a silver trail that sparkles in the sun.
Bright, colorful, overexposed, static, blurry details, subtitles, style, artwork.
Worst quality, low quality, JPEG artifacts, ugly, incomplete, extra fingers, poorly drawn hands.
Fast-moving clouds, a rotating view of the Earth from orbit, city lights at night.
A small boat sails between icebergs under a pale sun in the Arctic sea.
Footprints in the sand lead toward the sea, where the last light of day fades away.
The baker pulls fresh bread from the oven; golden crust, soft inside, steam rising.
An origami crane unfolds itself and flies out of the open window into the garden.
Rain on a tin roof, a kettle whistling, and a dog asleep by the door — a cozy evening.
A busy intersection in New York: taxis honk, people cross, and a cyclist weaves through.
Zoom in on a butterfly's wing to reveal thousands of tiny, shimmering scales.
Twelve dancers move in unison across the stage, their red dresses swirling together.
Quietly, the fox returns to its den; the forest is silent except for the wind.
)CORPUS";

class LineIterator : public sentencepiece::SentenceIterator {
 public:
  explicit LineIterator(const std::string& text) {
    std::size_t start = 0;
    while (start < text.size()) {
      std::size_t nl = text.find('\n', start);
      if (nl == std::string::npos) nl = text.size();
      if (nl > start) lines_.push_back(text.substr(start, nl - start));
      start = nl + 1;
    }
  }
  bool done() const override { return i_ >= lines_.size(); }
  void Next() override { ++i_; }
  const std::string& value() const override { return lines_[i_]; }
  sentencepiece::util::Status status() const override { return {}; }

 private:
  std::vector<std::string> lines_;
  std::size_t i_ = 0;
};

// Whole or absent, every byte checked (dlo/common/file.h).

}  // namespace

const std::string& tiny_tokenizer_corpus() {
  static const std::string corpus = kCorpus;
  return corpus;
}

void write_tiny_tokenizer(const std::string& dir) {
  with_context(str("writing tokenizer '", dir, "'"), [&] {
    make_folders(dir);
    LineIterator lines(tiny_tokenizer_corpus());
    const std::unordered_map<std::string, std::string> args = {
        {"model_type", "unigram"},
        {"vocab_size", std::to_string(kTinyTokenizerPieces)},
        {"character_coverage", "1.0"},
        {"normalization_rule_name", "nmt_nfkc"},
        {"pad_id", "0"},
        {"eos_id", "1"},
        {"unk_id", "2"},
        {"bos_id", "-1"},
        {"num_threads", "1"},
        {"input_sentence_size", "0"},
        {"shuffle_input_sentence", "false"},
        {"minloglevel", "2"},
    };
    std::string model;
    const auto status = sentencepiece::SentencePieceTrainer::Train(args, &lines, &model);
    DLO_CHECK(status.ok(), "SentencePiece training failed: ", status.ToString());
    write_file_atomic((fs::path(dir) / "spiece.model").string(), model);

    // What transformers' T5Tokenizer(Fast) reads besides spiece.model (the transformers 4.x layout
    // of the Wan / umt5 repositories).
    nlohmann::ordered_json extra = nlohmann::ordered_json::array();
    for (std::int64_t i = 0; i < kTinyTokenizerExtraIds; ++i) extra.push_back("<extra_id_" + std::to_string(i) + ">");
    nlohmann::ordered_json config = {{"additional_special_tokens", extra},
                                     {"clean_up_tokenization_spaces", true},
                                     {"eos_token", "</s>"},
                                     {"extra_ids", kTinyTokenizerExtraIds},
                                     {"legacy", false},
                                     {"model_max_length", 512},
                                     {"pad_token", "<pad>"},
                                     {"sp_model_kwargs", nlohmann::ordered_json::object()},
                                     {"tokenizer_class", "T5Tokenizer"},
                                     {"unk_token", "<unk>"}};
    write_file_atomic((fs::path(dir) / "tokenizer_config.json").string(), config.dump(2) + "\n");
    nlohmann::ordered_json special = {
        {"additional_special_tokens", extra}, {"eos_token", "</s>"}, {"pad_token", "<pad>"}, {"unk_token", "<unk>"}};
    write_file_atomic((fs::path(dir) / "special_tokens_map.json").string(), special.dump(2) + "\n");
  });
}

}  // namespace dlo
