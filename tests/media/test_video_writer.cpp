// dlo/media/video_writer.h: MP4 (H.264), MKV (FFV1) and PNG folders, checked with the ffprobe and
// ffmpeg binaries (Debian's ffmpeg package) as the independent reader, and with read_video.
#include <doctest/doctest.h>
#include <sys/resource.h>
#include <sys/stat.h>

#include <algorithm>
#include <cmath>
#include <csignal>
#include <cstdio>
#include <filesystem>
#include <functional>
#include <nlohmann/json.hpp>
#include <random>
#include <string>
#include <vector>

#include "common/test_util.h"
#include "dlo/common/error.h"
#include "dlo/common/file.h"
#include "dlo/media/video_writer.h"

using namespace dlo;
using dlo::test::TempDir;

namespace {

using dlo::test::error_of;

// Frames with moving gradients and noise: [n][h][w][3]. `noise` is the amplitude (+-).
std::vector<std::uint8_t> make_frames(int w, int h, int n, int noise, unsigned seed = 7) {
  std::mt19937 rng(seed);
  std::uniform_int_distribution<int> d(-noise, noise);
  std::vector<std::uint8_t> v(static_cast<std::size_t>(w) * h * 3 * n);
  std::size_t i = 0;
  for (int t = 0; t < n; ++t)
    for (int y = 0; y < h; ++y)
      for (int x = 0; x < w; ++x) {
        const int base[3] = {x * 200 / w + 4 * t + 20, y * 180 / h + 30, (x + y) * 100 / (w + h) + 8 * t + 40};
        for (int c = 0; c < 3; ++c) v[i++] = static_cast<std::uint8_t>(std::clamp(base[c] + d(rng), 0, 255));
      }
  return v;
}

void write_video(const std::string& path, int w, int h, int n, const std::vector<std::uint8_t>& rgb,
                 const VideoOptions& o) {
  VideoWriter vw(path, w, h, o);
  const std::size_t frame = static_cast<std::size_t>(w) * h * 3;
  for (int t = 0; t < n; ++t) vw.add_frame(rgb.data() + frame * t);
  CHECK(vw.frames() == n);
  vw.finish();
}

// stdout of a shell command; `rc` its exit status.
std::string run(const std::string& cmd, int* rc = nullptr) {
  FILE* p = ::popen(cmd.c_str(), "r");
  REQUIRE(p != nullptr);
  std::string out;
  char buf[1 << 16];
  std::size_t n;
  while ((n = std::fread(buf, 1, sizeof buf, p)) > 0) out.append(buf, n);
  const int status = ::pclose(p);
  if (rc) *rc = status;
  else REQUIRE_MESSAGE(status == 0, cmd);
  return out;
}

nlohmann::json ffprobe(const std::string& path) {
  const std::string cmd = std::string(DLO_TEST_FFPROBE) +
                          " -v error -count_frames -select_streams v:0 -show_entries "
                          "stream=codec_name,pix_fmt,width,height,nb_read_frames,r_frame_rate,avg_frame_rate,"
                          "color_space,color_range:format=format_name:format_tags -of json '" +
                          path + "'";
  return nlohmann::json::parse(run(cmd));
}

// The frames as ffmpeg decodes them to rgb24 (the independent decoder).
std::string ffmpeg_rgb(const std::string& input) {
  return run(std::string(DLO_TEST_FFMPEG) + " -v error -nostdin -i '" + input + "' -f rawvideo -pix_fmt rgb24 -");
}

double psnr(const std::vector<std::uint8_t>& a, const std::vector<std::uint8_t>& b) {
  REQUIRE(a.size() == b.size());
  double se = 0;
  for (std::size_t i = 0; i < a.size(); ++i) se += (double(a[i]) - b[i]) * (double(a[i]) - b[i]);
  const double mse = se / a.size();
  return mse == 0 ? INFINITY : 10 * std::log10(255.0 * 255.0 / mse);
}

std::vector<std::string> entries(const std::filesystem::path& dir) {
  std::vector<std::string> v;
  for (const auto& e : std::filesystem::directory_iterator(dir)) v.push_back(e.path().filename().string());
  std::sort(v.begin(), v.end());
  return v;
}

std::string tag(const std::vector<std::pair<std::string, std::string>>& tags, const std::string& key) {
  for (const auto& [k, v] : tags)
    if (k == key) return v;
  return "(missing)";
}

// Metadata as the pipeline writes it: a human line and a JSON object with a long prompt.
std::vector<std::pair<std::string, std::string>> sample_tags() {
  std::string prompt = "A fox runs through snow, \"quoted\", naïve café, 狐狸 — ";
  while (prompt.size() < 1500) prompt += "more words ";
  nlohmann::json j = {{"prompt", prompt}, {"seed", 42}, {"steps", 50}, {"guidance", 5.0}};
  return {{"comment", "dlo-generate: seed 42, 50 steps, guidance 5, prompt: " + prompt}, {"description", j.dump()}};
}

constexpr int kW = 64, kH = 48, kN = 17;

}  // namespace

TEST_CASE("format names and extensions parse back") {
  for (VideoFormat f : {VideoFormat::kMp4, VideoFormat::kPng, VideoFormat::kFfv1})
    CHECK(parse_video_format(video_format_name(f)) == f);
  CHECK(std::string(video_format_extension(VideoFormat::kMp4)) == ".mp4");
  CHECK(std::string(video_format_extension(VideoFormat::kPng)) == "");
  CHECK(std::string(video_format_extension(VideoFormat::kFfv1)) == ".mkv");
  CHECK(error_of([] { parse_video_format("avi"); }) == "unknown video format 'avi' (mp4, png, ffv1)");
}

TEST_CASE("mp4: ffprobe sees h264 yuv420p with the size and every frame and the rate and the tags and the decoded PSNR is high") {
  TempDir dir;
  const std::string path = dir.file("fox.mp4");
  const auto rgb = make_frames(kW, kH, kN, 3);
  VideoOptions o;
  o.crf = 18;
  o.tags = sample_tags();
  write_video(path, kW, kH, kN, rgb, o);
  CHECK(entries(dir.path()) == std::vector<std::string>{"fox.mp4"});  // no temporary left

  const auto j = ffprobe(path);
  CAPTURE(j.dump());
  const auto& s = j["streams"][0];
  CHECK(s["codec_name"] == "h264");
  CHECK(s["pix_fmt"] == "yuv420p");
  CHECK(s["width"] == kW);
  CHECK(s["height"] == kH);
  CHECK(s["nb_read_frames"] == std::to_string(kN));
  CHECK(s["r_frame_rate"] == "16/1");
  CHECK(s["avg_frame_rate"] == "16/1");
  CHECK(s["color_space"] == "smpte170m");
  CHECK(s["color_range"] == "tv");
  CHECK(j["format"]["tags"]["comment"] == o.tags[0].second);
  CHECK(j["format"]["tags"]["description"] == o.tags[1].second);
  CHECK(nlohmann::json::parse(j["format"]["tags"]["description"].get<std::string>())["seed"] == 42);

  const DecodedVideo v = read_video(path);
  CHECK(v.width == kW);
  CHECK(v.height == kH);
  CHECK(v.frames == kN);
  CHECK(v.fps == 16.0);
  CHECK(tag(v.tags, "comment") == o.tags[0].second);
  CHECK(tag(v.tags, "description") == o.tags[1].second);
  const double ours = psnr(rgb, v.rgb);
  MESSAGE("mp4 crf 18 64x48: PSNR " << ours << " dB");
  CHECK(ours > 35.0);
  // ffmpeg's own decode and conversion agrees within the same bound.
  const std::string theirs = ffmpeg_rgb(path);
  REQUIRE(theirs.size() == rgb.size());
  CHECK(psnr(rgb, std::vector<std::uint8_t>(theirs.begin(), theirs.end())) > 35.0);
}

TEST_CASE("mp4: the same frames as the ffmpeg CLI encodes from the same RGB (libx264 crf 25 medium yuv420p)") {
  // diffusers' export_to_video runs ffmpeg (through imageio) with these settings: the H.264 stream
  // must decode to the same YUV frames, so the conversion (sws bicubic, BT.601 tv) and the
  // encoder settings are the ones users get from diffusers.
  TempDir dir;
  const auto rgb = make_frames(kW, kH, kN, 3);
  dlo::test::write_file(dir.file("frames.rgb"), std::string(rgb.begin(), rgb.end()));
  run(std::string(DLO_TEST_FFMPEG) + " -v error -nostdin -f rawvideo -pix_fmt rgb24 -s " + std::to_string(kW) + "x" +
      std::to_string(kH) + " -r 16 -i '" + dir.file("frames.rgb") +
      "' -c:v libx264 -crf 25 -preset medium -pix_fmt yuv420p '" + dir.file("cli.mp4") + "'");
  write_video(dir.file("ours.mp4"), kW, kH, kN, rgb, VideoOptions{});
  auto yuv = [&](const std::string& f) {
    return run(std::string(DLO_TEST_FFMPEG) + " -v error -nostdin -i '" + f + "' -f rawvideo -pix_fmt yuv420p -");
  };
  const std::string theirs = yuv(dir.file("cli.mp4")), ours = yuv(dir.file("ours.mp4"));
  CHECK(theirs.size() == std::size_t(kW) * kH * 3 / 2 * kN);
  CHECK(ours == theirs);
}

TEST_CASE("mp4: every tag name it accepts shows in ffprobe and others are refused") {
  TempDir dir;
  const auto rgb = make_frames(kW, kH, 1, 3);
  VideoOptions o;
  const std::vector<std::string> names = {"title", "artist",    "album",    "date",     "comment",  "description",
                                          "genre", "copyright", "composer", "synopsis", "grouping", "lyrics"};
  for (const auto& n : names) o.tags.emplace_back(n, "value of " + n);
  write_video(dir.file("t.mp4"), kW, kH, 1, rgb, o);
  const auto tags = ffprobe(dir.file("t.mp4"))["format"]["tags"];
  for (const auto& n : names) {
    CAPTURE(n);
    CHECK(tags[n] == "value of " + n);
  }
  o.tags = {{"seed", "42"}};
  CHECK(error_of([&] { check_video_output(dir.file("u.mp4"), o); }) ==
        "metadata tag 'seed' is not one an MP4 keeps (title, artist, album, date, comment, description, genre, "
        "copyright, composer, synopsis, grouping, lyrics)");
  // Matroska and PNG keep any name.
  o.format = VideoFormat::kFfv1;
  write_video(dir.file("t.mkv"), kW, kH, 1, rgb, o);
  CHECK(ffprobe(dir.file("t.mkv"))["format"]["tags"]["SEED"] == "42");
  CHECK(tag(read_video(dir.file("t.mkv")).tags, "seed") == "42");
}

TEST_CASE("late tags: finish()'s tags replace or join the others in an MP4 and a PNG folder, an MKV keeps its header's") {
  // What recovery reads a job's frames hash from (probe V6): known only once every frame is in.
  TempDir dir;
  const auto rgb = make_frames(kW, kH, 2, 5);
  const std::vector<std::pair<std::string, std::string>> late = {{"description", "with the hash"}, {"synopsis", "new"}};
  for (const VideoFormat f : {VideoFormat::kMp4, VideoFormat::kPng, VideoFormat::kFfv1}) {
    CAPTURE(std::string(video_format_name(f)));
    VideoOptions o;
    o.format = f;
    o.tags = {{"comment", "kept"}, {"description", "at the start"}};
    const std::string path = dir.file(std::string("late") + video_format_extension(f));
    VideoWriter vw(path, kW, kH, o);
    for (int t = 0; t < 2; ++t) vw.add_frame(rgb.data() + static_cast<std::size_t>(t) * kW * kH * 3);
    vw.finish(late);
    const auto tags = read_video(path).tags;
    CHECK(tag(tags, "comment") == "kept");
    CHECK(tag(tags, "description") == std::string(f == VideoFormat::kFfv1 ? "at the start" : "with the hash"));
    CHECK(tag(tags, "synopsis") == std::string(f == VideoFormat::kFfv1 ? "(missing)" : "new"));
  }
  // Late tags are checked as the others: an MP4 refuses a name it would drop, and the file is not written.
  VideoOptions o;
  o.tags = {{"comment", "kept"}};
  {
    VideoWriter vw(dir.file("bad.mp4"), kW, kH, o);
    vw.add_frame(rgb.data());
    CHECK(error_of([&] { vw.finish({{"seed", "1"}}); }) ==
          "'" + dir.file("bad.mp4") + "': metadata tag 'seed' is not one an MP4 keeps (title, artist, album, date, "
          "comment, description, genre, copyright, composer, synopsis, grouping, lyrics)");
  }
  CHECK(::access(dir.file("bad.mp4").c_str(), F_OK) != 0);
}

TEST_CASE("mp4: fps and crf and preset reach the stream and the index comes first") {
  TempDir dir;
  const auto rgb = make_frames(kW, kH, 5, 3);
  VideoOptions o;
  o.fps = 24;
  o.crf = 40;
  o.preset = "ultrafast";
  write_video(dir.file("a.mp4"), kW, kH, 5, rgb, o);
  const auto j = ffprobe(dir.file("a.mp4"));
  CHECK(j["streams"][0]["r_frame_rate"] == "24/1");
  CHECK(j["streams"][0]["nb_read_frames"] == "5");
  // x264 records its settings in the stream (SEI): the preset's and the crf's traces.
  const std::string bytes = read_file(dir.file("a.mp4"));
  CHECK(bytes.find("moov") < bytes.find("mdat"));  // +faststart: the index first
  CHECK(bytes.find("crf=40.0") != std::string::npos);
  CHECK(bytes.find("subme=0") != std::string::npos);  // ultrafast; medium has subme=7
  CHECK(read_video(dir.file("a.mp4")).fps == 24.0);
}

TEST_CASE("ffv1: lossless and ffprobe sees ffv1 in matroska with every frame and the tags") {
  TempDir dir;
  const std::string path = dir.file("fox.mkv");
  const auto rgb = make_frames(kW, kH, kN, 40);
  VideoOptions o;
  o.format = VideoFormat::kFfv1;
  o.tags = sample_tags();
  write_video(path, kW, kH, kN, rgb, o);
  CHECK(entries(dir.path()) == std::vector<std::string>{"fox.mkv"});

  const auto j = ffprobe(path);
  CAPTURE(j.dump());
  const auto& s = j["streams"][0];
  CHECK(s["codec_name"] == "ffv1");
  CHECK(s["pix_fmt"] == "bgr0");  // FFV1 RGB: no YUV anywhere
  CHECK(s["width"] == kW);
  CHECK(s["height"] == kH);
  CHECK(s["nb_read_frames"] == std::to_string(kN));
  CHECK(s["r_frame_rate"] == "16/1");
  CHECK(j["format"]["format_name"].get<std::string>().find("matroska") == 0);
  // Every frame a keyframe (readable alone).
  CHECK(run(std::string(DLO_TEST_FFPROBE) + " -v error -select_streams v -show_entries frame=key_frame -of csv '" +
            path + "'") == [] {
    std::string s;
    for (int i = 0; i < kN; ++i) s += "frame,1\n";
    return s;
  }());
  // Matroska stores tag names upper-case.
  CHECK(j["format"]["tags"]["COMMENT"] == o.tags[0].second);
  CHECK(j["format"]["tags"]["DESCRIPTION"] == o.tags[1].second);

  const DecodedVideo v = read_video(path);
  CHECK(v.frames == kN);
  CHECK(v.fps == 16.0);
  CHECK(v.rgb == rgb);
  CHECK(tag(v.tags, "comment") == o.tags[0].second);
  CHECK(ffmpeg_rgb(path) == std::string(rgb.begin(), rgb.end()));
}

TEST_CASE("ffv1: odd sizes are fine (no chroma subsampling) and stay lossless") {
  TempDir dir;
  const auto rgb = make_frames(33, 17, 3, 100);
  VideoOptions o;
  o.format = VideoFormat::kFfv1;
  write_video(dir.file("odd.mkv"), 33, 17, 3, rgb, o);
  CHECK(read_video(dir.file("odd.mkv")).rgb == rgb);
  CHECK(ffmpeg_rgb(dir.file("odd.mkv")) == std::string(rgb.begin(), rgb.end()));
}

TEST_CASE("png: a folder of numbered rgb24 PNGs and metadata.json is lossless") {
  TempDir dir;
  const std::string path = dir.file("frames");
  const auto rgb = make_frames(kW, kH, kN, 40);
  VideoOptions o;
  o.format = VideoFormat::kPng;
  o.fps = 8;
  o.tags = sample_tags();
  write_video(path, kW, kH, kN, rgb, o);
  CHECK(entries(dir.path()) == std::vector<std::string>{"frames"});
  std::vector<std::string> expect;
  for (int i = 0; i < kN; ++i) {
    char b[32];
    std::snprintf(b, sizeof b, "frame_%05d.png", i);
    expect.push_back(b);
  }
  expect.push_back("metadata.json");
  CHECK(entries(path) == expect);

  const auto j = ffprobe(path + "/frame_00016.png");
  CHECK(j["streams"][0]["codec_name"] == "png");
  CHECK(j["streams"][0]["pix_fmt"] == "rgb24");
  CHECK(j["streams"][0]["width"] == kW);
  CHECK(j["streams"][0]["height"] == kH);
  const auto meta = nlohmann::json::parse(read_file(path + "/metadata.json"));
  CHECK(meta["frames"] == kN);
  CHECK(meta["fps"] == 8);
  CHECK(meta["tags"]["description"] == o.tags[1].second);

  const DecodedVideo v = read_video(path);
  CHECK(v.frames == kN);
  CHECK(v.width == kW);
  CHECK(v.height == kH);
  CHECK(v.fps == 8.0);
  CHECK(v.rgb == rgb);
  CHECK(tag(v.tags, "comment") == o.tags[0].second);
  CHECK(ffmpeg_rgb(path + "/frame_%05d.png") == std::string(rgb.begin(), rgb.end()));
}

TEST_CASE("an existing output is replaced only at finish() and a folder with other files is never replaced") {
  TempDir dir;
  const auto a = make_frames(kW, kH, 3, 40, 1), b = make_frames(kW, kH, 2, 40, 2);
  VideoOptions png;
  png.format = VideoFormat::kPng;
  const std::string folder = dir.file("frames");
  write_video(folder, kW, kH, 3, a, png);
  {
    VideoWriter vw(folder + "/", kW, kH, png);  // a trailing slash names the same folder
    vw.add_frame(b.data());
    vw.add_frame(b.data() + kW * kH * 3);
    CHECK(read_video(folder).rgb == a);  // the old one until finish()
    vw.finish();
  }
  CHECK(read_video(folder).rgb == b);
  CHECK(entries(folder).size() == 3);  // the third old frame is gone with the old folder
  CHECK(entries(dir.path()) == std::vector<std::string>{"frames"});

  VideoOptions ffv1;
  ffv1.format = VideoFormat::kFfv1;
  write_video(dir.file("v.mkv"), kW, kH, 3, a, ffv1);
  {
    VideoWriter vw(dir.file("v.mkv"), kW, kH, ffv1);
    vw.add_frame(b.data());
    CHECK(read_video(dir.file("v.mkv")).rgb == a);
  }  // no finish(): the old file stays, the temporary goes
  CHECK(read_video(dir.file("v.mkv")).rgb == a);
  CHECK(entries(dir.path()) == std::vector<std::string>{"frames", "v.mkv"});

  const std::string mine = dir.file("mine");
  std::filesystem::create_directory(mine);
  dlo::test::write_file(mine + "/notes.txt", "keep me");
  CHECK(error_of([&] { VideoWriter(mine, kW, kH, png); }) ==
        "'" + mine + "' is a folder that holds 'notes.txt', which is not a frame_NNNNN.png or metadata.json: it is not "
        "replaced");
  CHECK(read_file(mine + "/notes.txt") == "keep me");
}

TEST_CASE("a writer destroyed without finish() leaves nothing under the final name in any format") {
  const auto rgb = make_frames(kW, kH, 3, 3);
  for (VideoFormat f : {VideoFormat::kMp4, VideoFormat::kFfv1, VideoFormat::kPng}) {
    const std::string format = video_format_name(f);
    CAPTURE(format);
    TempDir dir;
    VideoOptions o;
    o.format = f;
    const std::string path = dir.file(std::string("out") + video_format_extension(f));
    try {
      VideoWriter vw(path, kW, kH, o);
      for (int t = 0; t < 3; ++t) vw.add_frame(rgb.data() + t * kW * kH * 3);
      CHECK(entries(dir.path()).size() == 1);  // the temporary
      CHECK(entries(dir.path())[0].rfind(".out", 0) == 0);
      throw std::runtime_error("the job failed mid-write");
    } catch (const std::runtime_error&) {
    }
    CHECK(entries(dir.path()).empty());
    // finish() with no frame is an error, and leaves nothing either.
    CHECK(error_of([&] { VideoWriter(path, kW, kH, o).finish(); }) == "'" + path + "': finish() with no frame added");
    CHECK(entries(dir.path()).empty());
  }
}

TEST_CASE("a write error (file size limit as on a full disk) is a dlo::Error and leaves nothing") {
  // RLIMIT_FSIZE makes write() fail with EFBIG past the limit, as ENOSPC would on a full disk.
  // The limit is per file: large noisy frames make one PNG (and the video files) larger than it.
  constexpr int w = 256, h = 192, n = 6;
  constexpr rlim_t limit = 60000;
  const auto rgb = make_frames(w, h, n, 120);
  for (VideoFormat f : {VideoFormat::kMp4, VideoFormat::kFfv1, VideoFormat::kPng}) {
    const std::string format = video_format_name(f);
    CAPTURE(format);
    TempDir dir;
    VideoOptions o;
    o.format = f;
    o.crf = 0;
    const std::string path = dir.file(std::string("out") + video_format_extension(f));
    // Without the limit the output is larger than the limit (else this test could not fail).
    write_video(path, w, h, n, rgb, o);
    const auto size = f == VideoFormat::kPng ? std::filesystem::file_size(path + "/frame_00000.png")
                                             : std::filesystem::file_size(path);
    REQUIRE(size > limit);
    std::filesystem::remove_all(path);

    rlimit old{};
    REQUIRE(::getrlimit(RLIMIT_FSIZE, &old) == 0);
    const auto old_handler = std::signal(SIGXFSZ, SIG_IGN);
    rlimit lim = old;
    lim.rlim_cur = limit;
    REQUIRE(::setrlimit(RLIMIT_FSIZE, &lim) == 0);
    std::string msg;
    try {
      VideoWriter vw(path, w, h, o);
      for (int t = 0; t < n; ++t) vw.add_frame(rgb.data() + static_cast<std::size_t>(t) * w * h * 3);
      vw.finish();
    } catch (const Error& e) {
      msg = e.what();
    }
    ::setrlimit(RLIMIT_FSIZE, &old);
    std::signal(SIGXFSZ, old_handler);
    MESSAGE(msg);
    CHECK(msg.find("File too large") != std::string::npos);
    CHECK(msg.find(path) != std::string::npos);
    CHECK(entries(dir.path()).empty());
  }
}

TEST_CASE("check_video_output: exact messages and nothing is created") {
  TempDir dir;
  const std::string d = dir.path().string();
  VideoOptions ok;
  CHECK_NOTHROW(check_video_output(d + "/a.mp4", 832, 480, ok));
  CHECK(error_of([&] { check_video_output(d + "/nope/a.mp4", ok); }) ==
        "the folder '" + d + "/nope' of '" + d + "/nope/a.mp4' does not exist");
  CHECK(error_of([&] { check_video_output("/dev/null", ok); }) ==
        "'/dev/null' is a character device: outputs are written only to regular files");
  CHECK(error_of([&] { check_video_output(d, ok); }) ==
        "'" + d + "' is a directory: outputs are written only to regular files");
  auto with = [&](auto change) {
    VideoOptions o;
    change(o);
    return error_of([&] { check_video_output(d + "/a.mp4", 64, 48, o); });
  };
  CHECK(with([](VideoOptions& o) { o.crf = 52; }) == "crf 52 is outside 0..51");
  CHECK(with([](VideoOptions& o) { o.crf = -1; }) == "crf -1 is outside 0..51");
  CHECK(with([](VideoOptions& o) { o.fps = 0; }) == "fps 0 is outside 1..240");
  CHECK(with([](VideoOptions& o) { o.fps = 241; }) == "fps 241 is outside 1..240");
  CHECK(with([](VideoOptions& o) { o.preset = "fastest"; }) ==
        "preset 'fastest' is not a libx264 preset (ultrafast, superfast, veryfast, faster, fast, medium, slow, slower, "
        "veryslow, placebo)");
  CHECK(with([](VideoOptions& o) { o.tags = {{"", "x"}}; }) == "a metadata tag has an empty name");
  CHECK(error_of([&] { check_video_output(d + "/a.mp4", 65, 48, ok); }) ==
        "the frame size 65x48 is odd: H.264 in yuv420p needs an even width and height");
  CHECK(error_of([&] { check_video_output(d + "/a.mp4", 0, 48, ok); }) == "the frame size 0x48 is outside 1..16384");
  // The constructor runs the same checks before creating anything.
  CHECK(error_of([&] { VideoWriter(d + "/a.mp4", 64, 47, ok); }) ==
        "the frame size 64x47 is odd: H.264 in yuv420p needs an even width and height");
  VideoOptions png;
  png.format = VideoFormat::kPng;
  CHECK_NOTHROW(check_video_output(d + "/frames", 65, 47, png));
  CHECK(error_of([&] { check_video_output(d + "/nope/frames", png); }) ==
        "the folder '" + d + "/nope' of '" + d + "/nope/frames' does not exist");
  CHECK(error_of([&] { check_video_output("/dev/null", png); }) ==
        "'/dev/null' is a character device: a PNG sequence is written as a folder of that name");
  CHECK(error_of([&] { check_video_output(d + "/..", png); }) ==
        "'" + d + "/..' does not name a folder for the PNG frames (give a new folder name, e.g. 'out/frames')");
  dlo::test::write_file(d + "/file", "x");
  CHECK(error_of([&] { check_video_output(d + "/file", png); }) ==
        "'" + d + "/file' is a regular file: a PNG sequence is written as a folder of that name");
  CHECK(entries(dir.path()) == std::vector<std::string>{"file"});
}

TEST_CASE("read_video: errors name the path") {
  TempDir dir;
  CHECK(error_of([&] { read_video(dir.file("missing.mp4")); }) ==
        "'" + dir.file("missing.mp4") + "': No such file or directory");
  dlo::test::write_file(dir.file("junk.mp4"), "not a video at all");
  CHECK(error_of([&] { read_video(dir.file("junk.mp4")); }).rfind("'" + dir.file("junk.mp4") + "': ", 0) == 0);
  CHECK(error_of([&] { read_video(dir.path().string()); }) ==
        "'" + dir.path().string() + "' holds no frame_00000.png");
}
