// Changes to a model's weights made where their values are formed on the way to how they are kept
// (a fused LoRA's scaled B·A added to a Linear's weight), row by row: a rank that packs a range of
// a tensor changes only the rows it packs, so no rank ever holds a whole changed block.
//
// The values handed to apply() are in the dtype the model's reference holds the tensor in when it
// makes the change (diffusers: the dtype it loaded the weight in, before any narrower storage),
// so "change, then narrow" is the one order: a LoRA fused into fp8 storage is merged in the compute
// dtype, then rounded to fp8.
#pragma once

#include <cstdint>
#include <string>

#include <ATen/core/Tensor.h>

namespace dlo {

class TensorEdits {
 public:
  virtual ~TensorEdits() = default;
  // Whether tensor `name` (the model's full name, e.g. "blocks.3.attn1.to_q.weight") is changed.
  virtual bool touches(const std::string& name) const = 0;
  // Changes rows [first_row, first_row + rows.size(0)) of tensor `name` in place: `rows` [n, cols]
  // holds whole rows of it viewed as [rows, cols] (a weight [out, in]: cols = in; a bias: cols =
  // 1). The result for a row does not depend on which other rows are passed.
  virtual void apply(const std::string& name, at::Tensor& rows, std::int64_t first_row) const = 0;
  // What names the changes for everything that must agree on them (every rank's packed blocks,
  // the job fingerprints): the files, their identities and strengths.
  virtual std::string identity() const = 0;
};

// Rows of tensor `name` changed by `edits`: `from` holds whole rows [first_row, ...) of a tensor of
// `cols` elements per row (any shape, any dtype); they are formed in `via`, changed there, and
// rounded to `to`. Shaped as `from`; always a new tensor.
at::Tensor edited_rows(const TensorEdits& edits, const std::string& name, const at::Tensor& from, std::int64_t cols,
                       at::ScalarType via, at::ScalarType to, std::int64_t first_row);

}  // namespace dlo
