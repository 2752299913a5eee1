#include "dlo/models/tensor_edits.h"

#include <ATen/ATen.h>

namespace dlo {

at::Tensor edited_rows(const TensorEdits& edits, const std::string& name, const at::Tensor& from, std::int64_t cols,
                       at::ScalarType via, at::ScalarType to, std::int64_t first_row) {
  at::Tensor v = from.to(via, /*non_blocking=*/false, /*copy=*/true).reshape({-1, cols});
  edits.apply(name, v, first_row);
  return v.to(to).view(from.sizes());
}

}  // namespace dlo
