#pragma once
/// \file
/// A direct 3-D convolution for float32 CPU tensors with few channels, where oneDNN's kernels,
/// which block channels by 8 or 16, spend most of their time on padding lanes and reorders:
/// measured in docs/benchmarks.md ("Direct convolutions for few channels"). The sums are the
/// same as libtorch's in another order (equal up to float rounding); each output element is
/// summed by one thread in one order, so results do not depend on the thread count.
///
/// The kernels are compiled for the generic x86-64 (or the build's) instruction set, AVX2+FMA
/// and AVX-512F, and the widest the CPU has is used.
#include <ATen/ATen.h>

#include <string>

namespace medfast::nn {

/// y = conv3d(input, weight, bias, stride, padding): groups 1, dilation 1, zero padding; the
/// last axis's stride 1 or 2. input [N, Cin, D, H, W], weight [Cout, Cin, kd, kh, kw], bias
/// [Cout] or undefined/empty. No autograd (the caller's backward computes the gradients).
at::Tensor direct_conv3d(const at::Tensor& input, const at::Tensor& weight, const at::Tensor& bias,
                         at::IntArrayRef stride, at::IntArrayRef padding);

/// The instruction set the kernels run with: "avx512", "avx2" or "generic".
std::string direct_conv_isa();
/// Chooses it ("auto": the widest this CPU has); for tests and measurements. Throws
/// ValueError for an unknown name or one this CPU lacks.
void set_direct_conv_isa(const std::string& name);
bool direct_conv_isa_available(const std::string& name);

/// Whether the networks' convolutions use the direct kernel where it applies: the
/// conv_forward setting (on by default), not found faulty, and an instruction set wider than
/// the generic one (with SSE2 alone it was slower than oneDNN).
void set_direct_conv(bool on);
bool direct_conv_enabled();
/// The start-up self-check's verdict: a faulty kernel stays off for the process whatever
/// set_direct_conv() says later (tests reset it).
void set_direct_conv_faulty(bool faulty);
bool direct_conv_faulty();

}  // namespace medfast::nn
