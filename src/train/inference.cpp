#include "medfast/train/inference.hpp"
#include "medfast/core/trace.hpp"

#include <ATen/ATen.h>

#include <algorithm>
#include <cmath>
#include <cstddef>

#include "medfast/core/config.hpp"
#include "medfast/core/error.hpp"

namespace medfast::train {

namespace {

std::string shape_string(at::IntArrayRef shape) {
  std::string s = "[";
  for (std::size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + "]";
}

// Window starts along one axis, MONAI's dense_patch_slices: 0, i, 2i, ... up to the first
// window that reaches the end of the axis, that one pulled back to end at the border.
std::vector<std::int64_t> axis_starts(std::int64_t size, std::int64_t roi, std::int64_t interval) {
  std::vector<std::int64_t> starts;
  for (std::int64_t k = 0;; ++k) {
    const std::int64_t s = k * interval;
    starts.push_back(std::min(s, size - roi));
    if (s + roi >= size) return starts;
  }
}

// F.pad(mode=...) for the modes MONAI's PytorchPadMode offers (less circular); `pad` is in
// F.pad's order, last axis first.
at::Tensor pad_input(const at::Tensor& x, const std::vector<std::int64_t>& pad, PadMode mode, double cval) {
  if (mode == PadMode::constant) return at::constant_pad_nd(x, pad, cval);
  const std::int64_t spatial = x.dim() - 2;
  if (mode == PadMode::reflect) {
    for (std::int64_t d = 0; d < spatial; ++d) {
      const std::int64_t size = x.size(2 + d), before = pad[2 * (spatial - 1 - d)],
                         after = pad[2 * (spatial - 1 - d) + 1];
      if (before >= size || after >= size) {
        throw ValueError(str("sliding window: padding_mode reflect pads spatial axis ", d, " of size ", size, " by ",
                             before, " and ", after, "; reflection needs pads smaller than the size"));
      }
    }
    if (spatial == 1) return at::reflection_pad1d(x, pad);
    if (spatial == 2) return at::reflection_pad2d(x, pad);
    if (spatial == 3) return at::reflection_pad3d(x, pad);
  } else {
    if (spatial == 1) return at::replication_pad1d(x, pad);
    if (spatial == 2) return at::replication_pad2d(x, pad);
    if (spatial == 3) return at::replication_pad3d(x, pad);
  }
  throw ValueError(
      str("sliding window: padding_mode ", name_of(mode), " supports 1 to 3 spatial axes, the input has ", spatial));
}

// x narrowed to the window starting at `start` (spatial axes only).
at::Tensor window_of(at::Tensor x, const std::vector<std::int64_t>& start, const std::vector<std::int64_t>& roi,
                     std::int64_t first_spatial) {
  for (std::size_t d = 0; d < roi.size(); ++d)
    x = x.narrow(first_spatial + static_cast<std::int64_t>(d), start[d], roi[d]);
  return x;
}

}  // namespace

void SlidingWindowOptions::validate() const {
  if (roi_size.empty()) throw ValueError("sliding window: argument roi_size is empty");
  if (sw_batch_size < 1)
    throw ValueError(str("sliding window: argument sw_batch_size ", sw_batch_size, " must be >= 1"));
  if (!(overlap >= 0 && overlap < 1))
    throw ValueError(str("sliding window: argument overlap ", overlap, " is outside [0, 1)"));
  if (!(sigma_scale > 0 && std::isfinite(sigma_scale))) {
    throw ValueError(str("sliding window: argument sigma_scale ", sigma_scale, " must be > 0"));
  }
  if (!std::isfinite(cval)) throw ValueError(str("sliding window: argument cval ", cval, " is not finite"));
  if (!device.empty()) {
    try {
      const at::Device parsed(device);
      (void)parsed;
    } catch (const std::exception&) {
      throw ValueError(str("sliding window: argument device '", device, "' is not cpu or cuda[:N]"));
    }
  }
}

SlidingWindowOptions SlidingWindowOptions::from_json(const nlohmann::json& j, const std::string& where) {
  SlidingWindowOptions o;
  ConfigReader k(j, where);
  read_fields(k, o);  // roi_size: one whole number stands for every axis, as in MONAI
  if (k.has("roi_size") && o.roi_size.empty()) k.fail("roi_size", "expected a list of whole numbers or one whole number");
  k.finish(o);
  return o;
}

at::Tensor importance_map(const std::vector<std::int64_t>& roi_size, BlendMode mode, double sigma_scale,
                          c10::Device device) {
  if (roi_size.empty()) throw ValueError("importance_map: roi_size is empty");
  for (const std::int64_t n : roi_size) {
    if (n < 1) throw ValueError(str("importance_map: roi_size ", shape_string(roi_size), " has an entry < 1"));
  }
  const auto options = at::TensorOptions().dtype(at::kFloat).device(device);
  if (mode == BlendMode::constant) return at::ones(roi_size, options);
  if (!(sigma_scale > 0 && std::isfinite(sigma_scale))) {
    throw ValueError(str("importance_map: sigma_scale ", sigma_scale, " must be > 0"));
  }
  // The same float32 operations, in the same order, as MONAI's compute_importance_map.
  at::Tensor map;
  for (const std::int64_t n : roi_size) {
    const double half = static_cast<double>(n - 1) / 2.0, sigma = static_cast<double>(n) * sigma_scale;
    const at::Tensor x = at::exp(at::arange(-half, half + 1.0, 1.0, options).pow(2) / (-2.0 * sigma * sigma));
    map = map.defined() ? map.unsqueeze(-1) * x : x;
  }
  // MONAI raises weights below max(min, 1e-3) to it, so that far corners still count.
  const double floor = std::max(map.min().item<double>(), 1e-3);
  return map.clamp_min_(floor);
}

at::Tensor sliding_window_inference(const at::Tensor& input_, const Predictor& predictor,
                                    const SlidingWindowOptions& o) {
  o.validate();
  if (!predictor) throw ValueError("sliding window: no predictor");
  if (!input_.defined() || input_.dim() < 3) {
    throw ValueError(str("sliding window: input must be [batch, channels, spatial...], got ",
                         input_.defined() ? shape_string(input_.sizes()) : std::string("an undefined tensor")));
  }
  const std::int64_t spatial = input_.dim() - 2;
  if (static_cast<std::int64_t>(o.roi_size.size()) != spatial) {
    throw ValueError(str("sliding window: roi_size ", shape_string(o.roi_size), " has ", o.roi_size.size(),
                         " entries; the input ", shape_string(input_.sizes()), " has ", spatial, " spatial axes"));
  }
  if (input_.numel() == 0) {
    throw ValueError(str("sliding window: the input ", shape_string(input_.sizes()), " is empty"));
  }
  const at::Tensor input = input_.detach();
  const std::int64_t batch = input.size(0);
  const at::Device out_device = o.device.empty() ? input.device() : at::Device(o.device);

  std::vector<std::int64_t> size(spatial), roi(spatial), padded(spatial), before(spatial), intervals(spatial);
  std::vector<std::int64_t> pad(2 * spatial);  // F.pad order: last axis first
  bool any_pad = false;
  for (std::int64_t d = 0; d < spatial; ++d) {
    size[d] = input.size(2 + d);
    roi[d] = o.roi_size[d] > 0 ? o.roi_size[d] : size[d];
    padded[d] = std::max(size[d], roi[d]);
    before[d] = (padded[d] - size[d]) / 2;
    pad[2 * (spatial - 1 - d)] = before[d];
    pad[2 * (spatial - 1 - d) + 1] = padded[d] - size[d] - before[d];
    any_pad = any_pad || padded[d] != size[d];
    // int() truncation of the double product, as MONAI's _get_scan_interval.
    const auto step = static_cast<std::int64_t>(static_cast<double>(roi[d]) * (1.0 - o.overlap));
    intervals[d] = roi[d] == padded[d] ? roi[d] : std::max<std::int64_t>(step, 1);
  }
  const at::Tensor x = any_pad ? pad_input(input, pad, o.padding_mode, o.cval) : input;

  // All window starts of one image, first axis slowest.
  std::vector<std::vector<std::int64_t>> axes(spatial);
  std::int64_t num_windows = 1;
  for (std::int64_t d = 0; d < spatial; ++d) {
    axes[d] = axis_starts(padded[d], roi[d], intervals[d]);
    num_windows *= static_cast<std::int64_t>(axes[d].size());
  }
  std::vector<std::vector<std::int64_t>> windows;
  windows.reserve(static_cast<std::size_t>(num_windows));
  for (std::int64_t w = 0; w < num_windows; ++w) {
    std::vector<std::int64_t> start(spatial);
    std::int64_t rest = w;
    for (std::int64_t d = spatial - 1; d >= 0; --d) {
      const auto n = static_cast<std::int64_t>(axes[d].size());
      start[d] = axes[d][rest % n];
      rest /= n;
    }
    windows.push_back(std::move(start));
  }

  const at::Tensor weight = importance_map(roi, o.mode, o.sigma_scale, x.device());
  const at::Tensor weight_out = weight.to(out_device);
  std::vector<std::int64_t> count_shape{1, 1};
  count_shape.insert(count_shape.end(), padded.begin(), padded.end());
  at::Tensor count = at::zeros(count_shape, at::TensorOptions().dtype(at::kFloat).device(out_device));
  for (const auto& start : windows) window_of(count[0][0], start, roi, 0).add_(weight_out);

  at::Tensor output;
  const std::int64_t total = batch * num_windows;
  for (std::int64_t first = 0; first < total; first += o.sw_batch_size) {
    const std::int64_t n = std::min(o.sw_batch_size, total - first);
    trace::Range range("window_batch", "validation");
    range.arg("first", static_cast<double>(first)).arg("windows", static_cast<double>(n));
    std::vector<at::Tensor> crops;
    crops.reserve(static_cast<std::size_t>(n));
    for (std::int64_t i = first; i < first + n; ++i) {
      crops.push_back(window_of(x.narrow(0, i / num_windows, 1), windows[i % num_windows], roi, 2));
    }
    const at::Tensor pred = predictor(at::cat(crops));
    if (!pred.defined() || pred.dim() != spatial + 2 || pred.size(0) != n || !pred.sizes().slice(2).equals(roi) ||
        (output.defined() && pred.size(1) != output.size(1))) {
      throw ValueError(str("sliding window: the predictor returned ",
                           pred.defined() ? shape_string(pred.sizes()) : std::string("an undefined tensor"), " for ", n,
                           " windows of ", shape_string(roi), "; expected [", n, ", ",
                           output.defined() ? std::to_string(output.size(1)) : std::string("channels"), ", ",
                           shape_string(roi).substr(1)));
    }
    // Weighted in float32 on the window device, then moved (MONAI weights in the prediction's dtype).
    const at::Tensor weighted = (pred.detach().to(at::kFloat) * weight).to(out_device);
    if (!output.defined()) {
      std::vector<std::int64_t> shape{batch, pred.size(1)};
      shape.insert(shape.end(), padded.begin(), padded.end());
      output = at::zeros(shape, at::TensorOptions().dtype(at::kFloat).device(out_device));
    }
    for (std::int64_t i = first; i < first + n; ++i) {
      window_of(output[i / num_windows], windows[i % num_windows], roi, 1).add_(weighted[i - first]);
    }
  }
  output.div_(count);
  if (!any_pad) return output;
  at::Tensor cropped = output;
  for (std::int64_t d = 0; d < spatial; ++d) cropped = cropped.narrow(2 + d, before[d], size[d]);
  return cropped.contiguous();
}

}  // namespace medfast::train
