// Video outputs through libav (libavformat, libavcodec, libswscale): H.264 in MP4, FFV1 in MKV and
// a folder of numbered PNGs, written from RGB24 frames; and a reader that decodes them back.
//
// This is the `dlo_media` target: torch-free, and the only dlo target that links libav, so the
// binaries that travel to a bare GPU machine (which link `dlo`) do not need it.
//
// Outputs follow lib/dlo/common/file.h: everything is written under a temporary name in the target
// folder and renamed into place when complete, so a crash or an exception never leaves a file (or
// PNG folder) under the final name that looks finished.
//
// libav's own log lines are not printed: on first use this library installs a libav log callback
// that drops them and keeps the last error-level line of the thread, which is appended to the
// dlo::Error thrown for the failing call.
//
// Thread-safety: the free functions are thread-safe; one VideoWriter is driven by one thread.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

namespace dlo {

enum class VideoFormat {
  kMp4,   // H.264 (libx264), yuv420p, in MP4: lossy
  kPng,   // a folder of frame_00000.png, ... (RGB24), plus metadata.json: lossless
  kFfv1,  // FFV1 (version 3, range coder, all keyframes) in Matroska, 8-bit RGB (bgr0): lossless
};

// "mp4" | "png" | "ffv1"; anything else throws dlo::Error naming the value and the choices.
VideoFormat parse_video_format(const std::string& name);
// "mp4", "png", "ffv1".
const char* video_format_name(VideoFormat format);
// The default output name's extension for a format: ".mp4", "" (a folder), ".mkv".
const char* video_format_extension(VideoFormat format);

struct VideoOptions {
  VideoFormat format = VideoFormat::kMp4;
  int fps = 16;                   // Wan's; 1..240
  int crf = 25;                   // MP4 only; 0..51. diffusers' export_to_video (imageio, quality 5) uses 25
  std::string preset = "medium";  // MP4 only; a libx264 preset
  int threads = 0;                // encoder threads; 0 = libav's choice for the machine (as the ffmpeg CLI)
  // Container metadata, in this order. MP4: iTunes-style tags, which show in `ffprobe
  // -show_format`; only these names (others would be dropped by the muxer, so they are refused):
  // comment, description, title, artist, album, date, genre, copyright, composer, synopsis,
  // grouping, lyrics.
  // MKV: Matroska SimpleTags (Matroska stores the names upper-case; read_video lower-cases them).
  // PNG: the "tags" object of `metadata.json` in the folder. Names must be non-empty; names and
  // values must not hold NUL bytes.
  std::vector<std::pair<std::string, std::string>> tags;
};

// Checks before any work starts that `path` can be written in `options.format` and that the
// options are valid; throws dlo::Error naming the field or the path and the reason. Creates
// nothing. Checked: fps 1..240, crf 0..51, a preset libx264 knows, the encoder (and muxer) present
// in this libav, the tags; MP4/MKV: the rule of check_output_path (folder exists and is writable,
// `path` is not a directory, device or FIFO); PNG: `path` names a folder (not "." or ".."), its
// parent exists and is writable, and `path` is either missing or a folder that holds nothing but
// frame_NNNNN.png files and metadata.json (a folder with other files is never replaced).
void check_video_output(const std::string& path, const VideoOptions& options);
// The same, and the frame size: positive, at most 16384, and even for MP4 (yuv420p halves chroma).
void check_video_output(const std::string& path, int width, int height, const VideoOptions& options);

// Streams frames into one output. Frames are RGB24, row-major [height][width][3], uint8.
// MP4: sws converts RGB24 to yuv420p (SWS_BICUBIC, BT.601 limited range, as the ffmpeg CLI does;
// the stream is tagged smpte170m/tv so players convert back with the same matrix); time base
// 1/fps, every frame one tick; +faststart. FFV1: RGB24 is repacked as bgr0 without any colour
// conversion, so decoding gives back the exact bytes. PNG: one RGB24 PNG per frame,
// numbered from 0, in a temporary folder renamed into place by finish(); an existing folder of
// that name is replaced only at finish() (atomically where the filesystem can exchange names).
// The destructor without finish() removes the temporary file or folder.
class VideoWriter {
 public:
  // Runs check_video_output(path, width, height, options), opens the encoder and creates the
  // temporary. Throws dlo::Error.
  VideoWriter(const std::string& path, int width, int height, const VideoOptions& options);
  ~VideoWriter();
  VideoWriter(const VideoWriter&) = delete;
  VideoWriter& operator=(const VideoWriter&) = delete;

  // Encodes one frame of width*height*3 bytes (the caller keeps ownership; it is not retained).
  // Throws dlo::Error (encoder failure, write error, disk full); the output is then unusable and
  // the destructor removes the temporary.
  void add_frame(const std::uint8_t* rgb);
  // Frames added so far.
  std::int64_t frames() const;
  // Flushes the encoder, writes the trailer (MP4/MKV) or metadata.json (PNG), syncs, renames the
  // temporary into place and syncs the folder. At least one frame must have been added. Throws
  // dlo::Error (the temporary is then removed by the destructor). Call once.
  // `late_tags`: metadata known only now (the frames' hash), replacing options.tags of the same
  // name or added after them, checked as they are. MP4 writes its metadata with its index at the
  // end and PNG its metadata.json, so both keep them; Matroska has written its tags in its header,
  // so an MKV keeps options.tags only.
  void finish(const std::vector<std::pair<std::string, std::string>>& late_tags = {});
  // The final path.
  const std::string& path() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// What is at a video output's path before it is written, for whoever decides whether it may be
// replaced or is already done. kNone: nothing (absent, or an empty file); kForeign: a file without
// the format's container signature (a manifest, weights, a text: never a video); kDamaged: the
// container's signature, or a PNG folder's metadata.json, but libav cannot read it to the end or finds no frame in it (a
// cut copy); kReadable: its metadata and the number of whole video packets (frames) it holds.
struct ExistingVideo {
  enum Kind { kNone, kForeign, kDamaged, kReadable } kind = kNone;
  std::vector<std::pair<std::string, std::string>> tags;  // names lower-case, as read_video's
  std::int64_t frames = 0;
};
// Reads the container's index and packets without decoding (a PNG folder: metadata.json and the
// frame files present). Never throws for what it finds; symbolic links are followed.
ExistingVideo probe_video(const std::string& path, VideoFormat format);

// A decoded video: RGB24 frames, [frames][height][width][3].
struct DecodedVideo {
  int width = 0, height = 0;
  std::int64_t frames = 0;
  double fps = 0;  // the stream's average frame rate; PNG: from metadata.json (0 without it)
  std::vector<std::uint8_t> rgb;
  // Container metadata in the container's order, names lower-case (MP4 also has major_brand,
  // encoder, ...); PNG: the "tags" of metadata.json.
  std::vector<std::pair<std::string, std::string>> tags;
};

// Decodes a video file (MP4, MKV, anything libav reads) or a PNG folder (frame_00000.png, ...
// up to the first missing number) to RGB24, for tests and checks. RGB24, gbrp, bgr0 and bgra
// frames are repacked without conversion (lossless formats give back the exact bytes); YUV frames are
// converted by sws with the stream's matrix and range. Throws dlo::Error naming the path.
DecodedVideo read_video(const std::string& path);

}  // namespace dlo
