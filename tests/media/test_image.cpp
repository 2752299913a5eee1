// Input images: media/image_reader.h's read_image and common/rgb_image.h's fits, against what
// Pillow 13.0 and diffusers 0.42.1 make of the same files (tests/media/images/make_images.py wrote
// both; the expected images are binary PPMs).
#include <doctest/doctest.h>
#include <sys/stat.h>

#include <cmath>
#include <cstdlib>
#include <string>

#include "common/source_tree.h"
#include "common/test_util.h"
#include "dlo/common/error.h"
#include "dlo/common/file.h"
#include "dlo/common/rgb_image.h"
#include "dlo/media/image_reader.h"

using namespace dlo;

namespace {

std::string images() { return dlo::test::source_dir() + "/tests/media/images/"; }

// A binary PPM (P6, maxval 255, single whitespace after the header) as Pillow writes it here.
RgbImage read_ppm(const std::string& path) {
  const std::string b = read_file(path);
  std::size_t at = 0;
  const auto word = [&] {
    while (at < b.size() && std::isspace(static_cast<unsigned char>(b[at]))) ++at;
    const std::size_t from = at;
    while (at < b.size() && !std::isspace(static_cast<unsigned char>(b[at]))) ++at;
    return b.substr(from, at - from);
  };
  REQUIRE(word() == "P6");
  RgbImage im;
  im.width = std::stoll(word());
  im.height = std::stoll(word());
  REQUIRE(word() == "255");
  ++at;
  im.rgb.assign(b.begin() + static_cast<std::ptrdiff_t>(at), b.end());
  REQUIRE(im.rgb.size() == static_cast<std::size_t>(im.width * im.height * 3));
  return im;
}

const std::pair<int, int> kSizes[] = {{16, 24}, {48, 16}, {37, 23}, {64, 40}, {9, 31}};

}  // namespace

TEST_CASE("read_image: PNG, lossless WebP and RGBA PNG (alpha dropped) read to Pillow's RGB bytes") {
  const RgbImage src = read_ppm(images() + "lanczos_37x23.ppm");  // a resize to its own size: Pillow's copy
  for (const char* f : {"src.png", "src.webp", "src_rgba.png"}) {
    CAPTURE(f);
    CHECK(read_image(images() + f) == src);
  }
}

TEST_CASE("read_image: a JPEG's EXIF Orientation 1-8 applied as Pillow's exif_transpose, the pixels within the two JPEG decoders' difference") {
  for (int o = 1; o <= 8; ++o) {
    CAPTURE(o);
    const RgbImage want = read_ppm(images() + "orient" + std::to_string(o) + ".ppm");
    const RgbImage got = read_image(images() + "orient" + std::to_string(o) + ".jpg");
    REQUIRE(got.width == want.width);
    REQUIRE(got.height == want.height);
    CHECK((o >= 5 ? got.width == 32 : got.width == 48));
    double sum = 0;
    int worst = 0;
    for (std::size_t i = 0; i < got.rgb.size(); ++i) {
      const int d = std::abs(int(got.rgb[i]) - int(want.rgb[i]));
      sum += d;
      worst = std::max(worst, d);
    }
    // libav's JPEG decoder (its IDCT, its chroma upsampling through swscale) against libjpeg-turbo's
    // (Pillow's): measured 2026-12-08 on these photo-like files, mean 0.53 and worst 4 levels in
    // every orientation (on a 5-pixel colour checker, all chroma, the mean was 13.6: 4:2:0 chroma
    // is upsampled differently); a wrong orientation is tens of levels off.
    const double mean = sum / static_cast<double>(got.rgb.size());
    CAPTURE(mean);
    CAPTURE(worst);
    CHECK(mean < 1.5);
    CHECK(worst <= 8);
  }
}

TEST_CASE("read_image: a PNG's eXIf and a lossless WebP's EXIF orientation applied, Pillow's bytes exactly") {
  for (int o : {3, 6}) {
    CAPTURE(o);
    const RgbImage want = read_ppm(images() + "orient" + std::to_string(o) + "_lossless.ppm");
    CHECK(read_image(images() + "orient" + std::to_string(o) + ".png") == want);
    CHECK(read_image(images() + "orient" + std::to_string(o) + ".webp") == want);
  }
  CHECK(exif_orientation("") == 1);
  CHECK(exif_orientation(read_file(images() + "src.png")) == 1);
  std::string cut = read_file(images() + "orient6.jpg");
  cut.resize(40);  // the EXIF segment's length points past the end: no orientation, no read past it
  CHECK(exif_orientation(cut) == 1);
}

TEST_CASE("upright: the eight EXIF orientations on a 3x2 image, by hand") {
  // Pixels numbered 0..5 row by row: 0 1 2 / 3 4 5 (each pixel's three bytes its number).
  RgbImage im{3, 2, {}};
  for (int i = 0; i < 6; ++i) im.rgb.insert(im.rgb.end(), {std::uint8_t(i), std::uint8_t(i), std::uint8_t(i)});
  const auto seq = [](const RgbImage& r) {
    std::string s = std::to_string(r.width) + "x" + std::to_string(r.height) + ":";
    for (std::size_t i = 0; i < r.rgb.size(); i += 3) s += char('0' + r.rgb[i]);
    return s;
  };
  CHECK(seq(upright(im, 1)) == "3x2:012345");
  CHECK(seq(upright(im, 2)) == "3x2:210543");  // mirrored left-right
  CHECK(seq(upright(im, 3)) == "3x2:543210");  // 180
  CHECK(seq(upright(im, 4)) == "3x2:345012");  // mirrored top-bottom
  CHECK(seq(upright(im, 5)) == "2x3:031425");  // transposed
  CHECK(seq(upright(im, 6)) == "2x3:304152");  // 90 clockwise
  CHECK(seq(upright(im, 7)) == "2x3:524130");  // transversed
  CHECK(seq(upright(im, 8)) == "2x3:251403");  // 90 anticlockwise
}

TEST_CASE("resize_lanczos and the fits equal Pillow's LANCZOS and diffusers' VaeImageProcessor.resize byte for byte") {
  const RgbImage src = read_image(images() + "src.png");
  for (const auto& [w, h] : kSizes) {
    CAPTURE(w);
    CAPTURE(h);
    const std::string s = std::to_string(w) + "x" + std::to_string(h) + ".ppm";
    CHECK(resize_lanczos(src, w, h) == read_ppm(images() + "lanczos_" + s));
    CHECK(fit_image(src, w, h, ImageFit::kStretch) == read_ppm(images() + "stretch_" + s));
    CHECK(fit_image(src, w, h, ImageFit::kCrop) == read_ppm(images() + "crop_" + s));
  }
}

TEST_CASE("pad: fitted inside with the aspect ratio kept, centred on black") {
  const RgbImage src = read_image(images() + "src.png");  // 37x23
  // 40x40: the width matches (40), the height 23 * 40 // 37 = 24, pasted at y = 20 - 12 = 8.
  const RgbImage p = fit_image(src, 40, 40, ImageFit::kPad);
  const RgbImage inner = resize_lanczos(src, 40, 24);
  REQUIRE(p.width == 40);
  REQUIRE(p.height == 40);
  for (std::int64_t y = 0; y < 40; ++y)
    for (std::int64_t x = 0; x < 40 * 3; ++x) {
      const std::uint8_t v = p.rgb[static_cast<std::size_t>(y * 120 + x)];
      if (y < 8 || y >= 32)
        REQUIRE(v == 0);
      else
        REQUIRE(v == inner.rgb[static_cast<std::size_t>((y - 8) * 120 + x)]);
    }
  // Taller than wide: 10x40 keeps the height of 40? No: the width 10 matches, the height
  // 23 * 10 // 37 = 6, at y = 20 - 3 = 17.
  const RgbImage q = fit_image(src, 10, 40, ImageFit::kPad);
  CHECK(q.rgb[static_cast<std::size_t>((16 * 10 + 5) * 3)] == 0);
  CHECK(std::equal(q.rgb.begin() + 17 * 30, q.rgb.begin() + 23 * 30, resize_lanczos(src, 10, 6).rgb.begin()));
  // The same aspect ratio: pad, crop and stretch agree.
  CHECK(fit_image(src, 74, 46, ImageFit::kPad) == resize_lanczos(src, 74, 46));
  CHECK(fit_image(src, 74, 46, ImageFit::kCrop) == resize_lanczos(src, 74, 46));
  CHECK(parse_image_fit("pad", "image_fit") == ImageFit::kPad);
  CHECK_THROWS_WITH_AS(parse_image_fit("fill", "image_fit"), doctest::Contains("image_fit: 'fill' is not crop, pad or stretch"), Error);
}

TEST_CASE("read_image refuses what is not one image, naming the file") {
  dlo::test::TempDir d;
  CHECK(dlo::test::error_of([&] { read_image(d.file("gone.png")); }).find("gone.png") != std::string::npos);
  dlo::test::write_file(d.file("text.png"), "not an image at all");
  CHECK(dlo::test::error_of([&] { read_image(d.file("text.png")); }).find("text.png") != std::string::npos);
  REQUIRE(::mkfifo(d.file("fifo.png").c_str(), 0600) == 0);
  CHECK(dlo::test::error_of([&] { read_image(d.file("fifo.png")); }).find("not a regular file") != std::string::npos);
}
