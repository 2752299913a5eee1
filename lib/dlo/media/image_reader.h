// Input images (image to video) through libav: PNG, JPEG, WebP, BMP, TIFF, whatever this libav's
// image demuxers and decoders read, as 8-bit RGB the way Pillow's
// ImageOps.exif_transpose(Image.open(path)).convert("RGB") gives it: alpha dropped (not composited),
// the EXIF Orientation the decoder exports (JPEG, WebP) applied. A PNG or a lossless WebP reads to
// Pillow's bytes exactly; a JPEG within a few levels (libav's IDCT and chroma upsampling are not
// libjpeg-turbo's: on a photo-like test image a mean of 0.5 levels, at most 4; tests/media/test_image.cpp).
#pragma once

#include <string>

#include "dlo/common/rgb_image.h"

namespace dlo {

// Throws dlo::Error naming the path: missing, not a regular file (a FIFO is refused without
// opening it), not an image this libav decodes, more than one frame (an animation).
RgbImage read_image(const std::string& path);

// The EXIF Orientation (1-8) of a JPEG (APP1 "Exif"), PNG (eXIf chunk) or WebP (EXIF chunk) file's
// bytes, from IFD0's tag 0x0112; 1 when the file has none or it is malformed (as Pillow, which
// then leaves the image as it is).
int exif_orientation(const std::string& bytes);

}  // namespace dlo
