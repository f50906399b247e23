#include "medfast/nn/layout.hpp"

#include <algorithm>
#include <vector>

namespace medfast::nn {

namespace {

/// The strides of a dense tensor of `sizes` in `format` (libtorch's own rule for each).
std::vector<std::int64_t> exact_strides(at::IntArrayRef sizes, at::MemoryFormat format) {
  std::vector<std::int64_t> strides(sizes.size());
  const std::vector<std::size_t> order = format == at::MemoryFormat::ChannelsLast3d
                                             ? std::vector<std::size_t>{1, 4, 3, 2, 0}
                                             : std::vector<std::size_t>{4, 3, 2, 1, 0};
  std::int64_t next = 1;
  for (std::size_t d : order) {
    strides[d] = next;
    next *= std::max<std::int64_t>(sizes[d], 1);
  }
  return strides;
}

}  // namespace

at::Tensor to_memory_format(const at::Tensor& t, at::MemoryFormat format) {
  if (t.dim() != 5) return t.contiguous();
  if (!t.is_contiguous(format)) return t.contiguous(format);
  const std::vector<std::int64_t> strides = exact_strides(t.sizes(), format);
  if (t.strides() == at::IntArrayRef(strides)) return t;
  // Contiguous in both layouts: the same place for every value, so only the strides of the
  // size-1 dimensions differ from the exact ones.
  return t.as_strided(t.sizes(), strides, t.storage_offset());
}

void set_memory_format(torch::nn::Module& module, at::MemoryFormat format) {
  at::NoGradGuard no_grad;
  auto restride = [format](at::Tensor& t) {
    if (!t.defined() || t.dim() != 5) return;
    const at::Tensor laid_out = to_memory_format(t.data(), format);
    if (!laid_out.is_same(t)) t.set_data(laid_out);
  };
  for (auto& p : module.parameters(/*recurse=*/true)) restride(p);
  for (auto& b : module.buffers(/*recurse=*/true)) restride(b);
}

bool has_memory_format(const torch::nn::Module& module, at::MemoryFormat format) {
  for (const auto& p : module.parameters(/*recurse=*/true)) {
    if (p.dim() == 5 && !p.is_contiguous(format)) return false;
  }
  return true;
}

bool is_channels_last(const at::Tensor& t) {
  // suggest_memory_format reads the strides themselves: a one-channel tensor made
  // channels-last (channel stride 1) is told apart from a contiguous one, which both
  // is_contiguous tests accept.
  return t.defined() && t.dim() == 5 && t.suggest_memory_format() == at::MemoryFormat::ChannelsLast3d;
}

at::Tensor keep_channels_last(const at::Tensor& x, const at::Tensor& y) {
  if (y.dim() != 5 || !is_channels_last(x) || is_channels_last(y)) return y;
  return to_memory_format(y, at::MemoryFormat::ChannelsLast3d);
}

at::Tensor keep_channels_last(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& y) {
  return keep_channels_last(is_channels_last(weight) ? weight : x, y);
}

std::string memory_format_name(at::MemoryFormat format) {
  return format == at::MemoryFormat::ChannelsLast3d ? "channels_last" : "contiguous";
}

}  // namespace medfast::nn
