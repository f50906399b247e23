#pragma once
/// \file
/// 3-D convolutions for the networks: torch::nn::Conv3d and ConvTranspose3d with the same
/// options, parameters and state_dict names, and the same forward, whose backward on the CPU
/// takes libtorch's fast kernels where its own does not.
///
/// Measured (docs/benchmarks.md, "Convolution gradients by forward convolutions"): oneDNN's
/// backward-data kernel, which libtorch 1.13 and 2.6 use for a convolution's input gradient on
/// the CPU, took 16-18 ms for 8 x 32x32x16 voxels at 2 to 8 channels, where a forward
/// convolution of the gradient with the flipped, transposed kernel computes the same gradient
/// in 1.5-7 ms; and libtorch 1.13 has no oneDNN transposed convolution on the CPU, so a
/// transposed convolution's input and weight gradients went through im2col loops where a
/// strided forward convolution and a forward convolution's weight gradient compute them.
/// The gradients are the same sums in another order (equal up to float rounding, tested).
///
/// The custom backward applies to float32 CPU tensors under autograd, groups 1, dilation 1,
/// numeric zero padding (a transposed convolution: no output_size); a convolution also needs
/// stride 1, padding <= kernel - 1 (its input gradient is then a stride-1 convolution) and at
/// most kCustomBackwardMaxOutChannels output channels: with 16 and more, oneDNN's backward-data
/// kernel was about as fast as the forward convolution, up to 1.5x faster (16 -> 16, 32 -> 32
/// over 8 x 32x32x16), with 8 and fewer 2-10x slower. Everything else (CUDA, other dtypes,
/// inference without gradients) is libtorch's own forward and backward.
///
/// Forward, every other convolution whose kernel is more than one voxel runs oneDNN's kernel on
/// float32 CPU tensors where libtorch's own rule would take its im2col kernel
/// (set_onednn_conv_forward below). And a stride-1 convolution with at most kDirectMaxOutChannels output channels runs
/// medfast's direct kernel (direct_conv.hpp) on float32 CPU tensors outside autocast, on a CPU
/// with AVX2 or AVX-512, where no gradient is needed or under the custom backward (whose
/// input gradient, a convolution too, takes it where it applies); measured in
/// docs/benchmarks.md ("Direct convolutions for few channels"): 2 -> 2 channels over 4 x 96^3
/// voxels in a fifth of oneDNN's time, 16 -> 2 in half; with 8 output channels and more
/// oneDNN was as fast or faster. The conv_forward setting (libtorch) turns it off.
///
/// A channels-last input gives a channels-last output (layout.hpp): where a libtorch CPU
/// kernel writes NCDHW for it (libtorch 1.13's), the output is laid out channels-last again.
#include <torch/nn/modules/conv.h>

namespace medfast::nn {

inline constexpr std::int64_t kCustomBackwardMaxOutChannels = 8;
inline constexpr std::int64_t kDirectMaxOutChannels = 4;

class Conv3dImpl : public torch::nn::Conv3dImpl {
 public:
  using torch::nn::Conv3dImpl::Conv3dImpl;
  at::Tensor forward(const at::Tensor& input);

 private:
  at::Tensor run(const at::Tensor& input);
};
TORCH_MODULE(Conv3d);

class ConvTranspose3dImpl : public torch::nn::ConvTranspose3dImpl {
 public:
  using torch::nn::ConvTranspose3dImpl::ConvTranspose3dImpl;
  at::Tensor forward(const at::Tensor& input, const c10::optional<at::IntArrayRef>& output_size = c10::nullopt);

 private:
  at::Tensor run(const at::Tensor& input, const c10::optional<at::IntArrayRef>& output_size);

 protected:
  FORWARD_HAS_DEFAULT_ARGS({1, torch::nn::AnyValue(c10::optional<at::IntArrayRef>())})
};
TORCH_MODULE(ConvTranspose3d);

/// Counts the multiply-accumulates of the convolutions (Conv3d, ConvTranspose3d) that run
/// forwards on this thread while it lives: a convolution's output elements times its input
/// channels per group times its kernel's voxels; a transposed one's input elements times its
/// output channels per group times its kernel's voxels. What `bench step` reports and what
/// the plan's compute estimate is checked against. Counters nest: each counts what runs in
/// its lifetime.
class MacCounter {
 public:
  MacCounter();
  ~MacCounter();
  MacCounter(const MacCounter&) = delete;
  MacCounter& operator=(const MacCounter&) = delete;
  double macs() const { return macs_; }

 private:
  friend void count_macs(double macs);
  double macs_ = 0;
  MacCounter* outer_ = nullptr;
};
/// Adds to every counter alive on this thread (the convolutions call it).
void count_macs(double macs);

/// Whether the custom backward is used at all: on by default; the conv_backward setting
/// (libtorch) turns it off for the process (train::apply_conv_backward, before training).
void set_custom_conv_backward(bool on);

/// Whether a forward convolution whose kernel is more than one voxel takes oneDNN's kernel
/// wherever libtorch would take its im2col kernel (float32, CPU, contiguous, outside autocast,
/// oneDNN built and enabled): on by default; the conv_forward setting (libtorch) turns it off
/// with the direct kernel (train::apply_conv_forward). libtorch's own rule takes im2col for one
/// sample of N*C*D*H <= 20480, a 2-D rule that leaves out a volume's last axis (measured in
/// docs/benchmarks.md, "oneDNN for one small volume": 5-10x slower there than oneDNN).
void set_onednn_conv_forward(bool on);
bool onednn_conv_forward_enabled();

/// Whether ConvTranspose3d's custom backward is used on this libtorch: libtorch 1.x only (2.x
/// runs transposed convolutions through oneDNN, and the custom backward measured no faster).
bool transposed_conv_custom_backward();

}  // namespace medfast::nn
