#include "medfast/nn/direct_conv.hpp"

#include <ATen/Parallel.h>

#include <atomic>
#include <cstring>
#include <string>

#include "kernels/direct_conv.hpp"
#include "medfast/core/error.hpp"

namespace medfast::nn {

namespace {

struct Isa {
  const char* name;
  kernels::ConvRows conv;
};

constexpr Isa kGeneric{"generic", kernels::generic::conv_rows};
constexpr Isa kAvx2{"avx2", kernels::avx2::conv_rows};
constexpr Isa kAvx512{"avx512", kernels::avx512::conv_rows};

// Whether this CPU (and its operating system, which libgcc's check includes) runs the kernels
// compiled for an instruction set. Elsewhere than x86-64 the kernels are all the generic ones.
bool cpu_has(const char* isa) {
#if defined(__x86_64__)
  __builtin_cpu_init();
  if (std::strcmp(isa, "avx512") == 0) return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("fma");
  if (std::strcmp(isa, "avx2") == 0) return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
#endif
  return std::strcmp(isa, "generic") == 0;
}

const Isa* best_isa() {
  if (cpu_has("avx512")) return &kAvx512;
  if (cpu_has("avx2")) return &kAvx2;
  return &kGeneric;
}

std::atomic<const Isa*> chosen{nullptr};

const Isa& isa() {
  const Isa* i = chosen.load(std::memory_order_acquire);
  if (i == nullptr) {
    const Isa* best = best_isa();
    // A concurrent set_direct_conv_isa() wins over this default.
    i = chosen.compare_exchange_strong(i, best, std::memory_order_acq_rel) ? best : i;
  }
  return *i;
}

std::atomic<bool> direct_on{true};
std::atomic<bool> direct_faulty{false};

}  // namespace

std::string direct_conv_isa() {
  return isa().name;
}

void set_direct_conv_isa(const std::string& name) {
  for (const Isa* i : {&kGeneric, &kAvx2, &kAvx512}) {
    if (name == i->name) {
      if (!cpu_has(i->name)) throw ValueError(str("direct convolution: this CPU has no ", name));
      chosen.store(i, std::memory_order_release);
      return;
    }
  }
  if (name == "auto") {
    chosen.store(best_isa(), std::memory_order_release);
    return;
  }
  throw ValueError(
      str("direct convolution: unknown instruction set '", name, "' (expected auto, generic, avx2, avx512)"));
}

bool direct_conv_isa_available(const std::string& name) {
  return cpu_has(name.c_str());
}

void set_direct_conv(bool on) {
  direct_on.store(on);
}
bool direct_conv_enabled() {
  return direct_on.load(std::memory_order_relaxed) && !direct_faulty.load(std::memory_order_relaxed) &&
         &isa() != &kGeneric;
}
void set_direct_conv_faulty(bool faulty) {
  direct_faulty.store(faulty);
}
bool direct_conv_faulty() {
  return direct_faulty.load(std::memory_order_relaxed);
}

at::Tensor direct_conv3d(const at::Tensor& input, const at::Tensor& weight, const at::Tensor& bias,
                         at::IntArrayRef stride, at::IntArrayRef padding) {
  TORCH_CHECK(input.dim() == 5 && weight.dim() == 5 && input.scalar_type() == at::kFloat &&
                  weight.scalar_type() == at::kFloat && input.device().is_cpu() && weight.device().is_cpu(),
              "direct_conv3d: float32 CPU tensors of 5 dimensions");
  TORCH_CHECK(input.size(1) == weight.size(1), "direct_conv3d: input channels ", input.size(1), ", weight's ",
              weight.size(1));
  TORCH_CHECK(stride.size() == 3 && padding.size() == 3 && stride[0] >= 1 && stride[1] >= 1 && stride[2] >= 1 &&
                  stride[2] <= 2 && padding[0] >= 0 && padding[1] >= 0 && padding[2] >= 0,
              "direct_conv3d: strides >= 1 (the last 1 or 2) and paddings >= 0, 3 of each");
  TORCH_CHECK(weight.size(0) >= 1, "direct_conv3d: a weight of no output channels");
  const at::Tensor x = input.contiguous();
  const std::int64_t n = x.size(0), cin = x.size(1), cout = weight.size(0);
  std::int64_t xs[3], ks[3], ys[3];
  for (int i = 0; i < 3; ++i) {
    xs[i] = x.size(i + 2) + 2 * padding[i];
    ks[i] = weight.size(i + 2);
    TORCH_CHECK(xs[i] >= ks[i], "direct_conv3d: kernel larger than the padded input");
    ys[i] = (xs[i] - ks[i]) / stride[i] + 1;
  }
  // The padded input, with slack for the last row chunk's reads past its end (zeros).
  const std::int64_t padded = n * cin * xs[0] * xs[1] * xs[2];
  const std::int64_t slack = 2 * kernels::kLanes + ks[2];
  at::Tensor buffer;
  if (padding[0] == 0 && padding[1] == 0 && padding[2] == 0) {
    buffer = at::empty({padded + slack}, x.options());
    std::memcpy(buffer.data_ptr<float>(), x.data_ptr<float>(), static_cast<std::size_t>(padded) * sizeof(float));
    buffer.narrow(0, padded, slack).zero_();
  } else {
    buffer = at::zeros({padded + slack}, x.options());
    buffer.narrow(0, 0, padded)
        .view({n, cin, xs[0], xs[1], xs[2]})
        .narrow(2, padding[0], x.size(2))
        .narrow(3, padding[1], x.size(3))
        .narrow(4, padding[2], x.size(4))
        .copy_(x);
  }
  // Weights packed per block of output channels: [blocks][cin][kd][kh][kw][block].
  const std::int64_t block = cout < kernels::kMaxBlock ? cout : kernels::kMaxBlock;
  const std::int64_t blocks = (cout + block - 1) / block;
  at::Tensor w = weight.contiguous();
  if (blocks * block != cout)
    w = at::cat({w, at::zeros({blocks * block - cout, cin, ks[0], ks[1], ks[2]}, w.options())});
  const at::Tensor packed = w.view({blocks, block, cin, ks[0], ks[1], ks[2]}).permute({0, 2, 3, 4, 5, 1}).contiguous();
  const at::Tensor b = bias.defined() && bias.numel() > 0 ? bias.contiguous() : at::Tensor();
  TORCH_CHECK(!b.defined() || (b.numel() == cout && b.scalar_type() == at::kFloat && b.device().is_cpu()),
              "direct_conv3d: a bias of ", cout, " float32 on the CPU");

  at::Tensor y = at::empty({n, cout, ys[0], ys[1], ys[2]}, x.options());
  kernels::ConvArgs a{};
  a.x = buffer.data_ptr<float>();
  a.w = packed.data_ptr<float>();
  a.bias = b.defined() ? b.data_ptr<float>() : nullptr;
  a.y = y.data_ptr<float>();
  a.n = n, a.cin = cin, a.cout = cout, a.block = block;
  a.xd = xs[0], a.xh = xs[1], a.xw = xs[2];
  a.kd = ks[0], a.kh = ks[1], a.kw = ks[2];
  a.sd = stride[0], a.sh = stride[1], a.sw = stride[2];
  a.yd = ys[0], a.yh = ys[1], a.yw = ys[2];
  const std::int64_t rows = n * ys[0] * ys[1];
  const std::int64_t row_macs = cout * ys[2] * cin * ks[0] * ks[1] * ks[2];
  const std::int64_t grain = (1 << 16) / (row_macs > 0 ? row_macs : 1) + 1;
  const kernels::ConvRows conv = isa().conv;
  at::parallel_for(0, rows, grain, [&](std::int64_t begin, std::int64_t end) { conv(a, begin, end); });
  return y;
}

}  // namespace medfast::nn
