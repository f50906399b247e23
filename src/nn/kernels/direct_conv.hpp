#pragma once
/// \file
/// Direct 3-D convolution kernels for few channels (see direct_conv.cpp, which chooses among
/// the instruction sets and runs them on libtorch's threads). Plain C++: this header and the
/// kernels include no library headers, because each kernel file is compiled once per
/// instruction set (-mavx2, -mavx512f) and an inline function shared with other files could
/// be taken by the linker from the wider instruction set's copy.
#include <cstdint>

namespace medfast::nn::kernels {

/// Outputs a kernel call accumulates per output channel and row chunk.
inline constexpr int kLanes = 16;
/// Output channels a kernel call accumulates at once (the packed weights' inner block).
inline constexpr int kMaxBlock = 4;

/// y[n, o, d, h, w] = bias[o] + sum over c, i, j, k of x[n, c, d*sd + i, h*sh + j, w*sw + k] * w[o, c, i, j, k]:
/// a convolution of an input zero-padded beforehand (x: [n, cin, xd, xh, xw], contiguous,
/// readable for 2 * kLanes + kw floats past its end), groups 1, dilation 1.
struct ConvArgs {
  const float* x;
  /// [ceil(cout / block)][cin][kd][kh][kw][block]: the weights of `block` output channels side
  /// by side, zeros past cout.
  const float* w;
  const float* bias;  // [cout] or null
  float* y;           // [n, cout, yd, yh, yw], contiguous
  std::int64_t n, cin, cout, block;
  std::int64_t xd, xh, xw;
  std::int64_t kd, kh, kw;
  std::int64_t sd, sh, sw;
  std::int64_t yd, yh, yw;
};

/// Rows [begin, end) of the output, a row being one (n, d, h): all output channels, all w.
using ConvRows = void (*)(const ConvArgs& a, std::int64_t begin, std::int64_t end);

namespace generic {
void conv_rows(const ConvArgs& a, std::int64_t begin, std::int64_t end);
}
namespace avx2 {
void conv_rows(const ConvArgs& a, std::int64_t begin, std::int64_t end);
}
namespace avx512 {
void conv_rows(const ConvArgs& a, std::int64_t begin, std::int64_t end);
}

}  // namespace medfast::nn::kernels
