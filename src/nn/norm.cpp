#include "medfast/nn/norm.hpp"

#include "medfast/core/error.hpp"
#include "medfast/nn/layout.hpp"

namespace medfast::nn {

at::Tensor channels_last_group_norm(const at::Tensor& x, std::int64_t groups, const at::Tensor& weight,
                                    const at::Tensor& bias, double eps) {
  MEDFAST_CHECK_T(ValueError, x.dim() == 5 && groups >= 1 && x.size(1) % groups == 0,
                  "channels-last group norm: expected [N, C, D, H, W] with C a multiple of ", groups, " groups, got ",
                  x.sizes());
  const std::int64_t n = x.size(0), c = x.size(1), per_group = c / groups;
  // [N, C, D, H, W] channels-last is [N, D, H, W, C] in memory: viewed as [N, DHW, G, C/G].
  const at::Tensor v = x.contiguous(at::MemoryFormat::ChannelsLast3d).permute({0, 2, 3, 4, 1}).reshape({n, -1, groups, per_group});
  const bool low = x.scalar_type() == at::kHalf || x.scalar_type() == at::kBFloat16;
  const auto [var, mean] = at::var_mean(low ? v.to(at::kFloat) : v, {1, 3}, /*unbiased=*/false, /*keepdim=*/true);
  at::Tensor scale = (var + eps).rsqrt();  // [N, 1, G, 1]
  at::Tensor shift = -mean * scale;
  if (weight.defined()) {
    const at::Tensor w = weight.to(scale.scalar_type()).reshape({1, 1, groups, per_group});
    scale = scale * w;
    shift = shift * w;
  }
  if (bias.defined()) shift = shift + bias.to(shift.scalar_type()).reshape({1, 1, groups, per_group});
  // One pass over the voxels: x * scale + shift, in x's dtype, computed in float.
  const at::Tensor y = at::addcmul(shift.to(x.scalar_type()), v, scale.to(x.scalar_type()));
  return y.reshape({n, x.size(2), x.size(3), x.size(4), c}).permute({0, 4, 1, 2, 3});
}

InstanceNorm3dImpl::InstanceNorm3dImpl(const torch::nn::InstanceNorm3dOptions& o) : options(o) { reset(); }

void InstanceNorm3dImpl::reset() {
  const std::int64_t n = options.num_features();
  if (options.affine()) {
    weight = register_parameter("weight", torch::ones({n}));
    bias = register_parameter("bias", torch::zeros({n}));
  }
  if (options.track_running_stats()) {
    running_mean = register_buffer("running_mean", torch::zeros({n}));
    running_var = register_buffer("running_var", torch::ones({n}));
    num_batches_tracked = register_buffer("num_batches_tracked", torch::tensor(0, at::kLong));
  }
}

void InstanceNorm3dImpl::pretty_print(std::ostream& stream) const {
  stream << "medfast::nn::InstanceNorm3d(" << options.num_features() << ", eps=" << options.eps()
         << ", momentum=" << options.momentum() << ", affine=" << (options.affine() ? "true" : "false")
         << ", track_running_stats=" << (options.track_running_stats() ? "true" : "false") << ")";
}

at::Tensor InstanceNorm3dImpl::forward(const at::Tensor& input) {
  MEDFAST_CHECK_T(ValueError, input.dim() == 5, "InstanceNorm3d: expected a 5-D input [N, C, D, H, W], got ",
                  input.sizes());
  if (!is_channels_last(input) || options.track_running_stats()) {
    // libtorch's: torch.nn.InstanceNorm3d's arithmetic (statistics of the input in training or
    // without running statistics; running statistics updated in training).
    const at::Tensor y = at::instance_norm(input, weight, bias, running_mean, running_var,
                                           /*use_input_stats=*/is_training() || !options.track_running_stats(),
                                           options.momentum(), options.eps(), at::globalContext().userEnabledCuDNN());
    return keep_channels_last(input, y);
  }
  const bool affine = options.affine();
  return channels_last_group_norm(input, input.size(1), affine ? weight : at::Tensor(), affine ? bias : at::Tensor(),
                                  options.eps());
}

at::Tensor GroupNormImpl::forward(const at::Tensor& input) {
  if (!is_channels_last(input)) return torch::nn::GroupNormImpl::forward(input);
  const bool affine = options.affine();
  return channels_last_group_norm(input, options.num_groups(), affine ? weight : at::Tensor(),
                                  affine ? bias : at::Tensor(), options.eps());
}

}  // namespace medfast::nn
