#include "dlo/dist/sequence_exchange.h"

#include <ATen/ATen.h>

#include <cstddef>
#include <vector>

#include "dlo/common/error.h"
#include "dlo/dist/exchange_group.h"

namespace dlo {
namespace {

std::size_t bytes_of(const at::Tensor& t) { return static_cast<std::size_t>(t.numel()) * t.element_size(); }

// Sends piece j of `pieces` to group rank j; receives from rank i a tensor of shape shape_from(i)
// (contiguous, x's dtype: views into one received buffer); returns the received pieces in rank
// order.
template <typename ShapeFrom>
std::vector<at::Tensor> exchange(const ExchangeGroup& g, const std::vector<at::Tensor>& pieces, const at::Tensor& like,
                                 ShapeFrom shape_from, const char* phase) {
  const auto n = static_cast<std::size_t>(g.size());
  DLO_ASSERT(pieces.size() == n, phase, ": ", pieces.size(), " pieces for ", n, " ranks");
  DLO_ASSERT(like.device() == g.device(), phase, ": a group exchanging on ", g.device().str(), " got a tensor on ",
             like.device().str());
  std::vector<at::Tensor> send;
  std::vector<std::size_t> send_bytes(n), send_offset(n), recv_bytes(n), recv_offset(n);
  std::size_t at = 0;
  for (std::size_t j = 0; j < n; ++j) {
    send.push_back(pieces[j].contiguous().view(-1));
    send_bytes[j] = bytes_of(send.back());
    send_offset[j] = at;
    at += send_bytes[j];
  }
  const at::Tensor send_buf = at::cat(send).view(at::kByte).contiguous();
  std::vector<std::vector<std::int64_t>> shapes;
  std::size_t total = 0;
  const auto element = static_cast<std::size_t>(like.element_size());
  for (std::size_t i = 0; i < n; ++i) {
    shapes.push_back(shape_from(static_cast<std::int64_t>(i)));
    std::size_t elements = 1;
    for (const auto d : shapes.back()) elements *= static_cast<std::size_t>(d);
    recv_bytes[i] = elements * element;
    recv_offset[i] = total;
    total += recv_bytes[i];
  }
  const at::Tensor recv_buf = at::empty({static_cast<std::int64_t>(total)}, like.options().dtype(at::kByte));
  g.alltoallv(send_buf, send_bytes, send_offset, recv_buf, recv_bytes, recv_offset, phase);
  std::vector<at::Tensor> recv;
  for (std::size_t i = 0; i < n; ++i)
    recv.push_back(recv_buf.narrow(0, static_cast<std::int64_t>(recv_offset[i]), static_cast<std::int64_t>(recv_bytes[i]))
                       .view(like.scalar_type())
                       .view(shapes[i]));
  return recv;
}

void check_group(const ExchangeGroup& g, const Partition& p, const char* what) {
  DLO_ASSERT(p.parts() == g.size(), what, " in ", p.parts(), " parts for a group of ", g.size());
}

}  // namespace

at::Tensor seq_to_heads(const ExchangeGroup& g, const at::Tensor& x, const Partition& tokens, const Partition& heads) {
  check_group(g, tokens, "tokens");
  check_group(g, heads, "heads");
  DLO_ASSERT(x.dim() == 4 && x.size(1) == tokens.size[g.rank()] && x.size(2) == heads.total(), "seq_to_heads of ", x.sizes());
  std::vector<at::Tensor> pieces;
  for (std::int64_t j = 0; j < heads.parts(); ++j) pieces.push_back(x.narrow(2, heads.offset[j], heads.size[j]));
  const auto from = exchange(
      g, pieces, x, [&](std::int64_t i) { return std::vector<std::int64_t>{x.size(0), tokens.size[i], heads.size[g.rank()], x.size(3)}; },
      "sequence parallelism: tokens to heads");
  return at::cat(from, 1);
}

at::Tensor heads_to_seq(const ExchangeGroup& g, const at::Tensor& o, const Partition& tokens, const Partition& heads) {
  check_group(g, tokens, "tokens");
  check_group(g, heads, "heads");
  DLO_ASSERT(o.dim() == 4 && o.size(1) == tokens.total() && o.size(2) == heads.size[g.rank()], "heads_to_seq of ", o.sizes());
  std::vector<at::Tensor> pieces;
  for (std::int64_t j = 0; j < tokens.parts(); ++j) pieces.push_back(o.narrow(1, tokens.offset[j], tokens.size[j]));
  const auto from = exchange(
      g, pieces, o, [&](std::int64_t i) { return std::vector<std::int64_t>{o.size(0), tokens.size[g.rank()], heads.size[i], o.size(3)}; },
      "sequence parallelism: heads to tokens");
  return at::cat(from, 2);
}

at::Tensor gather_tokens(const ExchangeGroup& g, const at::Tensor& h, const Partition& tokens) {
  check_group(g, tokens, "tokens");
  DLO_ASSERT(h.dim() >= 2 && h.size(1) == tokens.size[g.rank()], "gather_tokens of ", h.sizes());
  const std::vector<at::Tensor> pieces(static_cast<std::size_t>(g.size()), h);
  const auto from = exchange(
      g, pieces, h,
      [&](std::int64_t i) {
        std::vector<std::int64_t> s = h.sizes().vec();
        s[1] = tokens.size[i];
        return s;
      },
      "sequence parallelism: gathering the tokens");
  return at::cat(from, 1);
}

std::vector<at::Tensor> gather_all(const ExchangeGroup& g, const at::Tensor& t) {
  const std::vector<at::Tensor> pieces(static_cast<std::size_t>(g.size()), t);
  return exchange(g, pieces, t, [&](std::int64_t) { return t.sizes().vec(); }, "CFG parallelism: exchanging predictions");
}

}  // namespace dlo
