#pragma once
/// \file
/// Channels-last 3D (NDHWC) networks.
///
/// cuDNN's fast half-precision 3D convolutions want NDHWC, and PyTorch gates cuDNN off for
/// half-precision NCDHW 3D convolutions on some cuDNN versions (docs/benchmarks.md): on a
/// GPU the networks run with their 5-D weights and activations channels-last
/// (at::MemoryFormat::ChannelsLast3d), from the batch to the loss. The layers keep the
/// layout they are given: libtorch's convolutions, batch norm, activations, additions and
/// concatenations do on a GPU; medfast's own instance and group norms (norm.hpp) do where
/// libtorch's would write NCDHW; and where a libtorch CPU kernel writes NCDHW for a
/// channels-last input (libtorch 1.13's convolutions), the convolution modules (conv.hpp)
/// give it back in the input's layout, so that the layout is the same at every block.
///
/// What is written to disk stays contiguous (checkpoints, export, state_dicts): MONAI and
/// PyTorch load it unchanged.
#include <ATen/ATen.h>
#include <torch/nn/module.h>

#include <string>

namespace medfast::nn {

/// `t` laid out in `format` (a 5-D tensor; others are made contiguous), with that layout's
/// exact strides also where the layout is ambiguous: with one channel (a CT image, the
/// first convolution's weight) both is_contiguous tests pass, at::Tensor::contiguous leaves
/// the strides as they were, and libtorch's kernels would take the tensor for the other
/// layout. Restrided without a copy where the values are in order already.
at::Tensor to_memory_format(const at::Tensor& t, at::MemoryFormat format);

/// The 5-D parameters and buffers of `module` (and its submodules) in `format`, in place:
/// the same tensors, their data laid out anew (an optimizer or hook holding them sees it).
void set_memory_format(torch::nn::Module& module, at::MemoryFormat format);

/// Whether every 5-D parameter of `module` is laid out in `format`.
bool has_memory_format(const torch::nn::Module& module, at::MemoryFormat format);

/// `y` laid out channels-last where `x`, a 5-D channels-last tensor, was and the layer that
/// made `y` from it wrote NCDHW (the layers of the networks call it on their outputs);
/// else `y` unchanged. Nothing is copied where the layer kept the layout.
at::Tensor keep_channels_last(const at::Tensor& x, const at::Tensor& y);
/// A convolution's output `y`: channels-last where its input `x` or its 5-D `weight` is, as
/// cuDNN decides (an input whose spatial size is 1x1x1 is both layouts at once, and the
/// network's layout is the weights').
at::Tensor keep_channels_last(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& y);

/// Whether `t` is a 5-D tensor laid out channels-last (and not merely contiguous in both:
/// one channel, or a single voxel).
bool is_channels_last(const at::Tensor& t);

/// "channels_last" or "contiguous".
std::string memory_format_name(at::MemoryFormat format);

}  // namespace medfast::nn
