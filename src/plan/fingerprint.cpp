// One case's fingerprint (nnU-Net v2's analyze_case): crop to nonzero, foreground samples.
#include "medfast/plan/fingerprint.hpp"

#include <ATen/ATen.h>

#include <cmath>
#include <string>

#include "medfast/core/error.hpp"
#include "medfast/core/random.hpp"

namespace medfast::plan {

CaseFingerprint case_fingerprint(const at::Tensor& image, const at::Tensor& label_in, const Spacing& spacing,
                                 std::int64_t samples_per_channel, std::uint64_t seed, const std::string& where) {
  if (!image.defined() || image.dim() != 4) {
    throw ValueError(str(where, ": expected an image [channels, X, Y, Z], got ",
                         image.defined() ? image.sizes() : at::IntArrayRef{}));
  }
  at::Tensor label = label_in;
  if (label.defined() && label.dim() == 4 && label.size(0) == 1) label = label[0];
  if (!label.defined() || label.sizes() != image.sizes().slice(1)) {
    throw ValueError(str(where, ": the label's shape ", label_in.defined() ? label_in.sizes() : at::IntArrayRef{},
                         " is not the image's ", image.sizes().slice(1)));
  }
  for (int d = 0; d < 3; ++d) {
    if (!(spacing[d] > 0) || !std::isfinite(spacing[d])) {
      throw ValueError(str(where, ": spacing ", spacing[d], " along axis ", d, " is not a positive number"));
    }
  }
  if (samples_per_channel < 0) throw ValueError(str(where, ": samples_per_channel must be >= 0"));
  CaseFingerprint f;
  f.spacing = spacing;
  // The bounding box of voxels nonzero in any channel (the whole image where there is none).
  const at::Tensor nonzero = image.ne(0).any(0);
  at::Tensor img = image, lab = label;
  for (int d = 0; d < 3; ++d) {
    std::vector<std::int64_t> others;
    for (int e = 0; e < 3; ++e) {
      if (e != d) others.push_back(e);
    }
    const at::Tensor along = nonzero.any(others[1]).any(others[0]).nonzero();  // indices along axis d
    std::int64_t lo = 0, hi = image.size(1 + d);
    if (along.numel() > 0) {
      lo = along.min().item<std::int64_t>();
      hi = along.max().item<std::int64_t>() + 1;
    }
    img = img.narrow(1 + d, lo, hi - lo);
    lab = lab.narrow(d, lo, hi - lo);
    f.shape_after_crop[d] = hi - lo;
  }
  f.relative_size = static_cast<double>(img[0].numel()) / static_cast<double>(image[0].numel());
  const at::Tensor fg = lab.gt(0).reshape({-1}).nonzero().reshape({-1});
  f.foreground_voxels = fg.numel();
  f.samples.resize(static_cast<std::size_t>(image.size(0)));
  if (fg.numel() == 0 || samples_per_channel == 0) return f;
  Rng rng(seed);  // the project's generator: the same draws with any standard library
  std::vector<std::int64_t> chosen(static_cast<std::size_t>(samples_per_channel));
  for (auto& c : chosen) c = rng.integer(0, fg.numel() - 1);
  const at::Tensor at_fg =
      fg.index_select(0, at::from_blob(chosen.data(), {samples_per_channel}, at::kLong).clone().to(fg.device()));
  for (std::int64_t c = 0; c < image.size(0); ++c) {  // the same voxels for every channel
    const at::Tensor v = img[c].reshape({-1}).index_select(0, at_fg).to(at::kCPU, at::kDouble).contiguous();
    f.samples[static_cast<std::size_t>(c)].assign(v.data_ptr<double>(), v.data_ptr<double>() + v.numel());
  }
  return f;
}

}  // namespace medfast::plan
