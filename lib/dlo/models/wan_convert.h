// dlo-checkpoint convert: a Wan transformer, in any layout open_wan_transformer reads, rewritten as
// a diffusers transformer folder whose tensors are what dlo keeps in memory for a storage dtype.
#pragma once

#include <string>

#include "dlo/io/safetensors_writer.h"
#include "dlo/models/wan_transformer.h"

namespace dlo {

struct WanConvertResult {
  WriteResult written;
  WanTransformerConfig config;
  WanDtypes dtypes;
};

// Writes `dst_dir` (config.json and safetensors shards by `options`, diffusers' tensor names) from
// the transformer at `src` (a diffusers folder, a single file or index, original Wan or ComfyUI
// names): every tensor as WanDtypes::keep keeps it for `storage` computed in `compute` (fp8: the
// blocks' Linears in fp8, rounded as diffusers' layerwise casting rounds them; the other tensors in
// the dtype diffusers computes them in). Loading the result with --storage-dtype auto gives the
// frames of `src` with --storage-dtype `storage`, from half the file. The config is the source
// folder's config.json where there is one (checked against the shapes), else the shapes' (a known
// Wan config). Streams: peak memory about one tensor. Bad input (not a Wan transformer, a tensor
// missing or of another shape, a storage wider than `compute`, `dst_dir` holding the source) is a
// dlo::Error before anything is written.
WanConvertResult convert_wan_transformer(const std::string& src, const std::string& dst_dir, LinearStorage storage,
                                         at::ScalarType compute, WriteOptions options);

}  // namespace dlo
