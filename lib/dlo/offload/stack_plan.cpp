#include "dlo/offload/stack_plan.h"

#include <algorithm>
#include <cstring>

#include <ATen/ATen.h>

#include "dlo/common/error.h"
#include "dlo/models/tensor_view.h"

namespace dlo {
namespace {

std::uint64_t round_up(std::uint64_t v, std::uint64_t a) { return (v + a - 1) / a * a; }

// Elements per row of t (a weight [out, ...] has out rows; a 1-D tensor one element each).
std::int64_t row_elements(const PackedTensor& t) {
  std::int64_t cols = 1;
  for (std::size_t d = 1; d < t.shape.size(); ++d) cols *= t.shape[d];
  return cols;
}

// Rows [first_row, ...) of t, changed by its edits (values `from`, whole rows, any shape).
at::Tensor edited_rows(const PackedTensor& t, const at::Tensor& from, std::int64_t first_row) {
  return edited_rows(*t.edits, t.name, from, row_elements(t), to_scalar_type(t.via), to_scalar_type(t.dtype), first_row);
}

}  // namespace

StackPlan::StackPlan(std::shared_ptr<const Checkpoint> ck, const std::vector<std::vector<std::string>>& blocks,
                     const std::function<PackedAs(const std::string&)>& packed_dtype, int ranks)
    : ck_(std::move(ck)), ranks_(ranks) {
  DLO_ASSERT(ck_ != nullptr, "a stack plan needs a checkpoint");
  DLO_CHECK(ranks >= 1, "ranks must be >= 1");
  for (const auto& names : blocks) {
    BlockPlan b;
    std::uint64_t offset = 0;
    for (const auto& name : names) {
      PackedTensor t;
      t.name = name;
      t.source = &ck_->at(name);
      const PackedAs as = packed_dtype(name);
      t.dtype = as.dtype;
      t.via = as.via;
      if (as.edits && as.edits->touches(name)) t.edits = as.edits;
      t.shape = t.source->shape;
      t.offset = round_up(offset, kTensorAlign);
      t.nbytes = static_cast<std::uint64_t>(t.source->numel()) * dtype_size(t.dtype);
      offset = t.offset + t.nbytes;
      b.tensors.push_back(std::move(t));
    }
    b.bytes = offset;
    blocks_.push_back(std::move(b));
  }
}

std::uint64_t StackPlan::shard_bytes(std::int64_t i) const {
  const std::uint64_t n = static_cast<std::uint64_t>(ranks_);
  return round_up((block(i).bytes + n - 1) / n, kShardAlign);
}

std::uint64_t StackPlan::slot_bytes() const {
  std::uint64_t m = 0;
  for (std::int64_t i = 0; i < num_blocks(); ++i) m = std::max(m, padded_bytes(i));
  return m;
}

std::uint64_t StackPlan::total_bytes() const {
  std::uint64_t s = 0;
  for (const auto& b : blocks_) s += b.bytes;
  return s;
}

std::uint64_t StackPlan::fingerprint() const {
  std::uint64_t h = 1469598103934665603ull;
  auto mix = [&](std::uint64_t v) {
    for (int k = 0; k < 8; ++k) {
      h ^= (v >> (8 * k)) & 0xff;
      h *= 1099511628211ull;
    }
  };
  mix(static_cast<std::uint64_t>(ranks_));
  for (const auto& b : blocks_) {
    mix(b.bytes);
    for (const auto& t : b.tensors) {
      for (unsigned char c : t.name) mix(c);
      mix(static_cast<std::uint64_t>(t.dtype));
      mix(static_cast<std::uint64_t>(t.via));
      mix(t.offset);
      for (auto d : t.shape) mix(static_cast<std::uint64_t>(d));
      if (t.edits)
        for (unsigned char c : t.edits->identity()) mix(c);
    }
  }
  return h;
}

void StackPlan::pack(std::int64_t i, std::uint64_t begin, std::uint64_t end, std::byte* out,
                     bool release_pages) const {
  DLO_ASSERT(begin <= end);
  std::memset(out, 0, end - begin);  // alignment gaps and the padding past the block's end
  for (const auto& t : block(i).tensors) {
    const std::uint64_t lo = std::max(begin, t.offset), hi = std::min(end, t.offset + t.nbytes);
    if (lo >= hi) continue;
    const SafetensorsFile& file = ck_->file_of(*t.source);
    const std::byte* src = file.data(*t.source);
    const std::size_t out_elem = dtype_size(t.dtype), in_elem = dtype_size(t.source->dtype);
    // Shard boundaries are multiples of kShardAlign and tensors start at multiples of
    // kTensorAlign, so [lo, hi) always covers whole elements.
    DLO_ASSERT((lo - t.offset) % out_elem == 0 && (hi - t.offset) % out_elem == 0);
    const std::uint64_t first = (lo - t.offset) / out_elem, count = (hi - lo) / out_elem;
    const std::byte* in = src + first * in_elem;
    if (t.edits) {
      // Whole rows are changed (a row's change needs all of it), then this range's part is kept.
      const auto cols = static_cast<std::uint64_t>(row_elements(t));
      const std::uint64_t r0 = first / cols, r1 = (first + count + cols - 1) / cols;
      at::Tensor rows = at::from_blob(const_cast<std::byte*>(src + r0 * cols * in_elem),
                                      {static_cast<std::int64_t>((r1 - r0) * cols)},
                                      at::TensorOptions().dtype(to_scalar_type(t.source->dtype)));
      at::Tensor to = at::from_blob(out + (lo - begin), {static_cast<std::int64_t>(count)},
                                    at::TensorOptions().dtype(to_scalar_type(t.dtype)));
      to.copy_(edited_rows(t, rows, static_cast<std::int64_t>(r0))
                   .narrow(0, static_cast<std::int64_t>(first - r0 * cols), static_cast<std::int64_t>(count)));
    } else if (t.dtype == t.source->dtype) {
      std::memcpy(out + (lo - begin), in, hi - lo);
    } else {
      at::Tensor from = at::from_blob(const_cast<std::byte*>(in), {static_cast<std::int64_t>(count)},
                                      at::TensorOptions().dtype(to_scalar_type(t.source->dtype)));
      at::Tensor to = at::from_blob(out + (lo - begin), {static_cast<std::int64_t>(count)},
                                    at::TensorOptions().dtype(to_scalar_type(t.dtype)));
      to.copy_(packed_values(t, from));
    }
    if (release_pages) file.mapping()->release_pages(t.source->offset + first * in_elem, count * in_elem);
  }
}

at::Tensor StackPlan::packed_values(const PackedTensor& t, const at::Tensor& from) {
  if (t.edits) return edited_rows(t, from, 0);
  const at::ScalarType to = to_scalar_type(t.dtype), via = to_scalar_type(t.via);
  if (from.scalar_type() == to) return from;
  return (from.scalar_type() == via || via == to ? from : from.to(via)).to(to);
}

std::vector<at::Tensor> StackPlan::views(std::int64_t i, std::byte* base, at::Device device) const {
  std::vector<at::Tensor> out;
  for (const auto& t : block(i).tensors)
    out.push_back(at::from_blob(base + t.offset, t.shape,
                                at::TensorOptions().dtype(to_scalar_type(t.dtype)).device(device)));
  return out;
}

}  // namespace dlo
