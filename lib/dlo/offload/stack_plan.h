// How a stack of blocks (transformer blocks, encoder layers) is laid out for streaming.
//
// Each block's tensors are packed into one flat byte layout: a fixed order, every tensor at an
// offset aligned to kTensorAlign, mixed dtypes allowed. For N ranks a block is cut into N equal
// shards of shard_bytes() = ceil(bytes / N) rounded up to kShardAlign; rank r owns bytes
// [r * shard, (r + 1) * shard), zero-padded past the block's end. A device slot holds one padded
// block; the slot size is the largest padded block.
#pragma once

#include <cstdint>
#include <memory>
#include <functional>
#include <string>
#include <vector>

#include <ATen/core/Tensor.h>

#include "dlo/io/dtype.h"
#include "dlo/io/safetensors.h"
#include "dlo/models/tensor_edits.h"

namespace dlo {

inline constexpr std::uint64_t kTensorAlign = 64;
inline constexpr std::uint64_t kShardAlign = 256;

// How a tensor is packed: its dtype in the layout, and the dtype its values are rounded through on
// the way from the checkpoint's (diffusers loads in the compute dtype, then casts to a narrower
// storage: two roundings). A checkpoint tensor already in `dtype` is copied as it is, unless
// `edits` change it (TensorEdits::touches): then its rows are formed in `via`, changed there, and
// rounded to `dtype` (a fused LoRA merged, then narrowed).
struct PackedAs {
  DType dtype;
  DType via;
  std::shared_ptr<const TensorEdits> edits;
  PackedAs(DType d) : dtype(d), via(d) {}  // NOLINT: one conversion, the plain case
  PackedAs(DType d, DType through, std::shared_ptr<const TensorEdits> e = nullptr)
      : dtype(d), via(through), edits(std::move(e)) {}
};

struct PackedTensor {
  std::string name;                  // full checkpoint name
  const TensorInfo* source = nullptr;
  DType dtype = DType::F32;          // dtype in the packed layout (converted while packing if it differs)
  DType via = DType::F32;            // rounded through on the way (PackedAs)
  std::shared_ptr<const TensorEdits> edits;  // set where they change this tensor (PackedAs)
  std::vector<std::int64_t> shape;
  std::uint64_t offset = 0;          // in the block
  std::uint64_t nbytes = 0;
};

struct BlockPlan {
  std::vector<PackedTensor> tensors;
  std::uint64_t bytes = 0;  // end of the last tensor
};

class StackPlan {
 public:
  // Plans `blocks` (each a list of full tensor names in packing order) of checkpoint `ck` for
  // `ranks` ranks; `packed_dtype(name)` gives each tensor's dtype in the layout (PackedAs). Throws
  // dlo::Error naming the checkpoint and tensor if one is missing.
  // The plan keeps the checkpoint (the engine packs from its mapping for as long as it runs).
  StackPlan(std::shared_ptr<const Checkpoint> ck, const std::vector<std::vector<std::string>>& blocks,
            const std::function<PackedAs(const std::string&)>& packed_dtype, int ranks);

  const Checkpoint& checkpoint() const { return *ck_; }
  int ranks() const { return ranks_; }
  std::int64_t num_blocks() const { return static_cast<std::int64_t>(blocks_.size()); }
  const BlockPlan& block(std::int64_t i) const { return blocks_.at(static_cast<std::size_t>(i)); }
  std::uint64_t shard_bytes(std::int64_t i) const;
  std::uint64_t padded_bytes(std::int64_t i) const { return shard_bytes(i) * static_cast<std::uint64_t>(ranks_); }
  std::uint64_t slot_bytes() const;            // largest padded block
  std::uint64_t total_bytes() const;           // sum of block bytes (unpadded)
  // A hash of everything every rank must agree on (names, dtypes, shapes, offsets, ranks, edits).
  std::uint64_t fingerprint() const;

  // Writes bytes [begin, end) of block i's packed layout to `out` (zeros past the block's end),
  // reading only the checkpoint bytes that land in that range. With `release_pages`, the
  // checkpoint pages read are released from the page cache afterwards.
  void pack(std::int64_t i, std::uint64_t begin, std::uint64_t end, std::byte* out, bool release_pages) const;

  // Checkpoint values `from` of tensor `t` as packed: `from` itself when its dtype is t's and no
  // edits change it, else converted (through t.via where that is a third dtype), and changed in
  // t.via by its edits. What pack() writes, as a tensor.
  static at::Tensor packed_values(const PackedTensor& t, const at::Tensor& from);

  // Views of block i's tensors in a packed buffer at `base` on `device` (no copies); the caller
  // keeps the buffer alive.
  std::vector<at::Tensor> views(std::int64_t i, std::byte* base, at::Device device) const;

 private:
  std::shared_ptr<const Checkpoint> ck_;
  int ranks_;
  std::vector<BlockPlan> blocks_;
};

}  // namespace dlo
