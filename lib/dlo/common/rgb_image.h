// An 8-bit RGB image and the fits that bring an input image (image to video) to a job's size,
// computed as diffusers' VaeImageProcessor.resize computes them (diffusers 0.42.1, Pillow 13.0),
// byte for byte:
//   stretch  resize_mode "default": Image.resize((width, height), LANCZOS), the aspect ratio lost;
//            what WanImageToVideoPipeline does to an image that is not the job's size;
//   crop     resize_mode "crop" (_resize_and_crop): resized to cover the job's size with its
//            aspect ratio kept (the side that overflows: old * new_other // old_other, floored),
//            then the centre pasted at (width // 2 - w // 2, height // 2 - h // 2), the overflow
//            cut off;
//   pad      resized to fit inside the job's size with its aspect ratio kept (sizes as crop's,
//            the other way round), centred the same way on black. (diffusers' "fill" instead
//            stretches the image's edge rows into the bars; dlo pads with black.)
// The resampler is Pillow's Lanczos (Resample.c: a = 3, support scaled by the downscale factor,
// coefficients normalised, then 22-bit fixed point, rounded and clipped to 8 bits after each
// pass; the horizontal pass first unless the height shrinks by more than twice the width).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace dlo {

struct RgbImage {
  std::int64_t width = 0, height = 0;
  std::vector<std::uint8_t> rgb;  // rows top to bottom, 3 bytes a pixel, no padding
  bool operator==(const RgbImage&) const = default;
};

enum class ImageFit { kCrop, kPad, kStretch };
// "crop", "pad", "stretch" -> the fit; dlo::Error naming `what` otherwise.
ImageFit parse_image_fit(const std::string& name, const std::string& what);
const char* image_fit_name(ImageFit fit);

// Pillow's Image.resize(image, (width, height), Image.LANCZOS) on an RGB image: a copy when the
// size is the image's. Throws dlo::Error for a size < 1 or an empty image.
RgbImage resize_lanczos(const RgbImage& image, std::int64_t width, std::int64_t height);

// `image` as EXIF Orientation `orientation` (1-8) says to show it, as Pillow's exif_transpose:
// 2 mirrored left-right, 3 turned 180 degrees, 4 mirrored top-bottom, 5 transposed, 6 turned 90
// degrees clockwise, 7 transversed, 8 turned 90 degrees anticlockwise; 1 (or anything else) as is.
RgbImage upright(const RgbImage& image, int orientation);

// `image` brought to width x height by `fit` (above).
RgbImage fit_image(const RgbImage& image, std::int64_t width, std::int64_t height, ImageFit fit);

}  // namespace dlo
