#include "medfast/transforms/indices.hpp"

#include <ATen/ATen.h>
#include <ATen/Dispatch.h>

#include <type_traits>

#include "medfast/core/error.hpp"
#include "medfast/transforms/spatial.hpp"

namespace medfast::transforms {

at::Tensor mask_to_runs(const at::Tensor& mask) {
  // Runs are small and sampled on the host: computed on the CPU whatever the mask's device.
  const at::Tensor m = mask.to(at::kCPU).to(at::kBool).contiguous().view({-1});
  const auto n = m.numel();
  std::vector<std::int64_t> runs;
  const bool* p = m.data_ptr<bool>();
  std::int64_t i = 0;
  while (i < n) {
    while (i < n && !p[i]) ++i;
    if (i == n) break;
    const std::int64_t start = i;
    while (i < n && p[i]) ++i;
    runs.push_back(start);
    runs.push_back(i);
  }
  return at::tensor(runs, at::kLong).view({-1, 2});
}

namespace {

/// Calls f(pointer to the runs' [start, end) pairs, count) on a CPU contiguous int32 or
/// int64 tensor (converted once only when it is neither): no per-sample copy of the cached runs.
template <typename F>
auto with_runs(const at::Tensor& runs, F&& f) {
  if (!runs.is_cpu() || !runs.is_contiguous() ||
      (runs.scalar_type() != at::kLong && runs.scalar_type() != at::kInt)) {
    const at::Tensor r = runs.to(at::kCPU).to(at::kLong).contiguous();
    return f(r.data_ptr<std::int64_t>(), r.numel() / 2);
  }
  if (runs.scalar_type() == at::kInt) return f(runs.data_ptr<std::int32_t>(), runs.numel() / 2);
  return f(runs.data_ptr<std::int64_t>(), runs.numel() / 2);
}

}  // namespace

std::int64_t runs_count(const at::Tensor& runs) {
  if (runs.numel() == 0) return 0;
  return with_runs(runs, [](const auto* r, std::int64_t n) {
    std::int64_t total = 0;
    for (std::int64_t i = 0; i < n; ++i) total += static_cast<std::int64_t>(r[2 * i + 1]) - r[2 * i];
    return total;
  });
}

at::Tensor runs_to_indices(const at::Tensor& runs) {
  std::vector<at::Tensor> parts;
  for (std::int64_t r = 0; r < runs.size(0); ++r) {
    parts.push_back(at::arange(runs[r][0].item<std::int64_t>(), runs[r][1].item<std::int64_t>(), at::kLong));
  }
  return parts.empty() ? at::empty({0}, at::kLong) : at::cat(parts);
}

std::int64_t runs_index(const at::Tensor& runs, std::int64_t k) {
  const std::int64_t want = k;
  const std::int64_t found = runs.numel() == 0 ? -1 : with_runs(runs, [&](const auto* r, std::int64_t n) {
    for (std::int64_t i = 0; i < n; ++i) {
      const std::int64_t len = static_cast<std::int64_t>(r[2 * i + 1]) - r[2 * i];
      if (k < len) return static_cast<std::int64_t>(r[2 * i]) + k;
      k -= len;
    }
    return std::int64_t{-1};
  });
  if (found < 0 || want < 0) throw ValueError(str("runs_index: index ", want, " past the ", runs_count(runs), " indices held"));
  return found;
}

at::Tensor foreground_channels(const at::Tensor& label) {
  return label.dim() == 4 && label.size(0) > 1 ? label.narrow(0, 1, label.size(0) - 1) : label;
}

namespace {

class FgBgToIndices final : public TransformWith<FgBgToIndicesOptions> {
 public:
  explicit FgBgToIndices(FgBgToIndicesOptions o) : TransformWith("FgBgToIndices", std::move(o)) {
  }
  nlohmann::json config() const override {
    nlohmann::json c = fields_json(o_);
    c["storage"] = "runs";  // the indices' stored form, part of the cache's key
    return c;
  }
  void apply(Sample& s) const override {
    for (const auto& key : o_.keys) {
      const Volume& label = s.volume(key);
      spatial_shape(label.data, key);
      const Volume* image = o_.image_key.empty() ? nullptr : &s.volume(o_.image_key);
      if (image && image->data.sizes().slice(1) != label.data.sizes().slice(1)) {
        throw ValueError(str("FgBgToIndices: ", o_.image_key, " and ", key, " differ in spatial shape"));
      }
      if (use_native_kernels(label.data) && (!image || use_native_kernels(image->data))) {
        auto [fg, bg] = fg_bg_runs(label.data, image ? image->data : at::Tensor(), o_.image_threshold);
        s.arrays[key + o_.fg_postfix] = fg;
        s.arrays[key + o_.bg_postfix] = bg;
        continue;
      }
      const at::Tensor fg = (foreground_channels(label.data) > 0).any(0);  // CUDA (and tests): libtorch ops, on the host
      at::Tensor bg = fg.logical_not();
      if (image) bg = bg.logical_and((image->data > o_.image_threshold).any(0));
      s.arrays[key + o_.fg_postfix] = mask_to_runs(fg);
      s.arrays[key + o_.bg_postfix] = mask_to_runs(bg);
    }
  }

  /// One pass over the label (and image) in C order of the spatial index: a voxel is
  /// foreground when any label channel is > 0 (of channels 1.. where there are several, as
  /// foreground_channels), background when none is and (with an image) any image channel is
  /// > threshold. Runs of consecutive flat indices, [start, end).
  static std::pair<at::Tensor, at::Tensor> fg_bg_runs(const at::Tensor& label, const at::Tensor& image,
                                                      double threshold) {
    const at::Tensor lab = label.scalar_type() == at::kBool ? label.to(at::kByte) : label;
    const at::Tensor img = image.defined() && image.scalar_type() == at::kBool ? image.to(at::kByte) : image;
    const std::int64_t n0 = lab.size(1), n1 = lab.size(2), n2 = lab.size(3);
    std::vector<std::int64_t> fg, bg;
    std::vector<std::uint8_t> f(static_cast<std::size_t>(n2)), b(static_cast<std::size_t>(n2));
    auto close_runs = [](std::vector<std::int64_t>& runs, const std::vector<std::uint8_t>& m, std::int64_t base) {
      const std::int64_t n = static_cast<std::int64_t>(m.size());
      std::int64_t k = 0;
      while (k < n) {
        while (k < n && !m[static_cast<std::size_t>(k)]) ++k;
        if (k == n) break;
        const std::int64_t start = k;
        while (k < n && m[static_cast<std::size_t>(k)]) ++k;
        // Join a run that continues the previous row's.
        if (!runs.empty() && runs.back() == base + start) runs.back() = base + k;
        else runs.insert(runs.end(), {base + start, base + k});
      }
    };
    AT_DISPATCH_ALL_TYPES_AND(at::kHalf, lab.scalar_type(), "fg_bg_label", [&] {
      using L = scalar_t;
      const L* lp = lab.data_ptr<L>();
      const auto ls = lab.strides();
      auto row = [&](auto* ip, at::IntArrayRef is, auto thr) {
        using C = decltype(thr);
        const std::int64_t lc = lab.size(0), ic = ip ? img.size(0) : 0;
        const std::int64_t l0 = lc > 1 ? 1 : 0;  // MONAI's map_binary_to_indices: label[1:] of several
        std::uint8_t* fm = f.data();
        std::uint8_t* bm = b.data();
        for (std::int64_t i = 0; i < n0; ++i) {
          for (std::int64_t j = 0; j < n1; ++j) {
            const L* lrow = lp + i * ls[1] + j * ls[2];
            const std::int64_t l3 = ls[3];
            for (std::int64_t k = 0; k < n2; ++k) fm[k] = lrow[l0 * ls[0] + k * l3] > L(0);
            for (std::int64_t c = l0 + 1; c < lc; ++c) {  // more label channels: any of them
              for (std::int64_t k = 0; k < n2; ++k) fm[k] |= lrow[c * ls[0] + k * l3] > L(0);
            }
            if (ip) {
              const auto* irow = ip + i * is[1] + j * is[2];
              const std::int64_t i3 = is[3];
              for (std::int64_t k = 0; k < n2; ++k) bm[k] = static_cast<C>(irow[k * i3]) > thr;
              for (std::int64_t c = 1; c < ic; ++c) {
                for (std::int64_t k = 0; k < n2; ++k) bm[k] |= static_cast<C>(irow[c * is[0] + k * i3]) > thr;
              }
              for (std::int64_t k = 0; k < n2; ++k) bm[k] = bm[k] & !fm[k];
            } else {
              for (std::int64_t k = 0; k < n2; ++k) bm[k] = !fm[k];
            }
            const std::int64_t base = (i * n1 + j) * n2;
            close_runs(fg, f, base);
            close_runs(bg, b, base);
          }
        }
      };
      if (!img.defined()) {
        row(static_cast<const float*>(nullptr), at::IntArrayRef(), 0.0f);
      } else {
        AT_DISPATCH_ALL_TYPES_AND(at::kHalf, img.scalar_type(), "fg_bg_image", [&] {
          // image > threshold as libtorch compares a tensor with a double scalar: in the
          // tensor's floating type, or float32 for integer images.
          using C = std::conditional_t<std::is_floating_point_v<scalar_t>, scalar_t, float>;
          const scalar_t* ip = img.data_ptr<scalar_t>();
          row(ip, img.strides(), static_cast<C>(threshold));
        });
      }
    });
    auto to_tensor = [](const std::vector<std::int64_t>& runs) {
      return at::tensor(runs, at::kLong).view({-1, 2});
    };
    return {to_tensor(fg), to_tensor(bg)};
  }
};

}  // namespace

TransformPtr make_fg_bg_to_indices(const FgBgToIndicesOptions& o) { return std::make_shared<FgBgToIndices>(o); }

// The entry of the transform table (registry.cpp).
namespace registry {

TransformPtr fg_bg_to_indices(Args& a, const nlohmann::json&) {
  return make_fg_bg_to_indices(read_options<FgBgToIndicesOptions>(a));
}

}  // namespace registry

}  // namespace medfast::transforms
