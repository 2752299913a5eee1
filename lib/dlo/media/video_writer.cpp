#include "dlo/media/video_writer.h"
#include "dlo/media/image_reader.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>
#if defined(__SSE__)
#include <xmmintrin.h>
#endif

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cstdarg>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <mutex>
#include <nlohmann/json.hpp>

#include "dlo/common/error.h"
#include "dlo/common/file.h"

extern "C" {
#include <libavcodec/avcodec.h>
#include <libavformat/avformat.h>
#include <libavutil/dict.h>
#include <libavutil/error.h>
#include <libavutil/frame.h>
#include <libavutil/log.h>
#include <libavutil/opt.h>
#include <libavutil/pixdesc.h>
#include <libswscale/swscale.h>
}

namespace dlo {
namespace {

// ---- libav plumbing: log capture, error text, RAII owners -------------------------------------

thread_local std::string t_last_av_error;

void log_callback(void* avcl, int level, const char* fmt, va_list vl) {
  if (level > AV_LOG_ERROR) return;
  char line[1024];
  int print_prefix = 1;
  av_log_format_line2(avcl, level, fmt, vl, line, sizeof line, &print_prefix);
  std::string s(line);
  while (!s.empty() && (s.back() == '\n' || s.back() == '\r')) s.pop_back();
  if (!s.empty()) t_last_av_error = s;
}

void init_libav() {
  static std::once_flag once;
  std::call_once(once, [] { av_log_set_callback(log_callback); });
  t_last_av_error.clear();
}

// The CPU features libx264 may use: what it would detect itself, less AVX-512. x264 0.164's
// AVX-512 macroblock-tree code (the rate control of every preset from "fast" on) reads memory it
// never wrote: the same frames gave different H.264 streams from run to run (MALLOC_PERTURB_, the
// number of ranks), decoding up to 82/255 apart at 480x832 (measured with the ffmpeg CLI as well;
// mbtree=0 or asm without AVX512 are stable). The AVX2 code is as fast at Wan's sizes, and
// encoding is a small part of a job. "" (x264's own detection) on other architectures.
std::string x264_cpu_flags() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_cpu_init();
  std::string f;
  auto add = [&](bool have, const char* name) {
    if (have) f += (f.empty() ? "" : ",") + std::string(name);
  };
  add(__builtin_cpu_supports("sse2"), "SSE2");
  add(__builtin_cpu_supports("sse3"), "SSE3");
  add(__builtin_cpu_supports("ssse3"), "SSSE3");
  add(__builtin_cpu_supports("sse4.1"), "SSE4.1");
  add(__builtin_cpu_supports("sse4.2"), "SSE4.2");
  add(__builtin_cpu_supports("avx"), "AVX");
  add(__builtin_cpu_supports("avx") && __builtin_cpu_supports("fma"), "FMA3");
  add(__builtin_cpu_supports("avx") && __builtin_cpu_supports("bmi"), "BMI1");
  add(__builtin_cpu_supports("avx") && __builtin_cpu_supports("bmi2"), "BMI2");
  add(__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma"), "AVX2");
  add(__builtin_cpu_supports("sse2") && __builtin_cpu_supports("abm"), "LZCNT");
  if (!f.empty()) f += ",Cache64";
  return f;
#else
  return "";
#endif
}

// "<av_strerror text>" and, if libav logged an error since, " (libav: <line>)".
std::string av_error(int err) {
  char buf[AV_ERROR_MAX_STRING_SIZE] = {0};
  av_strerror(err, buf, sizeof buf);
  std::string s(buf);
  if (!t_last_av_error.empty()) {
    s += " (libav: " + t_last_av_error + ")";
    t_last_av_error.clear();
  }
  return s;
}

struct CodecCtxFree {
  void operator()(AVCodecContext* c) const { avcodec_free_context(&c); }
};
struct FrameFree {
  void operator()(AVFrame* f) const { av_frame_free(&f); }
};
struct PacketFree {
  void operator()(AVPacket* p) const { av_packet_free(&p); }
};
struct SwsFree {
  void operator()(SwsContext* s) const { sws_freeContext(s); }
};
// An output context: its AVIOContext is closed (errors ignored: only on the failure path) first.
struct OutputFree {
  void operator()(AVFormatContext* f) const {
    if (f->pb) avio_closep(&f->pb);
    avformat_free_context(f);
  }
};
struct InputFree {
  void operator()(AVFormatContext* f) const { avformat_close_input(&f); }
};
struct DictFree {
  void operator()(AVDictionary* d) const { av_dict_free(&d); }
};
using CodecCtx = std::unique_ptr<AVCodecContext, CodecCtxFree>;
using FramePtr = std::unique_ptr<AVFrame, FrameFree>;
using PacketPtr = std::unique_ptr<AVPacket, PacketFree>;
using SwsPtr = std::unique_ptr<SwsContext, SwsFree>;
using OutputCtx = std::unique_ptr<AVFormatContext, OutputFree>;
using InputCtx = std::unique_ptr<AVFormatContext, InputFree>;

// ---- formats ----------------------------------------------------------------------------------

struct FormatSpec {
  const char* muxer;    // libavformat short name; nullptr for the PNG folder
  const char* encoder;  // libavcodec encoder name
  AVPixelFormat pix;    // what the encoder is fed
};

FormatSpec spec_of(VideoFormat f) {
  switch (f) {
    case VideoFormat::kMp4: return {"mp4", "libx264", AV_PIX_FMT_YUV420P};
    case VideoFormat::kFfv1: return {"matroska", "ffv1", AV_PIX_FMT_BGR0};
    case VideoFormat::kPng: return {nullptr, "png", AV_PIX_FMT_RGB24};
  }
  DLO_ASSERT(false, "bad VideoFormat");
}

// x264's preset names (x264.h, x264_preset_names): stable since 2010.
constexpr const char* kX264Presets[] = {"ultrafast", "superfast", "veryfast", "faster", "fast",
                                        "medium",    "slow",      "slower",   "veryslow", "placebo"};

// Tag names ffmpeg's mov muxer writes into an MP4 (movenc.c, mov_write_ilst_tag; without
// movflags=use_metadata_tags it drops any other name silently). Each one is written and read back
// by the tests.
constexpr const char* kMp4Tags[] = {"title", "artist",    "album",    "date",     "comment",  "description",
                                    "genre", "copyright", "composer", "synopsis", "grouping", "lyrics"};

constexpr int kMaxSide = 16384;

// ---- paths ------------------------------------------------------------------------------------

std::string strip_trailing_slashes(std::string p) {
  while (p.size() > 1 && p.back() == '/') p.pop_back();
  return p;
}

const char* kind_of(mode_t m) {
  if (S_ISREG(m)) return "a regular file";
  if (S_ISCHR(m)) return "a character device";
  if (S_ISBLK(m)) return "a block device";
  if (S_ISFIFO(m)) return "a FIFO";
  if (S_ISSOCK(m)) return "a socket";
  if (S_ISLNK(m)) return "a symbolic link";
  return "not a folder";
}

std::string frame_name(std::int64_t i) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "frame_%05lld.png", static_cast<long long>(i));
  return buf;
}

// A name a PNG folder of ours may hold: frame_<5 or more digits>.png, metadata.json.
bool is_png_folder_entry(const std::string& name) {
  if (name == "metadata.json") return true;
  if (name.size() < 15 || name.compare(0, 6, "frame_") != 0 || name.compare(name.size() - 4, 4, ".png") != 0)
    return false;
  return std::all_of(name.begin() + 6, name.end() - 4, [](char c) { return c >= '0' && c <= '9'; });
}

// The entries of a folder, without "." and "..". Throws dlo::Error.
std::vector<std::string> list_folder(const std::string& dir) {
  DIR* d = ::opendir(dir.c_str());
  DLO_CHECK(d != nullptr, "cannot open the folder '", dir, "': ", std::strerror(errno));
  std::vector<std::string> names;
  while (const dirent* e = ::readdir(d)) {
    const std::string n = e->d_name;
    if (n != "." && n != "..") names.push_back(n);
  }
  ::closedir(d);
  std::sort(names.begin(), names.end());
  return names;
}

// Removes a flat folder (files only) and its files, ignoring errors: for cleanup paths. (POSIX
// calls, not std::filesystem: see the note on libtorch's copy of it in the top CMakeLists.txt.)
void remove_flat_folder(const std::string& dir) {
  if (DIR* d = ::opendir(dir.c_str())) {
    while (const dirent* e = ::readdir(d)) {
      const std::string n = e->d_name;
      if (n != "." && n != "..") ::unlink((dir + "/" + n).c_str());
    }
    ::closedir(d);
  }
  ::rmdir(dir.c_str());
}

// The PNG folder rule of check_video_output. Returns the normalised path.
std::string check_png_folder(const std::string& path_in) {
  DLO_CHECK(!path_in.empty(), "an output path is empty");
  const std::string path = strip_trailing_slashes(path_in);
  const std::string base = path_name(path);
  DLO_CHECK(!base.empty() && base != "." && base != "..", "'", path_in,
            "' does not name a folder for the PNG frames (give a new folder name, e.g. 'out/frames')");
  const std::string parent = path_folder(path);
  struct stat st;
  DLO_CHECK(::stat(parent.c_str(), &st) == 0, "the folder '", parent, "' of '", path_in, "' does not exist");
  DLO_CHECK(S_ISDIR(st.st_mode), "'", parent, "' (the folder of '", path_in, "') is not a directory");
  DLO_CHECK(::access(parent.c_str(), W_OK | X_OK) == 0, "the folder '", parent, "' of '", path_in,
            "' is not writable: ", std::strerror(errno));
  if (::lstat(path.c_str(), &st) != 0) {
    DLO_CHECK(errno == ENOENT, "'", path_in, "': ", std::strerror(errno));
    return path;  // a new folder
  }
  DLO_CHECK(S_ISDIR(st.st_mode), "'", path_in, "' is ", kind_of(st.st_mode),
            ": a PNG sequence is written as a folder of that name");
  for (const std::string& n : list_folder(path))
    DLO_CHECK(is_png_folder_entry(n), "'", path_in, "' is a folder that holds '", n,
              "', which is not a frame_NNNNN.png or metadata.json: it is not replaced");
  DLO_CHECK(::access(path.c_str(), W_OK | X_OK) == 0, "the existing folder '", path_in, "' is not writable: ",
            std::strerror(errno));
  return path;
}

void check_options(const VideoOptions& o) {
  DLO_CHECK(o.fps >= 1 && o.fps <= 240, "fps ", o.fps, " is outside 1..240");
  DLO_CHECK(o.crf >= 0 && o.crf <= 51, "crf ", o.crf, " is outside 0..51");
  const bool known = std::any_of(std::begin(kX264Presets), std::end(kX264Presets),
                                 [&](const char* p) { return o.preset == p; });
  if (!known) {
    std::string all;
    for (const char* p : kX264Presets) all += std::string(all.empty() ? "" : ", ") + p;
    DLO_CHECK(false, "preset '", o.preset, "' is not a libx264 preset (", all, ")");
  }
  DLO_CHECK(o.threads >= 0 && o.threads <= 256, "threads ", o.threads, " is outside 0..256");
  for (const auto& [k, v] : o.tags) {
    DLO_CHECK(!k.empty(), "a metadata tag has an empty name");
    if (o.format == VideoFormat::kMp4 &&
        std::none_of(std::begin(kMp4Tags), std::end(kMp4Tags), [&](const char* t) { return k == t; })) {
      std::string all;
      for (const char* t : kMp4Tags) all += std::string(all.empty() ? "" : ", ") + t;
      DLO_CHECK(false, "metadata tag '", k, "' is not one an MP4 keeps (", all, ")");
    }
    DLO_CHECK(k.find('\0') == std::string::npos && v.find('\0') == std::string::npos, "metadata tag '",
              k.c_str(), "' holds a NUL byte");
  }
  const FormatSpec spec = spec_of(o.format);
  DLO_CHECK(avcodec_find_encoder_by_name(spec.encoder) != nullptr, "this libav has no '", spec.encoder,
            "' encoder, which the ", video_format_name(o.format), " format needs");
  DLO_CHECK(spec.muxer == nullptr || av_guess_format(spec.muxer, nullptr, nullptr) != nullptr, "this libav has no '",
            spec.muxer, "' muxer, which the ", video_format_name(o.format), " format needs");
}

// ---- frame conversion for the reader ------------------------------------------------------------

// Appends one decoded frame to `out` as RGB24.
void append_rgb(DecodedVideo& out, const AVFrame* f, SwsPtr& sws, const std::string& path) {
  if (out.frames == 0) {
    out.width = f->width;
    out.height = f->height;
  }
  DLO_CHECK(f->width == out.width && f->height == out.height, "'", path, "': frame ", out.frames, " is ", f->width,
            "x", f->height, ", frame 0 was ", out.width, "x", out.height);
  const int w = f->width, h = f->height;
  const std::size_t row = static_cast<std::size_t>(w) * 3;
  const std::size_t at = out.rgb.size();
  out.rgb.resize(at + row * static_cast<std::size_t>(h));
  std::uint8_t* dst = out.rgb.data() + at;
  if (f->format == AV_PIX_FMT_RGB24) {
    for (int y = 0; y < h; ++y) std::memcpy(dst + y * row, f->data[0] + y * f->linesize[0], row);
  } else if (f->format == AV_PIX_FMT_GBRP) {
    for (int y = 0; y < h; ++y) {
      const std::uint8_t* g = f->data[0] + y * f->linesize[0];
      const std::uint8_t* b = f->data[1] + y * f->linesize[1];
      const std::uint8_t* r = f->data[2] + y * f->linesize[2];
      std::uint8_t* d = dst + y * row;
      for (int x = 0; x < w; ++x) {
        d[3 * x] = r[x];
        d[3 * x + 1] = g[x];
        d[3 * x + 2] = b[x];
      }
    }
  } else if (f->format == AV_PIX_FMT_BGR0 || f->format == AV_PIX_FMT_BGRA) {
    for (int y = 0; y < h; ++y) {
      const std::uint8_t* s = f->data[0] + y * f->linesize[0];
      std::uint8_t* d = dst + y * row;
      for (int x = 0; x < w; ++x) {
        d[3 * x] = s[4 * x + 2];
        d[3 * x + 1] = s[4 * x + 1];
        d[3 * x + 2] = s[4 * x];
      }
    }
  } else {
    const auto fmt = static_cast<AVPixelFormat>(f->format);
    SwsContext* s = sws_getCachedContext(sws.release(), w, h, fmt, w, h, AV_PIX_FMT_RGB24,
                                         SWS_BICUBIC | SWS_ACCURATE_RND | SWS_FULL_CHR_H_INT, nullptr, nullptr,
                                         nullptr);
    sws.reset(s);
    DLO_CHECK(s != nullptr, "'", path, "': no conversion from ", av_get_pix_fmt_name(fmt), " to rgb24");
    const AVPixFmtDescriptor* desc = av_pix_fmt_desc_get(fmt);
    if (desc && !(desc->flags & AV_PIX_FMT_FLAG_RGB)) {
      // YUV: the stream's matrix and range (BT.601 when untagged, as libav does).
      int cs = SWS_CS_DEFAULT;
      switch (f->colorspace) {
        case AVCOL_SPC_BT709: cs = SWS_CS_ITU709; break;
        case AVCOL_SPC_FCC: cs = SWS_CS_FCC; break;
        case AVCOL_SPC_SMPTE240M: cs = SWS_CS_SMPTE240M; break;
        case AVCOL_SPC_BT2020_NCL:
        case AVCOL_SPC_BT2020_CL: cs = SWS_CS_BT2020; break;
        default: break;
      }
      const bool full = f->color_range == AVCOL_RANGE_JPEG || fmt == AV_PIX_FMT_YUVJ420P ||
                        fmt == AV_PIX_FMT_YUVJ422P || fmt == AV_PIX_FMT_YUVJ444P;
      sws_setColorspaceDetails(s, sws_getCoefficients(cs), full ? 1 : 0, sws_getCoefficients(SWS_CS_DEFAULT), 1, 0,
                               1 << 16, 1 << 16);
    }
    std::uint8_t* dst_planes[4] = {dst, nullptr, nullptr, nullptr};
    int dst_lines[4] = {static_cast<int>(row), 0, 0, 0};
    const int got = sws_scale(s, f->data, f->linesize, 0, h, dst_planes, dst_lines);
    DLO_CHECK(got == h, "'", path, "': converting frame ", out.frames, " to rgb24 failed");
  }
  ++out.frames;
}

// Sends `pkt` (nullptr: flush) and appends every frame the decoder gives back.
void decode_into(DecodedVideo& out, AVCodecContext* dec, const AVPacket* pkt, AVFrame* frame, SwsPtr& sws,
                 const std::string& path) {
  int ret = avcodec_send_packet(dec, pkt);
  DLO_CHECK(ret >= 0, "'", path, "': decoding frame ", out.frames, ": ", av_error(ret));
  for (;;) {
    ret = avcodec_receive_frame(dec, frame);
    if (ret == AVERROR(EAGAIN) || ret == AVERROR_EOF) return;
    DLO_CHECK(ret >= 0, "'", path, "': decoding frame ", out.frames, ": ", av_error(ret));
    append_rgb(out, frame, sws, path);
    av_frame_unref(frame);
  }
}

std::string lower(std::string s) {
  for (char& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return s;
}

DecodedVideo read_container(const std::string& path) {
  DecodedVideo out;
  AVFormatContext* raw = nullptr;
  int ret = avformat_open_input(&raw, path.c_str(), nullptr, nullptr);
  DLO_CHECK(ret >= 0, "'", path, "': ", av_error(ret));
  InputCtx in(raw);
  ret = avformat_find_stream_info(in.get(), nullptr);
  DLO_CHECK(ret >= 0, "'", path, "': reading stream info: ", av_error(ret));
  const AVCodec* codec = nullptr;
  const int idx = av_find_best_stream(in.get(), AVMEDIA_TYPE_VIDEO, -1, -1, &codec, 0);
  DLO_CHECK(idx >= 0 && codec != nullptr, "'", path, "' has no video stream that this libav can decode");
  const AVStream* st = in->streams[idx];
  CodecCtx dec(avcodec_alloc_context3(codec));
  DLO_CHECK(dec != nullptr, "'", path, "': out of memory");
  ret = avcodec_parameters_to_context(dec.get(), st->codecpar);
  DLO_CHECK(ret >= 0, "'", path, "': ", av_error(ret));
  ret = avcodec_open2(dec.get(), codec, nullptr);
  DLO_CHECK(ret >= 0, "'", path, "': opening the ", codec->name, " decoder: ", av_error(ret));
  const AVRational rate = st->avg_frame_rate.num > 0 ? st->avg_frame_rate : st->r_frame_rate;
  out.fps = rate.num > 0 && rate.den > 0 ? av_q2d(rate) : 0.0;
  const AVDictionaryEntry* e = nullptr;
  while ((e = av_dict_get(in->metadata, "", e, AV_DICT_IGNORE_SUFFIX))) out.tags.emplace_back(lower(e->key), e->value);

  PacketPtr pkt(av_packet_alloc());
  FramePtr frame(av_frame_alloc());
  DLO_CHECK(pkt && frame, "'", path, "': out of memory");
  SwsPtr sws;
  for (;;) {
    ret = av_read_frame(in.get(), pkt.get());
    if (ret == AVERROR_EOF) break;
    DLO_CHECK(ret >= 0, "'", path, "': reading packet of frame ", out.frames, ": ", av_error(ret));
    if (pkt->stream_index == idx) decode_into(out, dec.get(), pkt.get(), frame.get(), sws, path);
    av_packet_unref(pkt.get());
  }
  decode_into(out, dec.get(), nullptr, frame.get(), sws, path);
  DLO_CHECK(out.frames > 0, "'", path, "' holds no video frame");
  return out;
}

DecodedVideo read_png_folder(const std::string& dir_in) {
  const std::string dir = strip_trailing_slashes(dir_in);
  DecodedVideo out;
  const AVCodec* codec = avcodec_find_decoder(AV_CODEC_ID_PNG);
  DLO_CHECK(codec != nullptr, "this libav has no PNG decoder");
  PacketPtr pkt(av_packet_alloc());
  FramePtr frame(av_frame_alloc());
  DLO_CHECK(pkt && frame, "out of memory");
  SwsPtr sws;
  for (std::int64_t i = 0;; ++i) {
    const std::string file = dir + "/" + frame_name(i);
    struct stat st;
    if (::stat(file.c_str(), &st) != 0 && errno == ENOENT) break;
    const std::string bytes = read_file(file);
    // One decoder per file: each PNG stands alone.
    CodecCtx dec(avcodec_alloc_context3(codec));
    DLO_CHECK(dec != nullptr, "out of memory");
    int ret = avcodec_open2(dec.get(), codec, nullptr);
    DLO_CHECK(ret >= 0, "opening the PNG decoder: ", av_error(ret));
    ret = av_new_packet(pkt.get(), static_cast<int>(bytes.size()));
    DLO_CHECK(ret >= 0, "'", file, "': ", av_error(ret));
    std::memcpy(pkt->data, bytes.data(), bytes.size());
    const std::int64_t before = out.frames;
    decode_into(out, dec.get(), pkt.get(), frame.get(), sws, file);
    av_packet_unref(pkt.get());
    decode_into(out, dec.get(), nullptr, frame.get(), sws, file);
    DLO_CHECK(out.frames == before + 1, "'", file, "' decoded to ", out.frames - before, " images, not 1");
  }
  DLO_CHECK(out.frames > 0, "'", dir_in, "' holds no ", frame_name(0));
  const std::string meta = dir + "/metadata.json";
  struct stat st;
  if (::stat(meta.c_str(), &st) == 0) {
    const auto j = nlohmann::ordered_json::parse(read_file(meta), nullptr, false);
    DLO_CHECK(!j.is_discarded() && j.is_object(), "'", meta, "' is not a JSON object");
    if (j.contains("fps") && j["fps"].is_number()) out.fps = j["fps"].get<double>();
    if (j.contains("tags") && j["tags"].is_object())
      for (const auto& [k, v] : j["tags"].items())
        if (v.is_string()) out.tags.emplace_back(k, v.get<std::string>());
  }
  return out;
}

}  // namespace

// ---- public: formats and checks ----------------------------------------------------------------

VideoFormat parse_video_format(const std::string& name) {
  if (name == "mp4") return VideoFormat::kMp4;
  if (name == "png") return VideoFormat::kPng;
  if (name == "ffv1") return VideoFormat::kFfv1;
  DLO_CHECK(false, "unknown video format '", name, "' (mp4, png, ffv1)");
}

const char* video_format_name(VideoFormat format) {
  switch (format) {
    case VideoFormat::kMp4: return "mp4";
    case VideoFormat::kPng: return "png";
    case VideoFormat::kFfv1: return "ffv1";
  }
  return "?";
}

const char* video_format_extension(VideoFormat format) {
  switch (format) {
    case VideoFormat::kMp4: return ".mp4";
    case VideoFormat::kPng: return "";
    case VideoFormat::kFfv1: return ".mkv";
  }
  return "";
}


void check_video_output(const std::string& path, const VideoOptions& options) {
  check_options(options);
  if (options.format == VideoFormat::kPng) {
    check_png_folder(path);
    return;
  }
  DLO_CHECK(path.empty() || path.back() != '/', "'", path, "' ends with '/': ",
            options.format == VideoFormat::kMp4 ? "an MP4" : "a Matroska", " output is a file, not a folder");
  check_output_path(path);
}

void check_video_output(const std::string& path, int width, int height, const VideoOptions& options) {
  DLO_CHECK(width >= 1 && width <= kMaxSide && height >= 1 && height <= kMaxSide, "the frame size ", width, "x",
            height, " is outside 1..", kMaxSide);
  DLO_CHECK(options.format != VideoFormat::kMp4 || (width % 2 == 0 && height % 2 == 0), "the frame size ", width, "x",
            height, " is odd: H.264 in yuv420p needs an even width and height");
  check_video_output(path, options);
}

// ---- the writer ---------------------------------------------------------------------------------

struct VideoWriter::Impl {
  // A temporary PNG folder, removed with its files unless committed.
  struct TempFolder {
    std::string path;
    bool committed = false;
    ~TempFolder() {
      if (!path.empty() && !committed) remove_flat_folder(path);
    }
  };

  VideoOptions options;
  FormatSpec spec;
  int width, height;
  std::string path;  // final
  std::int64_t frames = 0, packets = 0;
  bool finished = false, failed = false;

  // Declared before `fmt`: destroyed after the AVIOContext on its temporary is closed.
  std::unique_ptr<AtomicFile> file;
  TempFolder png_dir;
  OutputCtx fmt;
  AVStream* stream = nullptr;  // owned by fmt
  CodecCtx enc;
  FramePtr frame;
  PacketPtr pkt;
  SwsPtr sws;
  // MP4: each RGB frame is copied here first. swscale picks its code path (and so its rounding)
  // by the source's alignment, so frames straight from the caller's buffer could convert to
  // different YUV (and encode differently) from one run to the next; from this 64-byte aligned
  // buffer they always convert the same.
  std::unique_ptr<std::uint8_t, decltype(&av_free)> rgb_stage{nullptr, &av_free};
  int rgb_stage_line = 0;

  Impl(const std::string& path_in, int w, int h, const VideoOptions& o)
      : options(o), spec(spec_of(o.format)), width(w), height(h) {
    init_libav();
    check_video_output(path_in, w, h, o);
    open_encoder();
    if (o.format == VideoFormat::kPng) {
      path = strip_trailing_slashes(path_in);
      const std::string temp = unique_temp_name(path);
      DLO_CHECK(::mkdir(temp.c_str(), 0755) == 0, "cannot create the folder '", temp, "' (for '", path,
                "'): ", std::strerror(errno));
      png_dir.path = temp;
    } else {
      file = std::make_unique<AtomicFile>(path_in);
      path = file->path();
      open_container();
    }
    frame.reset(av_frame_alloc());
    pkt.reset(av_packet_alloc());
    DLO_CHECK(frame && pkt, "out of memory");
    frame->format = spec.pix;
    frame->width = w;
    frame->height = h;
    const int ret = av_frame_get_buffer(frame.get(), 0);
    DLO_CHECK(ret >= 0, "'", path, "': allocating a frame: ", av_error(ret));
    if (o.format == VideoFormat::kMp4) {
      // ffmpeg's CLI default scaler flags; BT.601 limited range (sws's default), tagged below.
      sws.reset(sws_getContext(w, h, AV_PIX_FMT_RGB24, w, h, AV_PIX_FMT_YUV420P, SWS_BICUBIC, nullptr, nullptr,
                               nullptr));
      DLO_CHECK(sws != nullptr, "'", path, "': no rgb24 to yuv420p conversion");
    }
  }

  void open_encoder() {
    const AVCodec* codec = avcodec_find_encoder_by_name(spec.encoder);
    DLO_ASSERT(codec != nullptr);  // check_options
    enc.reset(avcodec_alloc_context3(codec));
    DLO_CHECK(enc != nullptr, "out of memory");
    enc->width = width;
    enc->height = height;
    enc->pix_fmt = spec.pix;
    enc->time_base = AVRational{1, options.fps};
    enc->framerate = AVRational{options.fps, 1};
    enc->thread_count = options.threads;
    int ret = 0;
    switch (options.format) {
      case VideoFormat::kMp4:
        enc->colorspace = AVCOL_SPC_SMPTE170M;  // what sws's default matrix is (BT.601)
        enc->color_range = AVCOL_RANGE_MPEG;
        ret = av_opt_set(enc->priv_data, "preset", options.preset.c_str(), 0);
        DLO_CHECK(ret >= 0, "libx264 refused preset '", options.preset, "': ", av_error(ret));
        ret = av_opt_set(enc->priv_data, "crf", std::to_string(options.crf).c_str(), 0);
        DLO_CHECK(ret >= 0, "libx264 refused crf ", options.crf, ": ", av_error(ret));
        if (const std::string cpu = x264_cpu_flags(); !cpu.empty()) {
          ret = av_opt_set(enc->priv_data, "x264-params", ("asm=" + cpu).c_str(), 0);
          DLO_CHECK(ret >= 0, "libx264 refused asm=", cpu, ": ", av_error(ret));
        }
        break;
      case VideoFormat::kFfv1:
        // The archival settings of ffmpeg's FFV1 guide: version 3 (per-slice CRCs), every frame a
        // keyframe (any frame can be read alone: datasets seek), the range coder (measured on
        // 832x480 H.264-decoded frames: 23% smaller than Golomb-Rice, 1.5x the encode time).
        enc->level = 3;
        enc->gop_size = 1;
        ret = av_opt_set(enc->priv_data, "coder", "range_tab", 0);
        DLO_CHECK(ret >= 0, "ffv1 refused coder range_tab: ", av_error(ret));
        break;
      case VideoFormat::kPng:
        av_opt_set(enc->priv_data, "pred", "paeth", 0);
        break;
    }
    if (spec.muxer) {
      const AVOutputFormat* of = av_guess_format(spec.muxer, nullptr, nullptr);
      if (of && (of->flags & AVFMT_GLOBALHEADER)) enc->flags |= AV_CODEC_FLAG_GLOBAL_HEADER;
    }
    ret = avcodec_open2(enc.get(), codec, nullptr);
    DLO_CHECK(ret >= 0, "opening the ", spec.encoder, " encoder for ", width, "x", height, " at ", options.fps,
              " fps: ", av_error(ret));
  }

  void open_container() {
    AVFormatContext* raw = nullptr;
    const std::string& temp = file->temp_path();
    int ret = avformat_alloc_output_context2(&raw, nullptr, spec.muxer, temp.c_str());
    DLO_CHECK(ret >= 0 && raw != nullptr, "'", path, "': creating the ", spec.muxer, " muxer: ", av_error(ret));
    fmt.reset(raw);
    stream = avformat_new_stream(fmt.get(), nullptr);
    DLO_CHECK(stream != nullptr, "out of memory");
    ret = avcodec_parameters_from_context(stream->codecpar, enc.get());
    DLO_CHECK(ret >= 0, "'", path, "': ", av_error(ret));
    stream->time_base = enc->time_base;
    stream->avg_frame_rate = enc->framerate;
    for (const auto& [k, v] : options.tags) av_dict_set(&fmt->metadata, k.c_str(), v.c_str(), 0);
    ret = avio_open(&fmt->pb, temp.c_str(), AVIO_FLAG_WRITE);
    DLO_CHECK(ret >= 0, "'", path, "': opening the temporary '", temp, "': ", av_error(ret));
    AVDictionary* opts = nullptr;
    // The index (moov) at the front, so players can start before the whole file is read.
    if (options.format == VideoFormat::kMp4) av_dict_set(&opts, "movflags", "+faststart", 0);
    ret = avformat_write_header(fmt.get(), &opts);
    std::unique_ptr<AVDictionary, DictFree> left(opts);
    DLO_CHECK(ret >= 0, "'", path, "': writing the ", spec.muxer, " header: ", av_error(ret));
    DLO_ASSERT(av_dict_count(left.get()) == 0, "a muxer option was not used");
    check_io();
  }

  void check_io() {
    if (fmt && fmt->pb && fmt->pb->error < 0)
      DLO_CHECK(false, "writing '", path, "' (temporary '", file->temp_path(), "'): ", av_error(fmt->pb->error));
  }

  // Sends `f` (nullptr: flush) and writes every packet the encoder gives back.
  void encode(const AVFrame* f) {
    int ret = avcodec_send_frame(enc.get(), f);
    DLO_CHECK(ret >= 0, "'", path, "': encoding frame ", frames, ": ", av_error(ret));
    for (;;) {
      ret = avcodec_receive_packet(enc.get(), pkt.get());
      if (ret == AVERROR(EAGAIN) || ret == AVERROR_EOF) return;
      DLO_CHECK(ret >= 0, "'", path, "': encoding frame ", frames, ": ", av_error(ret));
      if (fmt) {
        // Without a duration the muxer gives the last frame none and ffprobe counts one short.
        if (pkt->duration == 0) pkt->duration = 1;
        av_packet_rescale_ts(pkt.get(), enc->time_base, stream->time_base);
        pkt->stream_index = stream->index;
        ret = av_interleaved_write_frame(fmt.get(), pkt.get());  // takes the packet's reference
        DLO_CHECK(ret >= 0, "writing '", path, "' (temporary '", file->temp_path(), "'): ", av_error(ret));
        check_io();
      } else {
        with_context(str("'", path, "': frame ", packets), [&] {
          AtomicFile png(png_dir.path + "/" + frame_name(packets));
          png.write(pkt->data, static_cast<std::size_t>(pkt->size));
          av_packet_unref(pkt.get());
          png.commit();
        });
      }
      ++packets;
    }
  }

  void add_frame(const std::uint8_t* rgb) {
    DLO_CHECK(!finished, "'", path, "': add_frame() after finish()");
    DLO_CHECK(!failed, "'", path, "': add_frame() after an error");
    DLO_CHECK(rgb != nullptr, "'", path, "': add_frame() with no data");
    failed = true;  // until this frame is through
    int ret = av_frame_make_writable(frame.get());
    DLO_CHECK(ret >= 0, "'", path, "': ", av_error(ret));
    const std::size_t row = static_cast<std::size_t>(width) * 3;
    switch (options.format) {
      case VideoFormat::kMp4: {
        if (!rgb_stage) {
          rgb_stage_line = static_cast<int>((row + 63) / 64 * 64);
          rgb_stage.reset(static_cast<std::uint8_t*>(av_malloc(static_cast<std::size_t>(rgb_stage_line) * height + 64)));
          DLO_CHECK(rgb_stage != nullptr, "'", path, "': out of memory");
        }
        for (int y = 0; y < height; ++y) std::memcpy(rgb_stage.get() + y * rgb_stage_line, rgb + y * row, row);
        const std::uint8_t* src[4] = {rgb_stage.get(), nullptr, nullptr, nullptr};
        const int src_lines[4] = {rgb_stage_line, 0, 0, 0};
        ret = sws_scale(sws.get(), src, src_lines, 0, height, frame->data, frame->linesize);
        DLO_CHECK(ret == height, "'", path, "': converting frame ", frames, " to yuv420p failed");
        break;
      }
      case VideoFormat::kFfv1:
        // bgr0 (bytes B, G, R, unused): FFV1's 8-bit RGB input. A plain copy, so nothing is lost.
        for (int y = 0; y < height; ++y) {
          const std::uint8_t* s = rgb + y * row;
          std::uint8_t* d = frame->data[0] + y * frame->linesize[0];
          for (int x = 0; x < width; ++x) {
            d[4 * x] = s[3 * x + 2];
            d[4 * x + 1] = s[3 * x + 1];
            d[4 * x + 2] = s[3 * x];
            d[4 * x + 3] = 0;
          }
        }
        break;
      case VideoFormat::kPng:
        for (int y = 0; y < height; ++y) std::memcpy(frame->data[0] + y * frame->linesize[0], rgb + y * row, row);
        break;
    }
    frame->pts = frames;
    encode(frame.get());
    ++frames;
    failed = false;
  }

  void write_png_metadata() {
    nlohmann::ordered_json j;
    j["format"] = "png";
    j["width"] = width;
    j["height"] = height;
    j["frames"] = frames;
    j["fps"] = options.fps;
    j["tags"] = nlohmann::ordered_json::object();
    for (const auto& [k, v] : options.tags) j["tags"][k] = v;
    write_file_atomic(png_dir.path + "/metadata.json",
                      j.dump(2, ' ', false, nlohmann::ordered_json::error_handler_t::replace) + "\n");
  }

  // Puts the finished temporary PNG folder under the final name, replacing an existing folder of
  // ours in one step where the filesystem can exchange two names.
  void commit_png_folder() {
    sync_folder(png_dir.path);
    check_png_folder(path);  // still missing, or still one of ours
    struct stat st;
    if (::lstat(path.c_str(), &st) == 0) {
      if (::renameat2(AT_FDCWD, png_dir.path.c_str(), AT_FDCWD, path.c_str(), RENAME_EXCHANGE) == 0) {
        // The old folder is now under the temporary name.
        remove_flat_folder(png_dir.path);
        png_dir.committed = true;
        sync_folder(path_folder(path));
        return;
      }
      DLO_CHECK(errno == EINVAL || errno == ENOSYS || errno == ENOTSUP, "replacing '", path, "' with '",
                png_dir.path, "': ", std::strerror(errno));
      // No exchange here: move the old folder aside, then the new one in.
      const std::string old = unique_temp_name(path);
      DLO_CHECK(::rename(path.c_str(), old.c_str()) == 0, "moving the old '", path, "' aside: ", std::strerror(errno));
      if (::rename(png_dir.path.c_str(), path.c_str()) != 0) {
        const int e = errno;
        ::rename(old.c_str(), path.c_str());
        DLO_CHECK(false, "renaming '", png_dir.path, "' to '", path, "': ", std::strerror(e));
      }
      remove_flat_folder(old);
      png_dir.committed = true;
    } else {
      DLO_CHECK(::rename(png_dir.path.c_str(), path.c_str()) == 0, "renaming '", png_dir.path, "' to '", path,
                "': ", std::strerror(errno));
      png_dir.committed = true;
    }
    sync_folder(path_folder(path));
  }

  void finish(const std::vector<std::pair<std::string, std::string>>& late_tags) {
    DLO_CHECK(!finished, "'", path, "': finish() called twice");
    DLO_CHECK(!failed, "'", path, "': finish() after an error");
    DLO_CHECK(frames > 0, "'", path, "': finish() with no frame added");
    failed = true;
    for (const auto& [k, v] : late_tags) {
      const auto same = std::find_if(options.tags.begin(), options.tags.end(), [&](const auto& t) { return t.first == k; });
      if (same != options.tags.end())
        same->second = v;
      else
        options.tags.emplace_back(k, v);
    }
    with_context(str("'", path, "'"), [&] { check_options(options); });
    if (fmt)  // MP4 writes these with its index (moov) in the trailer; Matroska wrote its tags already
      for (const auto& [k, v] : late_tags) av_dict_set(&fmt->metadata, k.c_str(), v.c_str(), 0);
    encode(nullptr);
    DLO_CHECK(packets == frames, "'", path, "': the encoder gave ", packets, " packets for ", frames, " frames");
    if (fmt) {
      int ret = av_write_trailer(fmt.get());
      DLO_CHECK(ret >= 0, "writing '", path, "' (temporary '", file->temp_path(), "'): ", av_error(ret));
      check_io();
      ret = avio_closep(&fmt->pb);
      DLO_CHECK(ret >= 0, "writing '", path, "' (temporary '", file->temp_path(), "'): ", av_error(ret));
      file->commit();
    } else {
      write_png_metadata();
      commit_png_folder();
    }
    finished = true;
    failed = false;
  }
};

namespace {

// The encoders' floating-point arithmetic (x264's rate control, its threads, created when the
// encoder opens) runs with the default SSE control state. A calling thread may have other
// settings (flush-to-zero, denormals-are-zero, left by math libraries), and the bytes of a video
// would then depend on which thread wrote it and what that thread ran before.
class DefaultFloatState {
 public:
#if defined(__SSE__)
  DefaultFloatState() : saved_(_mm_getcsr()) { _mm_setcsr(0x1F80); }
  ~DefaultFloatState() { _mm_setcsr(saved_); }

 private:
  unsigned saved_;
#endif
};

}  // namespace

VideoWriter::VideoWriter(const std::string& path, int width, int height, const VideoOptions& options)
    : impl_([&] {
        DefaultFloatState fp;
        return std::make_unique<Impl>(path, width, height, options);
      }()) {}

VideoWriter::~VideoWriter() {
  DefaultFloatState fp;
  impl_.reset();
}

void VideoWriter::add_frame(const std::uint8_t* rgb) {
  DefaultFloatState fp;
  impl_->add_frame(rgb);
}

std::int64_t VideoWriter::frames() const { return impl_->frames; }

void VideoWriter::finish(const std::vector<std::pair<std::string, std::string>>& late_tags) {
  DefaultFloatState fp;
  impl_->finish(late_tags);
}

const std::string& VideoWriter::path() const { return impl_->path; }

// ---- the reader ---------------------------------------------------------------------------------

namespace {

bool has_signature(const std::string& path, VideoFormat format) {
  unsigned char head[8] = {0};
  std::ifstream in(path, std::ios::binary);
  in.read(reinterpret_cast<char*>(head), sizeof head);
  if (format == VideoFormat::kMp4) return std::memcmp(head + 4, "ftyp", 4) == 0;  // ISO BMFF's first box
  return head[0] == 0x1a && head[1] == 0x45 && head[2] == 0xdf && head[3] == 0xa3;  // EBML (Matroska)
}

// Metadata and whole packets of a container; kDamaged when libav cannot read it to the end.
ExistingVideo probe_container(const std::string& path) {
  ExistingVideo v;
  v.kind = ExistingVideo::kDamaged;
  AVFormatContext* raw = nullptr;
  if (avformat_open_input(&raw, path.c_str(), nullptr, nullptr) < 0) return v;
  InputCtx in(raw);
  const AVDictionaryEntry* e = nullptr;
  while ((e = av_dict_get(in->metadata, "", e, AV_DICT_IGNORE_SUFFIX))) v.tags.emplace_back(lower(e->key), e->value);
  PacketPtr pkt(av_packet_alloc());
  DLO_CHECK(pkt != nullptr, "out of memory");
  for (;;) {
    const int ret = av_read_frame(in.get(), pkt.get());
    if (ret == AVERROR_EOF) break;
    if (ret < 0) return v;
    const bool whole = (pkt->flags & AV_PKT_FLAG_CORRUPT) == 0;
    const bool video = in->streams[pkt->stream_index]->codecpar->codec_type == AVMEDIA_TYPE_VIDEO;
    av_packet_unref(pkt.get());
    if (!whole) return v;
    if (video) ++v.frames;
  }
  // A container that opens but holds no frame (an MP4 cut inside its header) is damaged too.
  if (v.frames > 0) v.kind = ExistingVideo::kReadable;
  return v;
}

ExistingVideo probe_png_folder(const std::string& dir) {
  ExistingVideo v;
  v.kind = ExistingVideo::kDamaged;
  const nlohmann::json meta =
      nlohmann::json::parse(read_file(dir + "/metadata.json"), nullptr, /*allow_exceptions=*/false);
  if (!meta.is_object() || !meta.contains("tags") || !meta["tags"].is_object()) return v;
  for (const auto& [k, t] : meta["tags"].items())
    if (t.is_string()) v.tags.emplace_back(k, t.get<std::string>());
  struct stat st;
  while (::stat((dir + "/" + frame_name(v.frames)).c_str(), &st) == 0 && S_ISREG(st.st_mode) && st.st_size > 0) ++v.frames;
  v.kind = ExistingVideo::kReadable;
  return v;
}

}  // namespace

ExistingVideo probe_video(const std::string& path, VideoFormat format) {
  init_libav();
  ExistingVideo none;
  struct stat st;
  if (format == VideoFormat::kPng) {
    const std::string dir = strip_trailing_slashes(path);
    if (::stat(dir.c_str(), &st) != 0 || !S_ISDIR(st.st_mode) || ::access((dir + "/metadata.json").c_str(), R_OK) != 0)
      return none;
    try {
      return probe_png_folder(dir);
    } catch (const Error&) {
      none.kind = ExistingVideo::kDamaged;
      return none;
    }
  }
  const std::string target = resolve_output_path(path);
  if (::stat(target.c_str(), &st) != 0 || !S_ISREG(st.st_mode) || st.st_size == 0) return none;
  if (!has_signature(target, format)) {
    none.kind = ExistingVideo::kForeign;
    return none;
  }
  return probe_container(target);
}

RgbImage read_image(const std::string& path) {
  init_libav();
  DLO_CHECK(!path.empty(), "an empty image path");
  check_regular_file(path);
  const DecodedVideo v = read_container(path);
  DLO_CHECK(v.frames == 1, "'", path, "' holds ", v.frames, " frames: an input image has one");
  // This libav (5.1) exports no EXIF orientation: read it from the file's own bytes.
  return upright(RgbImage{v.width, v.height, v.rgb}, exif_orientation(read_file(path)));
}

DecodedVideo read_video(const std::string& path) {
  init_libav();
  struct stat st;
  DLO_CHECK(!path.empty() && ::stat(path.c_str(), &st) == 0, "'", path, "': ", std::strerror(errno));
  if (S_ISDIR(st.st_mode)) return read_png_folder(path);
  check_regular_file(path);
  return read_container(path);
}

}  // namespace dlo
